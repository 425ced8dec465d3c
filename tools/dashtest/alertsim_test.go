package dashtest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestAlertScenarios proves the cache alerts' state on real exporter
// output: the engine emulator and the exporter run as processes, the
// exporter replays the shared conversation trace F times as fast as
// recorded, and its /metrics, scraped every real second, is stored at
// rule time i × F (see rulesim.go). Both rule files are then
// evaluated over the recording. Every time below is rule time, which is
// also the trace's own time.
//
// Each scenario takes about (startup + span / F) of real time, most of it
// waiting; alertScenarioSlots of them run at a time.

func TestAlertScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("alert scenarios: several minutes")
	}
	// Beside TestPrometheusEndToEnd, which waits on Prometheus' clock.
	t.Parallel()
	root := repoRoot(t)
	trace := filepath.Join(root, "testdata", "mooncake", "conversation_trace.jsonl")
	if _, err := os.Stat(trace); err != nil {
		t.Fatalf("the alert scenarios replay the shared conversation trace, which is missing: %v", err)
	}
	bin := t.TempDir()
	kvload := binary(t, "KVLOAD_EXPORTER_BIN", root, "./cmd/kvload-exporter", bin)
	promtool := binary(t, "PROMTOOL_BIN", filepath.Join(root, "tools"), "github.com/prometheus/prometheus/cmd/promtool", bin)
	files := ruleFiles(root)

	th, err := readThresholds(files)
	if err != nil {
		t.Fatal(err)
	}
	distinct, err := distinctBlocks(trace, alertMaxISL)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("F = %d; rules: %s < %g for %v, %s > %g for %v; pass holds %d blocks of %d tokens, cut to %d",
		alertCompression, efficiencyRule, th.eff, th.hitHold, contrastRule, th.contrast, th.contrastHold, distinct,
		emulatorBlockTokens, int(float64(distinct)*cutShare))
	scenarios := alertScenarioList(distinct)
	// alertScenarioSlots at a time: a scenario is mostly waiting for its
	// rule time to pass, and the rule time of each scrape is its index,
	// not the wall clock, so a slower scrape does not move the alerts'
	// timeline.
	slots := make(chan struct{}, alertScenarioSlots)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			slots <- struct{}{}
			t.Cleanup(func() { <-slots })
			r := runAlertScenario(t, kvload, promtool, trace, files, sc)
			th.apply(r)
			r.logTimeline(t)
			sc.check(t, r)
		})
	}
}

// runAlertScenario starts the emulator and the exporter, records span of
// rule time (applying the change on the way), evaluates the rules and has
// promtool cross-check the alerts' states.
func runAlertScenario(t *testing.T, kvload, promtool, trace string, files []string, sc alertScenario) *scenarioResult {
	t.Helper()
	dir := t.TempDir()
	emuAddr := freeAddr(t)
	// Short outputs at 1 ms per token: the trace runs F times as fast but
	// the engine does not, so full-length outputs would pile up in flight.
	args := append([]string{"emulate", "--listen", emuAddr, "--model", e2eModel, "--inter-token", "1ms"}, sc.emulate...)
	var emu *process // nil while the engine is down
	if sc.startAfter == 0 {
		emu = startProcess(t, dir, "emulator", kvload, args...)
		waitHTTP(t, emu, "http://"+emuAddr+"/metrics", time.Minute)
	}
	dialect := sc.dialect
	if dialect == "" {
		dialect = "vllm"
	}

	// What a new user writes: nothing about the cache, whose block size
	// and capacity are read from the engine where it says them. One thing
	// more: the exporter's own estimates (the effective capacity, the cost
	// fit) look back over real time, 5 minutes by default, which is 150
	// minutes of rule time here; estimate_window scales them by 1/F, to 5
	// minutes of rule time like the rules' rate windows.
	cfg := fmt.Sprintf(`targets:
  - name: %s
    url: http://%s
    model: %s
    dialect: %s
    cache: {estimate_window: %s}
workloads:
  - name: %s
    trace: %s
    targets: [%s]
    seed: 7
    synthesis: {speedup_ratio: %d, max_isl: %d, max_osl: 32}
    loop: fresh
`, alertTarget, emuAddr, e2eModel, dialect, rateWindow/alertCompression, alertWorkload, trace, alertTarget, alertCompression, alertMaxISL)
	writeFile(t, filepath.Join(dir, "kvload.yml"), cfg)
	expAddr := freeAddr(t)
	exp := startProcess(t, dir, "exporter", kvload, "--config.file="+filepath.Join(dir, "kvload.yml"),
		"--web.listen-address="+expAddr)
	waitHTTP(t, exp, "http://"+expAddr+"/-/ready", time.Minute)

	rec := newRecorder(t, expAddr, alertCompression)
	if dir := os.Getenv("KVLOAD_ALERT_TAPES"); dir != "" {
		tw, err := newTapeWriter(dir, sc.name, alertCompression)
		if err != nil {
			t.Fatal(err)
		}
		rec.tape = tw
	}
	res := &scenarioResult{changeAt: -1}
	// changeAt: when the change comes; later where it waits for a baseline.
	changeAt, firstSeen := alertChangeAt, time.Duration(-1)
	span := func() time.Duration { return sc.span + changeAt - alertChangeAt }
	if sc.changeFirst {
		changeAt, span = 0, fixedSpan(sc.span)
	}
	recordScenario(t, rec, exp, span, func(at time.Duration) *process {
		if sc.baselineOf != "" && firstSeen < 0 && rec.has(t.Context(), sc.baselineOf, at) {
			firstSeen = at
			changeAt = max(alertChangeAt, baselineAt(at))
			t.Logf("%s first at %v: the change comes at %v", sc.baselineOf, at, changeAt)
		}
		if sc.baselineOf != "" && firstSeen < 0 {
			if at > 2*alertChangeAt {
				t.Fatalf("%s never appeared in %v of rule time", sc.baselineOf, at)
			}
			changeAt = max(changeAt, baselineAt(at))
		}
		if emu == nil && sc.startAfter > 0 && res.changeAt < 0 && at >= sc.startAfter {
			emu = startProcess(t, dir, "emulator", kvload, args...)
			waitHTTP(t, emu, "http://"+emuAddr+"/metrics", time.Minute)
		}
		if sc.change != "" && res.changeAt < 0 && at >= changeAt {
			if err := postCache(t.Context(), "http://"+emuAddr, sc.change); err != nil {
				t.Fatal(err)
			}
			res.changeAt = at
		}
		if sc.restart && res.changeAt < 0 && at >= alertChangeAt {
			emu.kill()
			emu = nil
			res.changeAt = at
		}
		if sc.restart && emu == nil && at >= res.changeAt+engineDowntime {
			emu = startProcess(t, dir, "emulator-restarted", kvload, args...)
			waitHTTP(t, emu, "http://"+emuAddr+"/metrics", time.Minute)
		}
		return emu
	})
	if rec.tape != nil {
		if err := rec.tape.finish(res.changeAt); err != nil {
			t.Fatal(err)
		}
	}
	evaluateScenario(t, res, rec, promtool, dir, files, alertWorkload, alertTarget)
	return res
}

// --- checks and figures ------------------------------------------------------
