package dashtest

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/teststorage"
	"gopkg.in/yaml.v3"
)

// The cross-check of the rule engine by the real promtool: what the rule
// engine (as a library, rulesim_test.go) made of a recording is written as
// a promtool rule unit test, whose input series are the recorded samples
// the rule files read and whose expectations are the alerts the library
// had firing at every rule-minute, with their labels and annotations.
// `promtool test rules` then evaluates the same rule files over the same
// samples; any disagreement fails it.

// promtoolFile is a promtool rule unit test file (its YAML keys).
type promtoolFile struct {
	RuleFiles          []string        `yaml:"rule_files"`
	EvaluationInterval string          `yaml:"evaluation_interval"`
	GroupEvalOrder     []string        `yaml:"group_eval_order"`
	Tests              []promtoolGroup `yaml:"tests"`
}

type promtoolGroup struct {
	Name           string              `yaml:"name"`
	Interval       string              `yaml:"interval"`
	InputSeries    []promtoolSeries    `yaml:"input_series"`
	AlertRuleTests []promtoolAlertTest `yaml:"alert_rule_test"`
}

type promtoolSeries struct {
	Series string `yaml:"series"`
	Values string `yaml:"values"`
}

type promtoolAlertTest struct {
	EvalTime  string          `yaml:"eval_time"`
	Alertname string          `yaml:"alertname"`
	ExpAlerts []promtoolAlert `yaml:"exp_alerts"`
}

type promtoolAlert struct {
	ExpLabels      map[string]string `yaml:"exp_labels,omitempty"`
	ExpAnnotations map[string]string `yaml:"exp_annotations,omitempty"`
}

// ruleInputs reads the rule files: the metric names their expressions
// select that no rule of theirs records (what a scrape must provide), and
// the names of their alerts.
func ruleInputs(files []string) (inputs, alerts []string, err error) {
	recorded := map[string]bool{}
	selected := map[string]bool{}
	for _, f := range files {
		groups, errs := rulefmt.ParseFile(f, false)
		if len(errs) > 0 {
			return nil, nil, fmt.Errorf("%s: %w", f, errs[0])
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					recorded[r.Record] = true
				}
				if r.Alert != "" {
					alerts = append(alerts, r.Alert)
				}
				expr, err := parser.ParseExpr(r.Expr)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: %s: %w", f, r.Record+r.Alert, err)
				}
				parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
					if vs, ok := n.(*parser.VectorSelector); ok {
						name := vs.Name
						for _, m := range vs.LabelMatchers {
							if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
								name = m.Value
							}
						}
						if name != "" {
							selected[name] = true
						}
					}
					return nil
				})
			}
		}
	}
	for name := range selected {
		if !recorded[name] {
			inputs = append(inputs, name)
		}
	}
	slices.Sort(inputs)
	return inputs, alerts, nil
}

// promtoolInputSeries turns the stored samples of the given metric names,
// from rule time 0 to last, into promtool input series at interval: one
// value per step, "_" where a series has none. Every sample must sit on a
// step.
func promtoolInputSeries(ctx context.Context, st storage.Queryable, names []string, last, interval time.Duration) ([]promtoolSeries, error) {
	steps := int(last/interval) + 1
	q, err := st.Querier(ruleEpoch.UnixMilli(), ruleEpoch.Add(last).UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("querier: %w", err)
	}
	defer q.Close()
	m, err := labels.NewMatcher(labels.MatchRegexp, labels.MetricName, strings.Join(names, "|"))
	if err != nil {
		return nil, fmt.Errorf("matcher: %w", err)
	}
	set := q.Select(ctx, true, nil, m)
	var out []promtoolSeries
	var it chunkenc.Iterator
	for set.Next() {
		s := set.At()
		vals := make([]string, steps)
		for i := range vals {
			vals[i] = "_"
		}
		it = s.Iterator(it)
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			if vt != chunkenc.ValFloat {
				return nil, fmt.Errorf("%s: a %v sample; only floats are written", s.Labels(), vt)
			}
			ts, v := it.At()
			off := time.Duration(ts-ruleEpoch.UnixMilli()) * time.Millisecond
			if off%interval != 0 {
				return nil, fmt.Errorf("%s: a sample at %v, not on the %v grid", s.Labels(), off, interval)
			}
			vals[off/interval] = promtoolValue(v)
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Labels(), err)
		}
		lb := labels.NewBuilder(s.Labels())
		lb.Del(labels.MetricName)
		out = append(out, promtoolSeries{
			Series: s.Labels().Get(labels.MetricName) + lb.Labels().String(),
			Values: strings.Join(vals, " "),
		})
	}
	if err := set.Err(); err != nil {
		return nil, fmt.Errorf("select: %w", err)
	}
	return out, nil
}

// promtoolValue writes a sample so that it reads back as the same float.
func promtoolValue(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// promtoolAlertTests expects, at every rule-minute of steps, for every
// alert of the rule files, exactly the alerts the library had firing.
func promtoolAlertTests(steps []ruleStep, alerts []string) []promtoolAlertTest {
	var tests []promtoolAlertTest
	for _, s := range steps {
		if s.at%time.Minute != 0 {
			continue
		}
		for _, name := range alerts {
			exp := []promtoolAlert{}
			for _, f := range s.firing {
				if f.Labels.Get(labels.AlertName) != name {
					continue
				}
				lb := labels.NewBuilder(f.Labels)
				lb.Del(labels.AlertName)
				exp = append(exp, promtoolAlert{ExpLabels: lb.Labels().Map(), ExpAnnotations: f.Annotations.Map()})
			}
			tests = append(tests, promtoolAlertTest{EvalTime: model.Duration(s.at).String(), Alertname: name, ExpAlerts: exp})
		}
	}
	return tests
}

// writePromtoolTest writes, at path, the promtool rule unit test of what
// the library made of the recording in st (steps, up to rule time last).
func writePromtoolTest(ctx context.Context, path string, files []string, st storage.Queryable, steps []ruleStep, last, interval time.Duration) error {
	inputs, alerts, err := ruleInputs(files)
	if err != nil {
		return err
	}
	series, err := promtoolInputSeries(ctx, st, inputs, last, interval)
	if err != nil {
		return err
	}
	f := promtoolFile{
		RuleFiles:          files,
		EvaluationInterval: model.Duration(interval).String(),
		GroupEvalOrder:     ruleGroupOrder,
		Tests: []promtoolGroup{{
			Name:           "recorded",
			Interval:       model.Duration(interval).String(),
			InputSeries:    series,
			AlertRuleTests: promtoolAlertTests(steps, alerts),
		}},
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("promtool test: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("promtool test: %w", err)
	}
	return nil
}

// promtoolTestRules runs `promtool test rules` on a file; its output is in
// the error when it fails.
func promtoolTestRules(ctx context.Context, promtool, path string) error {
	out, err := exec.CommandContext(ctx, promtool, "test", "rules", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("promtool test rules %s: %w\n%s", path, err, out)
	}
	return nil
}

// crossCheckWithPromtool writes the promtool test of a scenario's
// recording into dir (kept as the test's artefact) and runs it.
func crossCheckWithPromtool(t *testing.T, promtool, dir string, files []string, st storage.Queryable, steps []ruleStep, interval time.Duration) {
	t.Helper()
	if len(steps) == 0 {
		t.Fatal("no rule evaluation to cross-check")
	}
	path := filepath.Join(dir, "promtool-crosscheck.yml")
	last := steps[len(steps)-1].at
	if err := writePromtoolTest(t.Context(), path, files, st, steps, last, interval); err != nil {
		t.Fatal(err)
	}
	if err := promtoolTestRules(t.Context(), promtool, path); err != nil {
		t.Errorf("promtool disagrees with the rule engine on this recording: %v", err)
		return
	}
	t.Logf("promtool agrees with the rule engine at every rule-minute (%s)", path)
}

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

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
