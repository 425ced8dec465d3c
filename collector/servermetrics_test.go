package collector

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvload-exporter/kvload-exporter/cachetruth"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// TestServerMetricsAttribution checks that a scrape's increase is shared by
// the workloads in proportion to the prompt tokens they sent, that usage
// cached tokens are ignored for such a target, and that hits while nothing
// was sent are not counted.
func TestServerMetricsAttribution(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	tr := cachetruth.New(c)
	c.SetTarget("srv", "m", "chat", "vllm")
	tr.SetTarget("srv", "vllm", "server_metrics")
	var value atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:prefix_cache_hits_total %d\n", value.Load())
	}))
	defer srv.Close()
	s := &engine.ServerScraper{Target: "srv", URL: srv.URL, Dialect: "vllm", Client: srv.Client(), Interval: time.Hour}

	value.Store(5000)
	if err := s.ScrapeOnce(context.Background(), tr); err != nil { // baseline
		t.Fatal(err)
	}
	for _, r := range []struct {
		w     string
		trace int
	}{{"a", 3000}, {"b", 1000}} {
		tr.Finished(&replay.Result{
			Response: openai.Response{Outcome: openai.OutcomeSuccess, CachedTokens: 999, CachedKnown: true}, Workload: r.w, Target: "srv",
			TraceInputLength: r.trace})
	}
	value.Store(5800)
	if err := s.ScrapeOnce(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	value.Store(9000) // other traffic: nothing of ours was sent
	if err := s.ScrapeOnce(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(c.cachedTokens.WithLabelValues("a", "srv")); got != 600 {
		t.Errorf("workload a: %v cached tokens, want 600", got)
	}
	if got := testutil.ToFloat64(c.cachedTokens.WithLabelValues("b", "srv")); got != 200 {
		t.Errorf("workload b: %v cached tokens, want 200", got)
	}
}

// TestServerMetricsShare: with observed: server_metrics, a replica takes
// only its part of the engine's cached tokens (its share of the prompt
// tokens the engine counted, where the engine counts them), and the
// efficiency's observed side only the part of requests whose theoretical
// tokens are known.
func TestServerMetricsShare(t *testing.T) {
	type finish struct {
		w         string
		prompt    int
		theoKnown bool
	}
	type step struct {
		finished []finish
		counts   engine.ServerCounts
	}
	known := func(w string, p int) finish { return finish{w: w, prompt: p, theoKnown: true} }
	tests := []struct {
		name  string
		steps []step
		// per workload: kvload_cached_prompt_tokens_total and
		// kvload_cache_reported_cached_prompt_tokens_total
		wantCached, wantReported map[string]float64
	}{
		{"the engine's only client takes every hit", []step{
			{[]finish{known("a", 3000), known("b", 1000)}, engine.ServerCounts{Cached: 800, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 600, "b": 200}, map[string]float64{"a": 600, "b": 200}},
		{"one of two replicas sharded against one engine takes half", []step{
			{[]finish{known("a", 2000)}, engine.ServerCounts{Cached: 1000, Prompt: 4000, PromptKnown: true}},
			{[]finish{known("a", 2000)}, engine.ServerCounts{Cached: 1200, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 1100}, map[string]float64{"a": 1100}},
		{"requests of unknown theoretical tokens stay off the efficiency", []step{
			{[]finish{known("a", 1000), {w: "a", prompt: 3000}}, engine.ServerCounts{Cached: 2000, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 2000}, map[string]float64{"a": 500}},
		{"a request the engine counted before it finished is credited later", []step{
			{[]finish{known("a", 1000)}, engine.ServerCounts{Cached: 900, Prompt: 2000, PromptKnown: true}},
			{[]finish{known("a", 1000)}, engine.ServerCounts{PromptKnown: true}},
		}, map[string]float64{"a": 900}, map[string]float64{"a": 900}},
		// Within the window, the replica's share of the prompt tokens is
		// its share of the hits, whoever hit more.
		{"other traffic in the window shares the hits by prompt tokens", []step{
			{[]finish{known("a", 1000)}, engine.ServerCounts{Cached: 500, Prompt: 1000, PromptKnown: true}},
			{nil, engine.ServerCounts{Cached: 700, Prompt: 1000, PromptKnown: true}},
		}, map[string]float64{"a": 600}, map[string]float64{"a": 600}},
		// Without a prompt counter the share cannot be known: the replica
		// takes every hit of the interval (the documented limitation), but
		// still leaves unknown theoretical tokens off the efficiency.
		{"without a prompt counter, every hit of the interval", []step{
			{[]finish{known("a", 1000), {w: "a", prompt: 1000}}, engine.ServerCounts{Cached: 1000}},
		}, map[string]float64{"a": 1000}, map[string]float64{"a": 500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(prometheus.NewRegistry())
			tr := cachetruth.New(c)
			c.SetTarget("srv", "m", "chat", "vllm")
			tr.SetTarget("srv", "vllm", "server_metrics")
			for _, st := range tt.steps {
				for _, f := range st.finished {
					tr.Sent(f.w, "srv", time.Time{}, time.Time{})
					tr.Finished(&replay.Result{
						Response: openai.Response{Outcome: openai.OutcomeSuccess, PromptTokens: f.prompt, PromptKnown: true}, Workload: f.w, Target: "srv",
						TraceInputLength: f.prompt - 10, TheoreticalKnown: f.theoKnown})
				}
				tr.AddServerCounts("srv", st.counts)
			}
			for w, want := range tt.wantCached {
				if got := testutil.ToFloat64(c.cachedTokens.WithLabelValues(w, "srv")); math.Abs(got-want) > 1e-9 {
					t.Errorf("workload %s: cached tokens %v, want %v", w, got, want)
				}
			}
			for w, want := range tt.wantReported {
				if got := testutil.ToFloat64(c.reportedCached.WithLabelValues(w, "srv")); math.Abs(got-want) > 1e-9 {
					t.Errorf("workload %s: reported cached tokens %v, want %v", w, got, want)
				}
			}
		})
	}
}
