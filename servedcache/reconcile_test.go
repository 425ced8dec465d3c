package servedcache

import (
	"math"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/servedcache/servedcachetest"
)

// reconcileStep is what happens between two reads: requests finish, then
// the engine's counters are read (or fail to be).
type reconcileStep struct {
	requests []servedcachetest.Request
	read     engine.ServerCounts
	fail     engine.ServerMetricsErrorReason // the read failed
	after    time.Duration                   // since the step before
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

// TestReconcileStates: the state of a window of reads, and the ratios
// exported in the state compared only.
func TestReconcileStates(t *testing.T) {
	tests := []struct {
		name  string
		steps []reconcileStep
		want  ReconcileState
		// Ratios wanted where compared; 0: absent.
		share, engineOverUsage, usageOverModel, engineOverModel float64
	}{
		{name: "no read yet", steps: nil, want: ReconcileNoEngineCounter},
		{name: "every read failed", steps: []reconcileStep{{requests: hit(4, 400, 400), fail: engine.ServerErrorScrape}},
			want: ReconcileNoEngineCounter},
		{name: "healthy", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 500), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 0.8, engineOverModel: 0.8},
		{name: "hits counted twice", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 400), read: engineRead(8000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 2, usageOverModel: 1, engineOverModel: 2},
		// What the canary counted before the baseline is on neither side,
		// nor what it sent before it (the engine counted its prompt then).
		{name: "before the baseline", steps: []reconcileStep{{requests: hit(50, 0, 0), read: baseline},
			{requests: append(hit(10, 400, 400), servedcachetest.Request{Prompt: 3000, CachedKnown: true, SentAgo: 6 * time.Second}), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 1, engineOverModel: 1},
		// A failed read in between: the next good one spans its time on
		// both sides.
		{name: "a failed read between", steps: []reconcileStep{{read: baseline}, {requests: hit(5, 400, 400), fail: engine.ServerErrorTimeout},
			{requests: hit(5, 400, 400), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 1, engineOverModel: 1},
		// The engine counted the prefill of a failed request too: 1000 of
		// 11000 prompt tokens are not the responses', share 0.91.
		{name: "other traffic", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 400), read: engineRead(4400, 11000)}},
			want: ReconcileSharedEngine, share: 10.0 / 11},
		{name: "a sharded replica", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 400), read: engineRead(8000, 20000)}},
			want: ReconcileSharedEngine, share: 0.5},
		// More prompt tokens sent than the engine counted: not a
		// comparison, whatever the hit rates say.
		{name: "the engine counts fewer prompts", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 400), read: engineRead(4000, 5000)}},
			want: ReconcileEngineUndercounted, share: 2},
		{name: "a quieter engine's page", steps: []reconcileStep{{read: baseline}, {requests: hit(12, 400, 400), read: engineRead(800, 2000)}},
			want: ReconcileEngineUndercounted, share: 6},
		{name: "5 % more sent than counted: noise", steps: []reconcileStep{{read: baseline}, {requests: hit(21, 400, 400), read: engineRead(8000, 20000)}},
			want: ReconcileCompared, share: 1.05, engineOverUsage: 1, usageOverModel: 1, engineOverModel: 1},
		// An implausible read counts on neither side: the next good one
		// spans its time.
		{name: "a NaN prompt count between", steps: []reconcileStep{{read: baseline}, {requests: hit(5, 400, 400), read: engineRead(2000, math.NaN())},
			{requests: hit(5, 400, 400), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 1, engineOverModel: 1},
		{name: "usage without cached tokens", steps: []reconcileStep{{read: baseline},
			{requests: []servedcachetest.Request{{Prompt: 1000, Theoretical: 400}}, read: engineRead(400, 1000)}},
			want: ReconcileNotReported, share: 1},
		{name: "few hits", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 40, 40), read: engineRead(400, 10000)}},
			want: ReconcileTooFewHits, share: 1},
		{name: "model with nothing to share", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 10), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1},
		{name: "no query counter", steps: []reconcileStep{{read: engine.ServerCounts{Baseline: true}}, {requests: hit(10, 400, 400), read: engine.ServerCounts{Cached: 4000}}},
			want: ReconcileNoQueryCounter},
		{name: "idle", steps: []reconcileStep{{read: baseline}, {read: engineRead(0, 0)}}, want: ReconcileNothingCounted},
		{name: "another engine's page", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 400), read: engineRead(0, 0)}},
			want: ReconcileNothingCounted},
		// Failures do not count on the canary's side.
		{name: "failed requests", steps: []reconcileStep{{read: baseline},
			{requests: append(hit(10, 400, 400), servedcachetest.Request{Prompt: 5000, Failed: true}), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 1, engineOverModel: 1},
		// The first read seen is the baseline, though the scraper took its
		// own before (observed: server_metrics primes it).
		{name: "the first read seen", steps: []reconcileStep{{requests: hit(5, 400, 400), read: engineRead(2000, 5000)},
			{requests: hit(10, 400, 400), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 1, engineOverModel: 1},
		// An engine restart loses what the engine counted since the read
		// before: the read that finds it is a new baseline, on both sides.
		{name: "an engine restart", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 400), read: engineRead(4000, 10000)},
			{requests: hit(5, 400, 400), read: engine.ServerCounts{Cached: 0, Prompt: 2000, PromptKnown: true, Restarted: true}},
			{requests: hit(10, 100, 400), read: engineRead(1000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 0.625, engineOverModel: 0.625},
		// The window is the last 5 minutes: a double count of long ago is
		// gone.
		{name: "an old disagreement", steps: []reconcileStep{{read: baseline}, {requests: hit(10, 400, 400), read: engineRead(8000, 10000)},
			{after: 6 * time.Minute, requests: hit(10, 400, 400), read: engineRead(4000, 10000)}},
			want: ReconcileCompared, share: 1, engineOverUsage: 1, usageOverModel: 1, engineOverModel: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			r := NewReconciliation(func() time.Time { return now })
			r.Start("e")
			for _, s := range tt.steps {
				now = now.Add(5*time.Second + s.after)
				for _, q := range s.requests {
					r.Finished(q.Result("e", now))
				}
				if s.fail != "" {
					r.Failed("e", s.fail)
					continue
				}
				r.Read("e", s.read)
			}
			st := r.Status()[0]
			if st.State != tt.want {
				t.Fatalf("state %s, want %s; the figures: %+v", st.State, tt.want, st)
			}
			share := 0.0
			if st.ShareKnown {
				share = st.CanaryShare
			}
			for _, g := range []struct {
				name      string
				got, want float64
			}{{"canary share", share, tt.share}, {"engine over usage", st.EngineOverUsage, tt.engineOverUsage},
				{"usage over model", st.UsageOverModel, tt.usageOverModel}, {"engine over model", st.EngineOverModel, tt.engineOverModel}} {
				if math.Abs(g.got-g.want) > 1e-9 {
					t.Errorf("%s = %v, want %v", g.name, g.got, g.want)
				}
			}
		})
	}
}

// TestReconcileStatusWords: the landing page's verdicts.
func TestReconcileStatusWords(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := NewReconciliation(func() time.Time { return now })
	for _, tg := range []string{"good", "double"} {
		c.Start(tg)
		c.Read(tg, baseline)
	}
	now = now.Add(time.Second)
	for _, tg := range []string{"good", "double"} {
		for _, q := range hit(10, 400, 400) {
			c.Finished(q.Result(tg, now))
		}
	}
	c.Read("good", engineRead(4100, 10000))
	c.Read("double", engineRead(8000, 10000))
	st := c.Status()
	if len(st) != 2 || st[0].Target != "double" || st[1].Target != "good" {
		t.Fatalf("status %+v", st)
	}
	if d := st[0]; !d.Disagree || d.Reason != "the engine's metrics disagree with its responses: its counters read 2.00 × the hit rate its responses report (outside 0.80 to 1.25)" {
		t.Errorf("double counting: %+v", d)
	}
	if g := st[1]; g.Disagree || g.Reason != "the engine's counters agree with its responses (1.02)" {
		t.Errorf("healthy: %+v", g)
	}
}

// TestReconcileInFlight: a request counts in the read whose interval it
// was sent in, however late it finishes, and a read after the send of a
// request still in flight is left out of the figures until the request
// finishes, or has been in flight for over a minute.
func TestReconcileInFlight(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := NewReconciliation(func() time.Time { return now })
	state := func() ReconcileState { return c.Status()[0].State }
	send := func() time.Time {
		c.Sent("e")
		return now
	}
	finish := func(q servedcachetest.Request, sent time.Time) {
		q.SentAgo = now.Sub(sent)
		c.Finished(q.Result("e", now))
	}
	c.Start("e")
	c.Read("e", baseline)
	now = now.Add(time.Second)
	slow, quick := send(), send()
	now = now.Add(100 * time.Millisecond)
	finish(servedcachetest.Request{Prompt: 1000, Cached: 400, CachedKnown: true, Theoretical: 400}, quick)
	now = now.Add(4 * time.Second)
	c.Read("e", engineRead(800, 2000)) // both prompts, admitted
	if got := state(); got != ReconcileNothingCounted {
		t.Errorf("a read of a request still in flight: state %s, want %s (only the baseline counts)", got, ReconcileNothingCounted)
	}
	now = now.Add(2 * time.Second)
	finish(servedcachetest.Request{Prompt: 1000, Cached: 400, CachedKnown: true, Theoretical: 400}, slow)
	if got := state(); got != ReconcileCompared {
		t.Errorf("once it finished, after the read: state %s, want %s", got, ReconcileCompared)
	}
	if st := c.Status()[0]; st.CanaryShare != 1 || st.EngineOverUsage != 1 {
		t.Errorf("share %v, engine over usage %v; want 1 and 1", st.CanaryShare, st.EngineOverUsage)
	}
	// A request that never finishes holds the figures back a minute.
	send()
	now = now.Add(5 * time.Second)
	c.Read("e", engineRead(400, 1000))
	if got := state(); got != ReconcileCompared {
		t.Errorf("a read after a request in flight: state %s, want the last figures, %s", got, ReconcileCompared)
	}
	if st := c.Status()[0]; st.CanaryShare != 1 {
		t.Errorf("share %v with the read held back, want 1", st.CanaryShare)
	}
	now = now.Add(time.Minute)
	if st := c.Status()[0]; st.State != ReconcileSharedEngine || st.CanaryShare != 2000.0/3000 {
		t.Errorf("a minute on: %s with share %v, want %s with 2/3", st.State, st.CanaryShare, ReconcileSharedEngine)
	}
}

// TestReconcileFirstToken: a request counts in the read whose interval
// its first token came in, the engine having counted its prompt just
// before, whenever it was sent.
func TestReconcileFirstToken(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := NewReconciliation(func() time.Time { return now })
	c.Start("e")
	c.Read("e", baseline)
	now = now.Add(time.Second)
	sentA := now
	c.Sent("e")
	sentB := now
	c.Sent("e")
	now = now.Add(time.Second)
	firstA := now
	now = now.Add(3 * time.Second)
	c.Read("e", engineRead(400, 1000)) // A's prompt only: B waits in the engine's queue
	now = now.Add(time.Second)
	firstB := now
	for _, q := range []struct {
		sent, first time.Time
	}{{sentA, firstA}, {sentB, firstB}} {
		r := servedcachetest.Request{Prompt: 1000, Cached: 400, CachedKnown: true, Theoretical: 400}.Result("e", now)
		r.Sent, r.FirstToken = q.sent, q.first
		c.Finished(r)
	}
	st := c.Status()[0]
	if st.State != ReconcileCompared || st.CanaryShare != 1 || st.EngineOverUsage != 1 {
		t.Errorf("%s, share %v, engine over usage %v; want compared, 1 and 1 (B in the next read)", st.State, st.CanaryShare, st.EngineOverUsage)
	}
}

// TestReconcileRefusesImplausibleReads: a read whose prompt or cached
// increase is not finite, negative or beyond 2^53 is refused with its
// reason, and leaves the figures as they were.
func TestReconcileRefusesImplausibleReads(t *testing.T) {
	tests := []struct {
		name   string
		read   engine.ServerCounts
		reason engine.ServerMetricsErrorReason
	}{
		{"NaN prompt", engineRead(400, math.NaN()), engine.ServerErrorNotFinite},
		{"+Inf prompt", engineRead(400, math.Inf(1)), engine.ServerErrorNotFinite},
		{"1e300 prompt", engineRead(400, 1e300), engine.ServerErrorTooLarge},
		{"negative prompt", engineRead(400, -1), engine.ServerErrorNegative},
		{"NaN cached", engineRead(math.NaN(), 1000), engine.ServerErrorNotFinite},
		{"-Inf cached", engineRead(math.Inf(-1), 1000), engine.ServerErrorNotFinite},
		{"1e300 cached", engineRead(1e300, 1000), engine.ServerErrorTooLarge},
		{"a NaN baseline", engine.ServerCounts{Prompt: math.NaN(), PromptKnown: true, Baseline: true}, engine.ServerErrorNotFinite},
		{"plausible", engineRead(400, 1000), ""},
		{"a prompt count not exported is not read", engine.ServerCounts{Cached: 400, Prompt: math.NaN()}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			r := NewReconciliation(func() time.Time { return now })
			r.Start("e")
			if !tt.read.Baseline {
				r.Read("e", baseline)
			}
			now = now.Add(5 * time.Second)
			for _, q := range hit(1, 400, 400) {
				r.Finished(q.Result("e", now))
			}
			inc, reason := r.Read("e", tt.read)
			if reason != tt.reason {
				t.Fatalf("reason %q, want %q", reason, tt.reason)
			}
			if reason == "" {
				return
			}
			if inc != (ReadIncrease{}) {
				t.Errorf("a refused read added %+v", inc)
			}
			if st := r.Status()[0]; st.LastError != string(tt.reason) {
				t.Errorf("the landing page's last error %q, want %q", st.LastError, tt.reason)
			}
		})
	}
}

// TestReconcileRecomputed: the cached tokens an engine computed again,
// where it counts them, are a reason of their own: summed over the
// window's reads, named in the verdict, and on neither side of the hit
// rates. An implausible count of them refuses the read.
func TestReconcileRecomputed(t *testing.T) {
	recomputed := func(cached, prompt, again float64) engine.ServerCounts {
		c := engineRead(cached, prompt)
		c.Recomputed, c.RecomputedKnown = again, true
		return c
	}
	tests := []struct {
		name      string
		reads     []engine.ServerCounts
		want      float64
		known     bool
		reason    string
		refusedAt int // the read refused, 1-based; 0: none
	}{
		{name: "not counted", reads: []engine.ServerCounts{engineRead(2000, 5000), engineRead(2000, 5000)},
			reason: "the engine's counters agree with its responses (1.00)"},
		{name: "counted, none", reads: []engine.ServerCounts{recomputed(2000, 5000, 0), recomputed(2000, 5000, 0)}, known: true,
			reason: "the engine's counters agree with its responses (1.00)"},
		{name: "counted", reads: []engine.ServerCounts{recomputed(2000, 5000, 3), recomputed(2000, 5000, 4)}, want: 7, known: true,
			reason: "the engine's counters agree with its responses (1.00); recomputed: the engine found 7 more tokens in its cache and computed them again, counted on neither side"},
		{name: "not finite", reads: []engine.ServerCounts{recomputed(2000, 5000, 3), recomputed(2000, 5000, math.Inf(1))}, want: 3, known: true,
			reason: "the engine's counters agree with its responses (1.00); recomputed: the engine found 3 more tokens in its cache and computed them again, counted on neither side", refusedAt: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			r := NewReconciliation(func() time.Time { return now })
			r.Start("e")
			r.Read("e", baseline)
			var total float64
			for i, read := range tt.reads {
				now = now.Add(5 * time.Second)
				for _, q := range hit(5, 400, 400) {
					r.Finished(q.Result("e", now))
				}
				inc, refused := r.Read("e", read)
				if (refused != "") != (i+1 == tt.refusedAt) {
					t.Errorf("read %d refused %q", i+1, refused)
				}
				if inc.RecomputedKnown != (read.RecomputedKnown && refused == "") {
					t.Errorf("read %d: increase %+v", i+1, inc)
				}
				total += inc.EngineRecomputed
			}
			st := r.Status()[0]
			if st.EngineRecomputed != tt.want || st.RecomputedKnown != tt.known || total != tt.want {
				t.Errorf("recomputed %v (known %v), %v added to the counter; want %v (%v)", st.EngineRecomputed, st.RecomputedKnown, total, tt.want, tt.known)
			}
			if st.Reason != tt.reason {
				t.Errorf("reason %q, want %q", st.Reason, tt.reason)
			}
		})
	}
}
