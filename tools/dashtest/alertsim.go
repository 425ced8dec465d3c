package dashtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
)

const (
	// alertCompression is F: rule seconds per real second, also the
	// replay's speedup_ratio, so that rule time is the trace's time.
	alertCompression = 30
	// alertChangeAt: when a scenario breaks (or flushes) the cache: once
	// the cache alerts' baselines have formed on settled samples
	// (baselineForms, at 35 minutes), with 18 settled minutes in them,
	// and early enough that the longest judged window (a transient's
	// recoverWithin and 5 minutes more, to minute 58) ends inside the
	// trace's first pass (its last row at 58:57).
	alertChangeAt = 38 * time.Minute
	// healthySpan: how long a scenario without a change runs: as long as
	// a breaking one, so that a healthy engine is judged over the very
	// minutes in which a broken one must page.
	healthySpan = alertChangeAt + pageWithin + 2*time.Minute
	// alertScenarioSlots: scenarios at a time. Each runs an emulator
	// that tokenizes every prompt and an exporter that builds them, and
	// mostly waits for its rule time. The silent targets' alert reads
	// the cost fit, from TTFTs: on 2 cores more at once puts seconds of
	// run-queue wait in them and hides a broken cache. The twenty-one
	// scenarios take about six rounds of four.
	alertScenarioSlots = 4
	// boundShare: the share of a pass's distinct blocks the engines whose
	// capacity cannot be read hold. The shared trace's hit rate climbs
	// steeply between 1 % and 7 % of them (analyze --capacity-curve):
	// 0.265 at 4 %, 0.20 at 2 %, 0.387 unbounded, so that halving the
	// cache costs it a quarter of its hits.
	boundShare = 0.04
	// alertMaxISL keeps the emulator's tokenizer (it tokenizes every
	// prompt) well within 2 shared cores: the shared trace's rows up to
	// 8,000 prompt tokens are 6,546 of 12,031, 21.5 M tokens over its 59
	// minutes, about 180 k tokens per real second at F = 30 (the emulator
	// used about 15 % of a core). Shorter prompts would not do: every
	// conversation shares its first 512-token block, so a prompt is in
	// cache class none (< 10 % cacheable) only above 5,120 tokens, and the
	// TTFT contrast needs that class.
	alertMaxISL = 8000
	// traceBlockTokens: a Mooncake trace's hash_ids each stand for 512
	// prompt tokens.
	traceBlockTokens = 512
	// emulatorBlockTokens: vLLM's (and the emulator's) default block size.
	emulatorBlockTokens = 16
	// cutShare is the share of the pass's distinct blocks the cache is cut
	// to in the capacity scenario (2-5 % asked for). The efficiency then
	// settles at 0.5-0.7 with excursions to 0.84 (docs/cache-model.md,
	// "Alerts on real traffic").
	cutShare = 0.02

	alertWorkload = "alerts"
	alertTarget   = "vllm"

	hitRegression = "KvloadCacheHitRegression"
	// smallerThanConfigured: the engine behaves like a cache under a
	// quarter of the capacity it reports.
	smallerThanConfigured = "KvloadCacheSmallerThanConfigured"
	// largeShare: the cache, in shares of a pass's distinct blocks, of the
	// engine far larger than the traffic needs (a production GPU's against
	// a canary's working set).
	largeShare = 8
	// smallerWithin: the static alert holds 30 minutes, after 5 minutes
	// without a lower bound, and a cut cache still serves all in the
	// pass's first minutes: it must fire within 45 minutes of a cut.
	smallerWithin = 45 * time.Minute
	contrastLost  = "KvloadCacheTTFTContrastLost"
	// engineMetricsWrong: the engine's cache counters disagree with its
	// responses (per target: it has no workload label).
	engineMetricsWrong = "KvloadCacheEngineMetricsDisagree"
	// disagreeSpan: a run long enough for an engine whose counters are
	// wrong from the start to page (the exporter reads them every 5 s of
	// real time, 150 s of rule time; the alert holds 15 minutes). A 5m
	// rate holds only two reads here, so one read late on a loaded machine
	// empties a window and restarts the 15 minutes: the span leaves room
	// for one such restart.
	disagreeSpan = 40 * time.Minute
	// The signals the two cache alerts compare with their thresholds: the
	// efficiency over its baseline, and the cached-token cost.
	efficiencyRule = "workload_target:kvload_cache_efficiency:ratio_to_baseline"
	contrastRule   = "workload_target:kvload_cache_cached_token_cost:ratio"
	// capacityRule: the effective capacity over its baseline, which holds
	// the hit-regression alert back while it stays at 3/4 or more.
	capacityRule = "workload_target:kvload_cache_effective_capacity:ratio_to_baseline"
	// pageWithin: a cache that breaks for good must page within 15
	// minutes, the promise the README makes.
	pageWithin = 15 * time.Minute
	// rateWindow is the contrast's window: a median "after" the change is
	// taken once the window has moved past it.
	rateWindow = 5 * time.Minute
	// engineDowntime: how long the restarted engine is away (rule time);
	// requests sent meanwhile fail to connect.
	engineDowntime = time.Minute
	// recoverWithin: after a transient (flush, engine restart), the
	// efficiency must be back at or above the alert's threshold this long
	// after the change, and stay there.
	recoverWithin = 15 * time.Minute
)

// alertScenario is one run: an emulator started with emulate flags, and
// optionally one change at alertChangeAt: a POST /emulator/cache, or an
// engine restart.
type alertScenario struct {
	name    string
	emulate []string // emulator flags beyond the common ones
	change  string   // JSON body of POST /emulator/cache; "" for none
	// dialect: the target's (and the emulator's engine); vllm if empty.
	dialect string
	// startAfter: the engine comes up this long (rule time) after the
	// exporter; requests fail to connect until then.
	startAfter time.Duration
	// restart: at alertChangeAt the emulator is killed (SIGKILL, as a
	// crash), and engineDowntime later a new one starts on the same
	// address with an empty cache.
	restart bool
	span    time.Duration
	// baselineOf, when set, is the exporter series the alert under test
	// compares with its own baseline: the change waits until that baseline
	// has formed (baselineForms after the series first appears, and no
	// sooner than alertChangeAt), and span counts from alertChangeAt as
	// if the change had come then. The cost fit's first figure comes
	// later on a busy machine; a change before its baseline would test
	// nothing but the machine.
	baselineOf string
	// changeFirst: the change comes at the first scrape, not at
	// alertChangeAt.
	changeFirst bool
	check       func(t *testing.T, r *scenarioResult)
}

// A baseline takes only the samples of a pair that has run for
// baselineSettle (kvload-rules.yml, workload_target:kvload_requests:settled20m),
// and exists once 10 of them (30 s apart here) lie more than 10 minutes
// back: baselineForms after its signal first appears, and never before
// baselineSettle + baselineForms (35 minutes).
const (
	baselineSettle = 20 * time.Minute
	baselineForms  = 10*time.Minute + 10*alertCompression*time.Second
)

// baselineAt is when the baseline of a signal first seen at firstSeen
// forms.
func baselineAt(firstSeen time.Duration) time.Duration {
	return max(firstSeen, baselineSettle) + baselineForms
}

// scenarioResult is what a scenario recorded and the rules made of it.
type scenarioResult struct {
	steps    []ruleStep
	interval time.Duration      // between rule evaluations (one per scrape)
	changeAt time.Duration      // rule time of the change; -1 without one
	outcomes map[string]float64 // kvload_requests_total by outcome at the last scrape
	// From the rule files as they are.
	effThreshold, contrastThreshold float64
	hitHold, contrastHold           time.Duration
	failureRecap
}

// alertThresholds are the cache alerts' thresholds and holds, read from the
// rule files as they are.
type alertThresholds struct {
	eff, contrast         float64
	hitHold, contrastHold time.Duration
}

func readThresholds(files []string) (alertThresholds, error) {
	var th alertThresholds
	var err error
	if th.eff, th.hitHold, err = alertThreshold(files, hitRegression, efficiencyRule); err != nil {
		return th, err
	}
	if th.contrast, th.contrastHold, err = alertThreshold(files, contrastLost, contrastRule); err != nil {
		return th, err
	}
	return th, nil
}

func (th alertThresholds) apply(r *scenarioResult) {
	r.effThreshold, r.contrastThreshold, r.hitHold, r.contrastHold = th.eff, th.contrast, th.hitHold, th.contrastHold
}

// alertScenarioList is every scenario, its caches sized from distinct, the
// emulator blocks one pass of the trace holds.
func alertScenarioList(distinct int) []alertScenario {
	cut := int(float64(distinct) * cutShare)
	// A target that reports no cached tokens, with a prefill cost that
	// makes the cache visible in TTFT (50 µs per uncached prompt token).
	silent := []string{"--omit-cached-tokens", "--overhead", "2ms", "--prefill-per-token", "50us"}

	scenarios := []alertScenario{
		{name: "healthy", span: healthySpan, check: func(t *testing.T, r *scenarioResult) {
			// The first evaluations after a start rest on a few
			// requests: pending there is allowed, firing never.
			r.neverFiring(t, hitRegression)
			r.neverActiveAfter(t, hitRegression, rateWindow)
			r.neverFiring(t, contrastLost)
			r.neverActiveAfter(t, contrastLost, rateWindow)
			r.neverActive(t, engineMetricsWrong)
			r.whatIf(t, r.efficiencyWhatIf())
		}},
		// An engine whose hit counter counts every hit twice from the
		// start (cache.reconcile, left at auto): the engine's metrics are
		// wrong, its cache is not.
		{name: "engine counts its hits twice", emulate: []string{"--metrics-double-count-hits"}, span: disagreeSpan, check: func(t *testing.T, r *scenarioResult) {
			at, ok := r.first(engineMetricsWrong, "firing", 0)
			if !ok || at > disagreeSpan-time.Minute {
				t.Errorf("%s firing: %v at %v, want by %v", engineMetricsWrong, ok, at, disagreeSpan-time.Minute)
			} else {
				pending, _ := r.first(engineMetricsWrong, "pending", 0)
				t.Logf("%s pending at %v, firing at %v", engineMetricsWrong, pending, at)
			}
			r.neverFiring(t, hitRegression)
		}},
		{name: "cache disabled", change: `{"enabled": false}`, span: alertChangeAt + pageWithin + 2*time.Minute, check: func(t *testing.T, r *scenarioResult) {
			r.firesAfterChange(t, hitRegression)
			r.neverActive(t, contrastLost)
			r.whatIf(t, r.efficiencyWhatIf())
		}},
		{name: "capacity cut", change: fmt.Sprintf(`{"capacity_blocks": %d}`, cut), span: alertChangeAt + pageWithin + 2*time.Minute, check: func(t *testing.T, r *scenarioResult) {
			r.firesAfterChange(t, hitRegression)
			r.neverActive(t, contrastLost)
			r.whatIf(t, r.efficiencyWhatIf())
		}},
		{name: "flush", change: `{"flush": true}`, span: alertChangeAt + recoverWithin + 5*time.Minute, check: func(t *testing.T, r *scenarioResult) {
			r.neverFiring(t, hitRegression)
			r.neverActive(t, contrastLost)
			r.neverFiring(t, engineMetricsWrong)
			r.dipsAndRecovers(t)
			r.whatIf(t, r.efficiencyWhatIf())
		}},
		{name: "engine restart", restart: true, span: alertChangeAt + recoverWithin + 5*time.Minute, check: func(t *testing.T, r *scenarioResult) {
			// The engine was away: requests failed to connect.
			t.Logf("requests by outcome at the end: %v", r.outcomes)
			if r.outcomes["connection_error"] == 0 {
				t.Errorf("no request failed to connect while the engine was down: %v", r.outcomes)
			}
			r.neverFiring(t, hitRegression)
			r.neverActive(t, contrastLost)
			r.neverFiring(t, engineMetricsWrong)
			r.dipsAndRecovers(t)
			r.whatIf(t, r.efficiencyWhatIf())
		}},
		{name: "silent target, cache disabled", emulate: silent, change: `{"enabled": false}`, span: alertChangeAt + pageWithin + 2*time.Minute,
			baselineOf: "kvload_cache_cached_token_cost_ratio",
			check: func(t *testing.T, r *scenarioResult) {
				r.firesAfterChange(t, contrastLost)
				r.neverActive(t, hitRegression)
				r.efficiencyAbsent(t)
				r.logContrast(t)
				r.whatIf(t, r.contrastWhatIf())
			}},
		{name: "silent target, flush", emulate: silent, change: `{"flush": true}`, span: alertChangeAt + recoverWithin + 5*time.Minute,
			baselineOf: "kvload_cache_cached_token_cost_ratio",
			check: func(t *testing.T, r *scenarioResult) {
				r.neverFiring(t, contrastLost)
				r.neverActive(t, hitRegression)
				r.efficiencyAbsent(t)
				r.logContrast(t)
				r.whatIf(t, r.contrastWhatIf())
			}},
		{name: "silent target, healthy", emulate: silent, span: healthySpan, check: func(t *testing.T, r *scenarioResult) {
			// Right after a start the contrast rests on a handful of
			// requests and may touch 0.5 for a minute: pending then,
			// never firing, and never active once a window has passed.
			r.neverFiring(t, contrastLost)
			r.neverActiveAfter(t, contrastLost, rateWindow)
			r.neverActive(t, hitRegression)
			r.efficiencyAbsent(t)
			r.logContrast(t)
			r.whatIf(t, r.contrastWhatIf())
		}},
		healthyOnly("down for the first 2 minutes", scenarioEngine{dialect: "vllm"}, 2*time.Minute),
		// A vLLM-like engine that reports a cache 8 times the pass's
		// distinct blocks: it serves every hit the model offers, so its
		// effective capacity is only a lower bound, far under its size.
		{name: "vLLM with a large cache, healthy", emulate: []string{fmt.Sprintf("--capacity-blocks=%d", largeShare*distinct)},
			span: healthySpan, check: func(t *testing.T, r *scenarioResult) {
				// The first window rests on a few requests: pending
				// there is allowed, firing never.
				r.neverFiring(t, smallerThanConfigured)
				r.neverActiveAfter(t, smallerThanConfigured, rateWindow)
				r.neverFiring(t, hitRegression)
				r.neverActive(t, contrastLost)
				r.mostlyLowerBound(t)
			}},
		// An engine that reports that large cache but holds cutShare of
		// the pass from its start: under a quarter of its size, it pages.
		{name: "vLLM reporting a large cache, holding a small one", emulate: []string{fmt.Sprintf("--capacity-blocks=%d", largeShare*distinct)},
			change: fmt.Sprintf(`{"capacity_blocks": %d}`, cut), changeFirst: true, span: smallerWithin + 2*time.Minute,
			check: func(t *testing.T, r *scenarioResult) {
				r.firesWithin(t, smallerThanConfigured, smallerWithin)
				r.neverActive(t, contrastLost)
			}},
	}
	// Engines whose capacity the exporter cannot read, so that its model
	// is an unbounded cache and reads them low: they must be judged
	// against their own healthy past, quiet while healthy and paging when
	// their cache is disabled or halved. Each holds a few percent of the
	// pass's distinct blocks (boundShare), where the hits depend on the
	// capacity.
	bound := int(float64(distinct) * boundShare)
	for _, eng := range []scenarioEngine{
		{name: "llama.cpp", dialect: "llamacpp", flags: []string{"--slots", "4", fmt.Sprintf("--cache-ram-tokens=%d", bound*emulatorBlockTokens)},
			halve: fmt.Sprintf(`{"cache_ram_tokens": %d}`, bound*emulatorBlockTokens/2)},
		{name: "vLLM hiding its capacity", dialect: "vllm", flags: []string{"--hide-cache-config", fmt.Sprintf("--capacity-blocks=%d", bound)},
			halve: fmt.Sprintf(`{"capacity_blocks": %d}`, bound/2)},
		{name: "TensorRT-LLM", dialect: "trtllm", flags: []string{fmt.Sprintf("--capacity-blocks=%d", bound/2)},
			halve: fmt.Sprintf(`{"capacity_blocks": %d}`, bound/4)},
	} {
		scenarios = append(scenarios, healthyOnly(eng.name+", healthy", eng, 0),
			pages(eng.name+", cache disabled", eng, `{"enabled": false}`),
			pages(eng.name+", capacity halved", eng, eng.halve))
	}
	return scenarios
}

// recordScenario scrapes the exporter every real second, storing scrape i
// at rule time i × F, until rule time span() (asked again at each scrape). step runs at each scrape's
// rule time (a scenario's changes happen there) and returns the engine's
// process, or nil while it is away on purpose: either exiting otherwise
// fails the test.
func recordScenario(t *testing.T, rec *recorder, exp *process, span func() time.Duration, step func(at time.Duration) *process) {
	t.Helper()
	// The ticker is the sampling clock.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := rec.scrape(t.Context()); err != nil {
			t.Fatal(err)
		}
		at := rec.ruleTime(rec.scrapes - 1)
		engine := step(at)
		if at >= span() {
			return
		}
		var engineDone chan struct{} // nil blocks: no engine to watch
		if engine != nil {
			engineDone = engine.done
		}
		select {
		case <-tick.C:
		case <-exp.done:
			t.Fatalf("exporter exited: %v", exp.err)
		case <-engineDone:
			t.Fatalf("%s exited: %v", engine.name, engine.err)
		}
	}
}

// evaluateScenario evaluates the rule files over what rec stored, one
// evaluation per scrape, into res (steps and the final outcomes), and has
// promtool cross-check the alerts' states (none where promtool is "").
func evaluateScenario(t *testing.T, res *scenarioResult, rec *recorder, promtool, dir string, files []string, workload, target string) {
	t.Helper()
	ctx := t.Context()
	res.interval = rec.ruleTime(1)
	last := rec.ruleTime(rec.scrapes - 1)
	steps, err := evaluateRules(ctx, files, rec.db, last, res.interval, workload, target, []string{hitRegression, contrastLost, engineMetricsWrong, smallerThanConfigured})
	if err != nil {
		t.Fatal(err)
	}
	res.steps = steps
	if res.outcomes, err = outcomes(ctx, rec.db, last); err != nil {
		t.Fatal(err)
	}
	if promtool != "" {
		crossCheckWithPromtool(t, promtool, dir, files, rec.db, steps, res.interval)
	}
}

// outcomes reads kvload_requests_total by outcome at rule time at.
func outcomes(ctx context.Context, st storage.Queryable, at time.Duration) (map[string]float64, error) {
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute})
	q, err := engine.NewInstantQuery(ctx, st, nil, `sum by (outcome) (kvload_requests_total)`, ruleEpoch.Add(at))
	if err != nil {
		return nil, fmt.Errorf("outcomes: %w", err)
	}
	defer q.Close()
	res := q.Exec(ctx)
	v, err := res.Vector()
	if err != nil {
		return nil, fmt.Errorf("outcomes: %w", err)
	}
	out := map[string]float64{}
	for _, s := range v {
		out[s.Metric.Get("outcome")] = s.F
	}
	return out, nil
}

func postCache(ctx context.Context, emu, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, emu+"/emulator/cache", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("POST /emulator/cache %s: %w", body, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /emulator/cache %s: %s: %s", body, resp.Status, b)
	}
	return nil
}

// distinctBlocks is what one pass over the trace's rows up to maxISL
// holds, in emulator blocks: its distinct hash_ids, 512 tokens each.
func distinctBlocks(trace string, maxISL int) (int, error) {
	f, err := os.Open(trace)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	seen := map[int64]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var row struct {
			InputLength int     `json:"input_length"`
			HashIDs     []int64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return 0, fmt.Errorf("%s: %w", trace, err)
		}
		if row.InputLength > maxISL {
			continue
		}
		for _, h := range row.HashIDs {
			seen[h] = true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", trace, err)
	}
	return len(seen) * traceBlockTokens / emulatorBlockTokens, nil
}

// first is the first step at or after from where alert is in state
// ("pending" or "firing"; "active" for either).
func (r *scenarioResult) first(alert, state string, from time.Duration) (time.Duration, bool) {
	for _, s := range r.steps {
		if s.at < from {
			continue
		}
		st := s.state(alert)
		if st == state || (state == "active" && st != "inactive") {
			return s.at, true
		}
	}
	return 0, false
}

func (r *scenarioResult) neverActive(t *testing.T, alert string) {
	t.Helper()
	if at, ok := r.first(alert, "active", 0); ok {
		r.errorf(t, "%s %s at %v, want never pending or firing", alert, r.stateAt(alert, at), at)
	}
}

func (r *scenarioResult) neverActiveAfter(t *testing.T, alert string, from time.Duration) {
	t.Helper()
	if at, ok := r.first(alert, "active", from); ok {
		r.errorf(t, "%s %s at %v, want never pending or firing from %v on", alert, r.stateAt(alert, at), at, from)
	}
}

func (r *scenarioResult) neverFiring(t *testing.T, alert string) {
	t.Helper()
	if at, ok := r.first(alert, "firing", 0); ok {
		r.errorf(t, "%s firing at %v, want never", alert, at)
	}
	if at, ok := r.first(alert, "pending", 0); ok {
		t.Logf("%s pending from %v (never firing)", alert, at)
	}
}

// firesAfterChange: not firing before the change, firing within
// pageWithin after it.
func (r *scenarioResult) firesAfterChange(t *testing.T, alert string) {
	t.Helper()
	r.firesWithin(t, alert, pageWithin)
}

// firesWithin: not firing before the change, firing within within after
// it.
func (r *scenarioResult) firesWithin(t *testing.T, alert string, within time.Duration) {
	t.Helper()
	if r.changeAt < 0 {
		t.Fatal("no change applied")
	}
	if at, ok := r.first(alert, "firing", 0); ok && at < r.changeAt {
		r.errorf(t, "%s firing at %v, before the change at %v", alert, at, r.changeAt)
	}
	if at, ok := r.first(alert, "pending", 0); ok && at < r.changeAt {
		t.Logf("%s pending at %v, before the change at %v (never firing before it)", alert, at, r.changeAt)
	}
	pending, okP := r.first(alert, "pending", r.changeAt)
	firing, okF := r.first(alert, "firing", r.changeAt)
	switch {
	case !okF:
		r.errorf(t, "%s never firing after the change at %v (pending %v at %v)", alert, r.changeAt, okP, pending)
	case firing-r.changeAt > within:
		r.errorf(t, "%s firing at %v, %v after the change, want within %v", alert, firing, firing-r.changeAt, within)
	case !okP || pending > firing:
		// A counted alert has no pending state: it fires at once.
		t.Logf("%s: change at %v, firing at %v (+%v)", alert, r.changeAt, firing, firing-r.changeAt)
	default:
		t.Logf("%s: change at %v, pending at %v (+%v), firing at %v (+%v)",
			alert, r.changeAt, pending, pending-r.changeAt, firing, firing-r.changeAt)
	}
}

func (r *scenarioResult) stateAt(alert string, at time.Duration) string {
	for _, s := range r.steps {
		if s.at == at {
			return s.state(alert)
		}
	}
	return "?"
}

// readsZeroAfter: from rule time from on the cache serves nothing (a
// window past the restart without it), so the efficiency must read
// exactly 0 at every step; with server_metrics the counter's reset must
// not read as hits (or as a fault), nor the hits before it be credited to
// requests after it. A step with no reading fails too: a window in which
// no request finished says the test's load did not reach the engine.
func (r *scenarioResult) readsZeroAfter(t *testing.T, from time.Duration) {
	t.Helper()
	steps := 0
	for _, s := range r.steps {
		if s.at < from {
			continue
		}
		steps++
		if s.efficiency != 0 { // NaN included
			r.errorf(t, "efficiency %s at %v (the efficiency itself %s), with the cache off since %v: want 0",
				num(s.efficiency), s.at, num(s.effAbs), r.changeAt)
			return
		}
	}
	t.Logf("efficiency 0 at all %d steps from %v", steps, from)
	if steps == 0 {
		r.errorf(t, "no step from %v: the recording ended before it", from)
	}
}

// mostlyLowerBound: once a window has passed, the effective capacity was
// measured and read as a lower bound at 90 % or more of the evaluations.
func (r *scenarioResult) mostlyLowerBound(t *testing.T) {
	t.Helper()
	var n, bound int
	for _, s := range r.steps {
		if s.at < rateWindow || math.IsNaN(s.lowerBound) {
			continue
		}
		n++
		if s.lowerBound == 1 {
			bound++
		}
	}
	t.Logf("effective capacity a lower bound at %d of %d evaluations", bound, n)
	if n == 0 || float64(bound) < 0.9*float64(n) {
		r.errorf(t, "effective capacity a lower bound at %d of %d evaluations, want 90 %% or more", bound, n)
	}
}

// efficiencyAbsent: a target that reports nothing has no efficiency.
func (r *scenarioResult) efficiencyAbsent(t *testing.T) {
	t.Helper()
	for _, s := range r.steps {
		if !math.IsNaN(s.efficiency) {
			r.errorf(t, "efficiency %.3f at %v, want absent for a target that reports no cached tokens", s.efficiency, s.at)
			return
		}
	}
}

// whatIf replays a recorded signal against other thresholds of an alert
// (same for duration; the alerts' guards, a theoretical hit rate above
// 0.05, held throughout these runs) and says when the alert would have
// gone pending and firing, from the change: numbers for calibrating a
// threshold without editing the rules.
func (r *scenarioResult) whatIf(t *testing.T, w whatIfSignal) {
	t.Helper()
	var b strings.Builder
	for _, thr := range w.thresholds {
		pending, firing := time.Duration(-1), time.Duration(-1)
		start := time.Duration(-1)
		for _, s := range r.steps {
			v := w.value(s)
			if math.IsNaN(v) || (w.below && v >= thr) || (!w.below && v <= thr) {
				start = -1
				continue
			}
			if start < 0 {
				start = s.at
				if pending < 0 {
					pending = s.at
				}
			}
			if firing < 0 && s.at-start >= w.hold {
				firing = s.at
			}
		}
		op := ">"
		if w.below {
			op = "<"
		}
		fmt.Fprintf(&b, "\n  %s %.2f: first pending %s, first firing %s", op, thr, r.since(pending), r.since(firing))
	}
	t.Logf("%s at other thresholds (for %v; times from the change):%s", w.alert, w.hold, b.String())
}

// whatIfSignal is an alert's recorded signal and the thresholds to try.
type whatIfSignal struct {
	alert      string
	value      func(ruleStep) float64
	below      bool // the alert fires below the threshold
	hold       time.Duration
	thresholds []float64
}

func (r *scenarioResult) efficiencyWhatIf() whatIfSignal {
	return whatIfSignal{alert: hitRegression, value: func(s ruleStep) float64 { return s.efficiency }, below: true,
		hold: r.hitHold, thresholds: []float64{0.7, 0.75, 0.8, 0.85, 0.9}}
}

func (r *scenarioResult) contrastWhatIf() whatIfSignal {
	return whatIfSignal{alert: contrastLost, value: func(s ruleStep) float64 { return s.contrast },
		hold: r.contrastHold, thresholds: []float64{0.4, 0.5, 0.6, 0.7, 0.8, 0.9}}
}

// since formats a rule time relative to the change ("never" for -1).
func (r *scenarioResult) since(at time.Duration) string {
	if at < 0 {
		return "never"
	}
	if r.changeAt < 0 {
		return at.String()
	}
	d := at - r.changeAt
	if d < 0 {
		return "-" + (-d).String()
	}
	return "+" + d.String()
}

// dipsAndRecovers: a transient (flush, engine restart) makes the efficiency
// dip below the lowest it read in the healthy minutes before the change,
// and it is back at or above the alert's threshold recoverWithin after the
// change, for the rest of the run. It logs the dip: the lowest efficiency
// after the change and how long it stayed below the threshold.
func (r *scenarioResult) dipsAndRecovers(t *testing.T) {
	t.Helper()
	if r.changeAt < 0 {
		t.Fatal("no change applied")
	}
	healthy := math.Inf(1)
	for _, s := range r.steps {
		if s.at >= rateWindow && s.at < r.changeAt && !math.IsNaN(s.efficiency) {
			healthy = min(healthy, s.efficiency)
		}
	}
	low := r.logDip(t)
	if !(low < healthy) {
		r.errorf(t, "no dip: the lowest efficiency after the change, %.3f, is not below the healthy minimum %.3f", low, healthy)
	}
	for _, s := range r.steps {
		if s.at >= r.changeAt+recoverWithin && (math.IsNaN(s.efficiency) || s.efficiency < r.effThreshold) {
			r.errorf(t, "efficiency %s at %v (%s), want at or above %g from %s on", num(s.efficiency), s.at, r.since(s.at),
				r.effThreshold, r.since(r.changeAt+recoverWithin))
		}
	}
}

// logDip reports the dip after the change: the lowest efficiency and how
// long it stayed below the alert's threshold; it returns the lowest.
func (r *scenarioResult) logDip(t *testing.T) float64 {
	t.Helper()
	low, lowAt := math.Inf(1), time.Duration(0)
	var below time.Duration
	var firstBelow, lastBelow time.Duration = -1, -1
	for _, s := range r.steps {
		if s.at < r.changeAt || math.IsNaN(s.efficiency) {
			continue
		}
		if s.efficiency < low {
			low, lowAt = s.efficiency, s.at
		}
		if s.efficiency < r.effThreshold {
			below += r.interval
			if firstBelow < 0 {
				firstBelow = s.at
			}
			lastBelow = s.at
		}
	}
	t.Logf("change at %v: minimum efficiency %.3f at %v; below %g for %v (from %v to %v)",
		r.changeAt, low, lowAt, r.effThreshold, below, firstBelow, lastBelow)
	return low
}

// logContrast reports the TTFT contrast's median before and after the
// change (or over the two halves of a run without one).
func (r *scenarioResult) logContrast(t *testing.T) {
	t.Helper()
	before, after := r.contrastAround()
	split := r.split()
	t.Logf("TTFT contrast (alert above %g): median %.3f up to %v, %.3f from %v",
		r.contrastThreshold, before, split, after, split+rateWindow)
}

// contrastAround is the TTFT contrast's median up to the change, and from
// a window past it on (NaN where there is none).
func (r *scenarioResult) contrastAround() (before, after float64) {
	return r.medianAround(func(s ruleStep) float64 { return s.contrast })
}

// medianAround is a signal's median up to the change, and from a rate
// window past it on (NaN where there is none).
func (r *scenarioResult) medianAround(value func(ruleStep) float64) (before, after float64) {
	before, after, _, _ = r.medianAroundSettled(value, rateWindow)
	return before, after
}

// split is the change's rule time, or alertChangeAt without one.
func (r *scenarioResult) split() time.Duration {
	if r.changeAt < 0 {
		return alertChangeAt
	}
	return r.changeAt
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// logTimeline prints one line per rule-minute.
func (r *scenarioResult) logTimeline(t *testing.T) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "rule time  eff/base  capacity/base  token cost  %s  %s", hitRegression, contrastLost)
	if r.changeAt >= 0 {
		fmt.Fprintf(&b, "   (change at %v)", r.changeAt)
	}
	for _, s := range r.steps {
		if s.at%time.Minute != 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%8v  %8s  %13s  %10s  %-24s  %s", s.at, num(s.efficiency), num(s.capacity), num(s.contrast),
			s.state(hitRegression), s.state(contrastLost))
	}
	t.Log(b.String())
}

func num(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}

// scenarioEngine is an emulated engine of the scenarios: its dialect,
// emulator flags, and the POST /emulator/cache body that halves its cache.
type scenarioEngine struct {
	name, dialect string
	flags         []string
	halve         string
}

// healthyOnly: an engine left alone for healthySpan (up after startAfter):
// no cache alert may fire. The hit-regression alert may go pending for a
// step or two: on llama.cpp, which is no LRU, the effective capacity of a
// healthy engine dipped to 0.70 of its baseline for one reading.
func healthyOnly(name string, eng scenarioEngine, startAfter time.Duration) alertScenario {
	return alertScenario{name: name, dialect: eng.dialect, emulate: engineFlags(eng), startAfter: startAfter, span: healthySpan,
		check: func(t *testing.T, r *scenarioResult) {
			r.neverFiring(t, hitRegression)
			r.neverFiring(t, contrastLost)
			r.neverActive(t, contrastLost)
			r.neverFiring(t, smallerThanConfigured)
			r.neverActiveAfter(t, smallerThanConfigured, rateWindow)
			r.whatIf(t, r.efficiencyWhatIf())
		}}
}

// pages: the engine's cache changes at alertChangeAt by the body of a
// POST /emulator/cache; the hit-regression alert must page within
// pageWithin.
func pages(name string, eng scenarioEngine, change string) alertScenario {
	return alertScenario{name: name, dialect: eng.dialect, emulate: engineFlags(eng), change: change,
		span: alertChangeAt + pageWithin + 2*time.Minute,
		check: func(t *testing.T, r *scenarioResult) {
			r.firesAfterChange(t, hitRegression)
			r.neverActive(t, contrastLost)
			r.whatIf(t, r.efficiencyWhatIf())
		}}
}

func engineFlags(eng scenarioEngine) []string {
	return append([]string{"--engine", eng.dialect}, eng.flags...)
}

// medianAroundSettled is a signal's median, and how many steps it has, up
// to the change and from settle past it on: for a signal whose own window
// (settle, in rule time) must first hold only what followed the change.
func (r *scenarioResult) medianAroundSettled(value func(ruleStep) float64, settle time.Duration) (before, after float64, nBefore, nAfter int) {
	split := r.split()
	var b, a []float64
	for _, s := range r.steps {
		v := value(s)
		switch {
		case math.IsNaN(v):
		case s.at <= split:
			b = append(b, v)
		case s.at >= split+settle:
			a = append(a, v)
		}
	}
	return median(b), median(a), len(b), len(a)
}
