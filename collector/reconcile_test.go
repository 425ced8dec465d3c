package collector

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/servedcache"
	"github.com/kvload-exporter/kvload-exporter/servedcache/servedcachetest"
)

// reconcileStep is what happens between two reads: requests finish, then
// the engine's counters are read.
type reconcileStep struct {
	requests []servedcachetest.Request
	read     engine.ServerCounts
}

// hit is n requests of 1000 prompt tokens, cached of them cached (usage)
// and theoretical in the model.
func hit(n, cached, theoretical int) []servedcachetest.Request {
	out := make([]servedcachetest.Request, n)
	for i := range out {
		out[i] = servedcachetest.Request{Prompt: 1000, Cached: cached, CachedKnown: true, Theoretical: theoretical}
	}
	return out
}

// engineRead is a read whose counters rose by cached and prompt tokens.
func engineRead(cached, prompt float64) engine.ServerCounts {
	return engine.ServerCounts{Cached: cached, Prompt: prompt, PromptKnown: true}
}

var baseline = engine.ServerCounts{PromptKnown: true, Baseline: true}

// TestReconcileStateSeries: one state series at 1, the share where the
// engine counted prompts, and the ratios only in the state compared
// (servedcache works the figures out).
func TestReconcileStateSeries(t *testing.T) {
	tests := []struct {
		name  string
		steps []reconcileStep
		want  ReconcileState
		// Ratios wanted; 0: absent.
		share, engineOverUsage, usageOverModel float64
	}{
		{name: "no read yet", want: ReconcileNoEngineCounter},
		{name: "healthy", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 500), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 0.8},
		{name: "a sharded replica", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 400), read: engineRead(8000, 20000)}},
			want: ReconcileSharedEngine, share: 0.5},
		{name: "a quieter engine's page", steps: []reconcileStep{{read: baseline}, {requests: hit(12, 400, 400), read: engineRead(800, 2000)}},
			want: ReconcileEngineUndercounted, share: 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := New(reg)
			now := time.Unix(1_700_000_000, 0)
			c.now = func() time.Time { return now }
			c.Reconcile().Start("e")
			for _, s := range tt.steps {
				now = now.Add(5 * time.Second)
				for _, q := range s.requests {
					c.Finished(q.Result("e", now))
				}
				c.Reconcile().AddEngineRead("e", s.read)
			}
			m := testutil.Gather(t, reg)
			for _, s := range servedcache.ReconcileStates {
				want := 0.0
				if s == tt.want {
					want = 1
				}
				if v, n := m.Value("kvload_cache_reconcile_state", "target", "e", "state", string(s)); v != want || n != 1 {
					t.Errorf("state %s: %v (%d series), want %v", s, v, n, want)
				}
			}
			for _, g := range []struct {
				name string
				want float64
			}{{"kvload_cache_reconcile_canary_share", tt.share}, {"kvload_cache_reconcile_engine_over_usage_ratio", tt.engineOverUsage},
				{"kvload_cache_reconcile_usage_over_model_ratio", tt.usageOverModel}, {"kvload_cache_reconcile_engine_over_model_ratio", tt.usageOverModel}} {
				got, n := m.Value(g.name, "target", "e")
				switch {
				case g.want == 0 && n != 0:
					t.Errorf("%s = %v, want it absent", g.name, got)
				case g.want != 0 && (n != 1 || math.Abs(got-g.want) > 1e-9):
					t.Errorf("%s = %v (%d series), want %v", g.name, got, n, g.want)
				}
			}
		})
	}
}

// TestReconcileCounters: the counters add up every read after the
// baseline, on the engine's and the responses' side alike (the requests
// finished since the read before), so that the recording rules can sum
// replicas; failed reads are counted by reason,
// and a stopped target's series go.
func TestReconcileCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	now := time.Unix(1_700_000_000, 0)
	c.now = func() time.Time { return now }
	finish := func(q servedcachetest.Request, target string) {
		now = now.Add(time.Second)
		c.Finished(q.Result(target, now))
	}
	c.Reconcile().Start("e")
	finish(servedcachetest.Request{Prompt: 700, Cached: 300, CachedKnown: true, Theoretical: -1}, "e")
	c.Reconcile().AddEngineRead("e", baseline)
	finish(servedcachetest.Request{Prompt: 1000, Cached: 400, CachedKnown: true, Theoretical: -1}, "e")
	finish(servedcachetest.Request{Prompt: 500, Theoretical: -1}, "e")
	c.Reconcile().EngineReadFailed("e", engine.ServerErrorTimeout)
	finish(servedcachetest.Request{Prompt: 1000, Cached: 600, CachedKnown: true, Theoretical: -1}, "e")
	c.Reconcile().AddEngineRead("e", engineRead(1200, 2600))
	finish(servedcachetest.Request{Prompt: 1000, Cached: 999, CachedKnown: true, Theoretical: -1}, "other")
	// Finished after the last read: counted at the next, beside the
	// engine's increase.
	finish(servedcachetest.Request{Prompt: 800, Cached: 800, CachedKnown: true, Theoretical: -1}, "e")
	m := testutil.Gather(t, reg)
	for name, want := range map[string]float64{
		"kvload_cache_reconcile_engine_cached_tokens_total": 1200,
		"kvload_cache_reconcile_engine_prompt_tokens_total": 2600,
		"kvload_cache_reconcile_canary_prompt_tokens_total": 2500,
		"kvload_cache_reconcile_usage_prompt_tokens_total":  2000,
		"kvload_cache_reconcile_usage_cached_tokens_total":  1000,
	} {
		if got, n := m.Value(name, "target", "e"); got != want || n != 1 {
			t.Errorf("%s = %v (%d series), want %v", name, got, n, want)
		}
	}
	if got, _ := m.Value("kvload_cache_reconcile_errors_total", "target", "e", "reason", "timeout"); got != 1 {
		t.Errorf("timeouts counted %v, want 1", got)
	}
	if series := reconcileSeries(m, "other"); len(series) != 0 {
		t.Errorf("a target not reconciled has series %v", series)
	}
	c.Reconcile().Stop("e")
	if series := reconcileSeries(testutil.Gather(t, reg), "e"); len(series) != 0 {
		t.Errorf("after StopReconcile: %v", series)
	}
	c.Reconcile().AddEngineRead("e", engineRead(1, 1)) // a read still under way: ignored
	if series := reconcileSeries(testutil.Gather(t, reg), "e"); len(series) != 0 {
		t.Errorf("a late read made %v", series)
	}
}

// reconcileSeries are the reconciliation's series of target.
func reconcileSeries(m testutil.Families, target string) []string {
	var out []string
	for _, s := range m.SeriesWith("target", target) {
		if strings.HasPrefix(s, "kvload_cache_reconcile_") {
			out = append(out, s)
		}
	}
	return out
}

// TestReconcileCountersRefuseImplausibleReads: one NaN, +Inf or 1e300
// read of the engine's prompt-token counter adds nothing to its counter,
// which goes on counting the good reads after it, and is counted as
// refused by reason.
func TestReconcileCountersRefuseImplausibleReads(t *testing.T) {
	for _, tt := range []struct {
		bad    float64
		reason engine.ServerMetricsErrorReason
	}{{math.NaN(), engine.ServerErrorNotFinite}, {math.Inf(1), engine.ServerErrorNotFinite}, {1e300, engine.ServerErrorTooLarge}} {
		t.Run(fmt.Sprint(tt.bad), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := New(reg)
			now := time.Unix(1_700_000_000, 0)
			c.now = func() time.Time { return now }
			c.Reconcile().Start("e")
			c.Reconcile().AddEngineRead("e", baseline)
			now = now.Add(5 * time.Second)
			c.Reconcile().AddEngineRead("e", engineRead(400, tt.bad))
			now = now.Add(5 * time.Second)
			c.Reconcile().AddEngineRead("e", engineRead(400, 1000))
			m := testutil.Gather(t, reg)
			if got, _ := m.Value("kvload_cache_reconcile_engine_prompt_tokens_total", "target", "e"); got != 1000 {
				t.Errorf("engine prompt tokens %v, want 1000: the good read only", got)
			}
			if got, _ := m.Value("kvload_cache_reconcile_engine_cached_tokens_total", "target", "e"); got != 400 {
				t.Errorf("engine cached tokens %v, want 400: the good read only", got)
			}
			if got, _ := m.Value("kvload_cache_reconcile_errors_total", "target", "e", "reason", string(tt.reason)); got != 1 {
				t.Errorf("refused reads counted under %s: %v, want 1", tt.reason, got)
			}
		})
	}
}

// TestReconcileRecomputedCounter: the engine's recomputed tokens have a
// counter of their own, absent for a target whose engine does not count
// them, summed over the reads of one that does, and gone with the target.
func TestReconcileRecomputedCounter(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	const name = "kvload_cache_reconcile_engine_recomputed_tokens_total"
	withRecomputed := func(r engine.ServerCounts, n float64) engine.ServerCounts {
		r.Recomputed, r.RecomputedKnown = n, true
		return r
	}
	for _, target := range []string{"counts", "silent"} {
		c.Reconcile().Start(target)
	}
	c.Reconcile().AddEngineRead("counts", withRecomputed(baseline, 0))
	c.Reconcile().AddEngineRead("silent", baseline)
	for _, n := range []float64{3, 4} {
		c.Reconcile().AddEngineRead("counts", withRecomputed(engineRead(100, 1000), n))
		c.Reconcile().AddEngineRead("silent", engineRead(100, 1000))
	}
	m := testutil.Gather(t, reg)
	if got, n := m.Value(name, "target", "counts"); got != 7 || n != 1 {
		t.Errorf("%s of the engine that counts them = %v (%d series), want 7", name, got, n)
	}
	if _, n := m.Value(name, "target", "silent"); n != 0 {
		t.Errorf("%s of an engine that does not count them: %d series, want none", name, n)
	}
	c.Reconcile().Stop("counts")
	if _, n := testutil.Gather(t, reg).Value(name, "target", "counts"); n != 0 {
		t.Errorf("%s after Stop: %d series", name, n)
	}
}
