package collector

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// costRun feeds the collector n successful requests of a conversation-like
// workload, one a second from t0, timed by an engine whose prefill costs
// 50 µs per computed token (every prompt token when the cache is off).
// queue is added to each TTFT; with prefill the engine also reports its
// prefill time, which leaves the queue out.
func costRun(c *Collector, t0 time.Time, n int, cacheOn, prefill bool, queue func(i int) time.Duration) {
	for i := range n {
		uncached := 512 * (1 + i%7)
		cached := 0
		if i%3 != 0 {
			cached = 512 * (1 + (i*5)%11)
		}
		computed := uncached
		if !cacheOn {
			computed += cached
		}
		pre := 2*time.Millisecond + time.Duration(computed)*50*time.Microsecond
		sent := t0.Add(time.Duration(i) * time.Second)
		r := &replay.Result{
			Workload: "w", Target: "t", Scheduled: sent,
			Response: openai.Response{Sent: sent, FirstToken: sent.Add(pre + queue(i)), LastToken: sent.Add(pre + queue(i) + time.Millisecond),
				Outcome: openai.OutcomeSuccess, OutputTokens: 2, PrefillTime: pre, PrefillKnown: prefill},
			TraceInputLength: uncached + cached, TheoreticalCachedTokens: cached, TheoreticalKnown: true,
		}
		c.now = func() time.Time { return sent }
		c.Sent(r.Workload, r.Target, r.Scheduled, r.Sent)
		c.Finished(r)
	}
}

func TestCollectorCachedTokenCost(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	noQueue := func(int) time.Duration { return 0 }
	// A saturated engine: waits of 0 to 19 s in a queue, whatever the
	// request.
	saturated := func(i int) time.Duration { return time.Duration((i*7919)%20000) * time.Millisecond }
	tests := []struct {
		name    string
		cacheOn bool
		prefill bool
		queue   func(int) time.Duration
		state   string
		timed   float64
		ratio   float64 // ±0.05, when decided
	}{
		{"working, TTFT", true, false, noQueue, "decided", 0, 0},
		{"broken, TTFT", false, false, noQueue, "decided", 0, 1},
		{"working, saturated, prefill time", true, true, saturated, "decided", 1, 0},
		{"broken, saturated, prefill time", false, true, saturated, "decided", 1, 1},
		{"working, saturated, TTFT", true, false, saturated, "no_uncached_cost", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			c := New(reg)
			c.Start("w", "t")
			m := testutil.Gather(t, reg)
			if m.Sum("kvload_cache_cost_fit_state", "state", "too_few_requests") != 1 || m.Sum("kvload_cache_cost_fit_requests") != 0 {
				t.Fatalf("before any request: state %v, %v requests",
					m.SeriesWith("state", "too_few_requests"), m.Sum("kvload_cache_cost_fit_requests"))
			}
			costRun(c, t0, 200, tt.cacheOn, tt.prefill, tt.queue)
			m = testutil.Gather(t, reg)
			ratio, n := m.Value("kvload_cache_cached_token_cost_ratio")
			t.Logf("ratio %.4f ± %.4f (%d series), %.3g s per uncached token", ratio, m.Sum("kvload_cache_cached_token_cost_ratio_stderr"), n,
				m.Sum("kvload_cache_uncached_token_cost_seconds"))
			if got := m.Sum("kvload_cache_cost_fit_state", "state", tt.state); got != 1 {
				t.Fatalf("state %s is %v", tt.state, got)
			}
			if got := m.Sum("kvload_cache_cost_fit_state"); got != 1 {
				t.Errorf("the states sum to %v", got)
			}
			if got := m.Sum("kvload_cache_cost_fit_prefill_timed"); got != tt.timed {
				t.Errorf("prefill timed %v, want %v", got, tt.timed)
			}
			if got := m.Sum("kvload_cache_cost_fit_requests"); got != 200 {
				t.Errorf("%v requests", got)
			}
			if tt.state != "decided" {
				if n != 0 {
					t.Errorf("undecided, yet a ratio of %v", ratio)
				}
				return
			}
			if n != 1 || math.Abs(ratio-tt.ratio) > 0.05 {
				t.Errorf("ratio %v (%d series), want %v", ratio, n, tt.ratio)
			}
			c.now = func() time.Time { return t0.Add(time.Hour) }
			if m := testutil.Gather(t, reg); m.Sum("kvload_cache_cost_fit_requests") != 0 || m.Sum("kvload_cache_cost_fit_state", "state", "too_few_requests") != 1 {
				t.Errorf("an hour later: %v requests", m.Sum("kvload_cache_cost_fit_requests"))
			}
			c.Forget("w", "t")
			if m := testutil.Gather(t, reg); len(m.SeriesWith("target", "t")) != 0 {
				t.Errorf("forgotten, yet %v", m.SeriesWith("target", "t"))
			}
		})
	}
}

// TestCollectorCostConcurrent: scrapes while requests finish and pairs
// come and go (run with -race).
func TestCollectorCostConcurrent(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	c.Start("w", "t")
	t0 := time.Now()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range 300 {
			sent := t0.Add(time.Duration(i) * time.Millisecond)
			c.Finished(&replay.Result{Workload: "w", Target: "t", Scheduled: sent,
				Response: openai.Response{Sent: sent, FirstToken: sent.Add(time.Duration(1+i%9) * time.Millisecond), LastToken: sent.Add(10 * time.Millisecond),
					Outcome: openai.OutcomeSuccess, OutputTokens: 2},
				TraceInputLength: 512 * (1 + i%7), TheoreticalCachedTokens: 256 * (i % 5), TheoreticalKnown: true})
			if i%100 == 99 {
				c.Forget("w", "t")
				c.Start("w", "t")
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range 50 {
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
}
