package dashtest

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/util/teststorage"
)

// The cross-check of the rule engine by the real promtool: what the rule
// engine (as a library, rulesim.go) made of a recording is written as
// a promtool rule unit test, whose input series are the recorded samples
// the rule files read and whose expectations are the alerts the library
// had firing at every rule-minute, with their labels and annotations.
// `promtool test rules` then evaluates the same rule files over the same
// samples; any disagreement fails it.

// TestPromtoolCrossCheck proves the cross-check can fail: over a small
// recording whose rules fire an alert, promtool passes the expectations
// the library produced, and fails each one made wrong.
func TestPromtoolCrossCheck(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	promtool := binary(t, "PROMTOOL_BIN", filepath.Join(root, "tools"), "github.com/prometheus/prometheus/cmd/promtool", dir)

	rulesPath := filepath.Join(dir, "rules.yml")
	writeFile(t, rulesPath, `groups:
  - name: kvload.rules
    rules:
      - record: job:toy_up:min
        expr: min by (job) (toy_up)
  - name: kvload.alerts
    rules:
      - alert: ToyDown
        expr: job:toy_up:min == 0
        for: 1m
        labels: {severity: page}
        annotations: {summary: "{{ $labels.job }} down, value {{ $value }}"}
      - alert: ToyNever
        expr: job:toy_up:min > 5
`)
	files := []string{rulesPath}
	const toyInterval = 30 * time.Second
	db, err := teststorage.NewWithError()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	// toy_up{job="a"}: 1 for 2 minutes, then 0 (ToyDown firing from 3m);
	// job="b" appears at 1m and stays 1.
	app := db.Appender(t.Context())
	for i := range 13 {
		ts := ruleEpoch.Add(time.Duration(i) * toyInterval).UnixMilli()
		a := 1.0
		if i >= 4 {
			a = 0
		}
		if _, err := app.Append(0, labels.FromStrings(labels.MetricName, "toy_up", "job", "a"), ts, a); err != nil {
			t.Fatal(err)
		}
		if i >= 2 {
			if _, err := app.Append(0, labels.FromStrings(labels.MetricName, "toy_up", "job", "b"), ts, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	last := 12 * toyInterval
	steps, err := evaluateRules(t.Context(), files, db, last, toyInterval, "none", "none", []string{"ToyDown"})
	if err != nil {
		t.Fatal(err)
	}
	firingAt := map[time.Duration]int{}
	for _, s := range steps {
		firingAt[s.at] = len(s.firing)
	}
	if firingAt[2*time.Minute] != 0 || firingAt[3*time.Minute] != 1 || firingAt[6*time.Minute] != 1 {
		t.Fatalf("the library's firing alerts per step: %v, want ToyDown from 3m", firingAt)
	}

	tests := []struct {
		name  string
		alter func(steps []ruleStep) // nil: the library's own expectations
		fails bool
	}{
		{"as the library found", nil, false},
		{"a firing alert left out", func(s []ruleStep) {
			for i := range s {
				if s[i].at == 4*time.Minute {
					s[i].firing = nil
				}
			}
		}, true},
		{"an alert firing that is not", func(s []ruleStep) {
			for i := range s {
				if s[i].at == 2*time.Minute {
					s[i].firing = append(s[i].firing, s[len(s)-1].firing...)
				}
			}
		}, true},
		{"a wrong annotation", func(s []ruleStep) {
			for i := range s {
				for j := range s[i].firing {
					s[i].firing[j].Annotations = labels.FromStrings("summary", "a down, value 1")
				}
			}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mine := slices.Clone(steps)
			for i := range mine {
				mine[i].firing = slices.Clone(mine[i].firing)
			}
			if tt.alter != nil {
				tt.alter(mine)
			}
			path := filepath.Join(t.TempDir(), "check.yml")
			if err := writePromtoolTest(t.Context(), path, files, db, mine, last, toyInterval); err != nil {
				t.Fatal(err)
			}
			err := promtoolTestRules(t.Context(), promtool, path)
			switch {
			case tt.fails && err == nil:
				t.Errorf("promtool passed expectations made wrong")
			case !tt.fails && err != nil:
				t.Errorf("promtool failed the library's own expectations: %v", err)
			case err != nil:
				t.Logf("promtool failed, as it must: %v", firstLines(err.Error(), 6))
			}
		})
	}
}
