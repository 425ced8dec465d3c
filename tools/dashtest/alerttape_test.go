package dashtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAlertTapes evaluates the rule files over every kept tape and applies
// the check of the scenario it recorded. It needs no exporter, engine or
// clock: what it judges is rule time on recorded output, so a loaded
// machine cannot fail it. KVLOAD_ALERT_TAPE_DIR names another folder of
// tapes (the live runs' KVLOAD_ALERT_TAPES).
func TestAlertTapes(t *testing.T) {
	root := repoRoot(t)
	dir := os.Getenv("KVLOAD_ALERT_TAPE_DIR")
	if dir == "" {
		dir = filepath.Join(root, "tools", "dashtest", "testdata", "alerts")
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.tape.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no alert tapes in %s", dir)
	}
	files := ruleFiles(root)
	th, err := readThresholds(files)
	if err != nil {
		t.Fatal(err)
	}
	// The checks do not depend on the cache sizes the flags were built from.
	byName := map[string]alertScenario{}
	for _, sc := range alertScenarioList(1000) {
		byName[sc.name] = sc
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			t.Parallel()
			tp := loadTape(t, p)
			sc, ok := byName[tp.scenario]
			if !ok {
				t.Fatalf("%s: no scenario named %q", p, tp.scenario)
			}
			res := &scenarioResult{changeAt: tp.changeAt}
			evaluateScenario(t, res, tp.rec, "", t.TempDir(), files, alertWorkload, alertTarget)
			th.apply(res)
			if out := os.Getenv("KVLOAD_ALERT_TAPE_CSV"); out != "" {
				writeStepsCSV(t, filepath.Join(out, strings.TrimSuffix(filepath.Base(p), ".tape.gz")+".csv"), res)
			}
			res.logTimeline(t)
			sc.check(t, res)
		})
	}
}

// writeStepsCSV writes a scenario's signals and alert states per step, for
// calibrating thresholds outside the test.
func writeStepsCSV(t *testing.T, path string, r *scenarioResult) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "at_s,change_s,efficiency,eff_abs,capacity,cost,lower_bound,%s,%s,%s\n", hitRegression, contrastLost, smallerThanConfigured)
	for _, s := range r.steps {
		fmt.Fprintf(&b, "%g,%g,%g,%g,%g,%g,%g,%s,%s,%s\n", s.at.Seconds(), r.changeAt.Seconds(), s.efficiency, s.effAbs, s.capacity, s.contrast, s.lowerBound,
			s.state(hitRegression), s.state(contrastLost), s.state(smallerThanConfigured))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
