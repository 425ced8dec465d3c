package collector

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

func TestServerScraperDialects(t *testing.T) {
	tests := []struct {
		dialect     string
		body        string
		want        float64
		wantPrompt  float64
		promptKnown bool
	}{
		{"vllm", "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 100\nvllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 28\n" +
			"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 400\nvllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 100\n", 128, 500, true},
		{"vllm hits only", "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 5\n", 5, 0, false},
		{"sglang", "# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total{model_name=\"m\"} 7\n# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name=\"m\"} 70\n", 7, 70, true},
		{"trtllm", "# TYPE trtllm_prompt_cached_tokens_total counter\ntrtllm_prompt_cached_tokens_total 9\n", 9, 0, false},
		// llama-server's prompt_tokens_total leaves the cached tokens out.
		{"llamacpp", "# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total 1234\n# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 766\n", 1234, 2000, true},
		{"dynamo", "# TYPE dynamo_frontend_cached_tokens histogram\ndynamo_frontend_cached_tokens_bucket{model=\"m\",le=\"+Inf\"} 3\ndynamo_frontend_cached_tokens_sum{model=\"m\"} 4096\ndynamo_frontend_cached_tokens_count{model=\"m\"} 3\n", 4096, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.dialect, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, tt.body)
			}))
			defer srv.Close()
			dialect, _, _ := strings.Cut(tt.dialect, " ")
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: replay.Dialect(dialect), Client: srv.Client()}
			got, err := s.read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got.cached != tt.want || got.prompt != tt.wantPrompt || got.promptKnown != tt.promptKnown {
				t.Errorf("cached %v, prompt %v (known %v); want %v, %v (%v)", got.cached, got.prompt, got.promptKnown, tt.want, tt.wantPrompt, tt.promptKnown)
			}
		})
	}
}

func TestServerScraperMissingMetric(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE up gauge\nup 1\n")
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: "vllm", Client: srv.Client()}
	if _, err := s.read(context.Background()); err == nil || !strings.Contains(err.Error(), "vllm:prefix_cache_hits_total") {
		t.Fatalf("err = %v", err)
	}
}

func TestServerScraperDelta(t *testing.T) {
	s := &ServerScraper{}
	for i, step := range []struct{ value, start, want float64 }{
		{1000, 10, 0}, // baseline: what the server counted before we started is not ours
		{1500, 10, 500},
		{1500, 10, 0},
		{200, 10, 200}, // restart seen by the decrease: the counter began again
		{260, 10, 60},
		{900, 99, 900}, // restart seen by the start time, the new count already past the old
		{950, 99, 50},
		{960, 0, 10},  // a server without a start time
		{100, 0, 100}, // then only a decrease tells
	} {
		if got, err := s.delta(step.value, step.start); err != nil || got != step.want {
			t.Errorf("step %d: delta(%v, %v) = %v, %v, want %v", i, step.value, step.start, got, err, step.want)
		}
	}
}

// TestServerMetricsAttribution checks that a scrape's increase is shared by
// the workloads in proportion to the prompt tokens they sent, that usage
// cached tokens are ignored for such a target, and that hits while nothing
// was sent are not counted.
func TestServerMetricsAttribution(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	c.SetTarget("srv", "m", "chat", "vllm", "server_metrics")
	var value atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:prefix_cache_hits_total %d\n", value.Load())
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "srv", URL: srv.URL, Dialect: "vllm", Client: srv.Client(), Interval: time.Hour}

	value.Store(5000)
	if err := s.scrapeOnce(context.Background(), c); err != nil { // baseline
		t.Fatal(err)
	}
	for _, r := range []struct {
		w     string
		trace int
	}{{"a", 3000}, {"b", 1000}} {
		c.Finished(&replay.Result{Workload: r.w, Target: "srv", Outcome: replay.OutcomeSuccess,
			TraceInputLength: r.trace, CachedTokens: 999, CachedKnown: true})
	}
	value.Store(5800)
	if err := s.scrapeOnce(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	value.Store(9000) // other traffic: nothing of ours was sent
	if err := s.scrapeOnce(context.Background(), c); err != nil {
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
		engine   ServerCounts
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
			{[]finish{known("a", 3000), known("b", 1000)}, ServerCounts{Cached: 800, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 600, "b": 200}, map[string]float64{"a": 600, "b": 200}},
		{"one of two replicas sharded against one engine takes half", []step{
			{[]finish{known("a", 2000)}, ServerCounts{Cached: 1000, Prompt: 4000, PromptKnown: true}},
			{[]finish{known("a", 2000)}, ServerCounts{Cached: 1200, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 1100}, map[string]float64{"a": 1100}},
		{"requests of unknown theoretical tokens stay off the efficiency", []step{
			{[]finish{known("a", 1000), {w: "a", prompt: 3000}}, ServerCounts{Cached: 2000, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 2000}, map[string]float64{"a": 500}},
		{"a request the engine counted before it finished is credited later", []step{
			{[]finish{known("a", 1000)}, ServerCounts{Cached: 900, Prompt: 2000, PromptKnown: true}},
			{[]finish{known("a", 1000)}, ServerCounts{PromptKnown: true}},
		}, map[string]float64{"a": 900}, map[string]float64{"a": 900}},
		// Within the window, the replica's share of the prompt tokens is
		// its share of the hits, whoever hit more.
		{"other traffic in the window shares the hits by prompt tokens", []step{
			{[]finish{known("a", 1000)}, ServerCounts{Cached: 500, Prompt: 1000, PromptKnown: true}},
			{nil, ServerCounts{Cached: 700, Prompt: 1000, PromptKnown: true}},
		}, map[string]float64{"a": 600}, map[string]float64{"a": 600}},
		// Without a prompt counter the share cannot be known: the replica
		// takes every hit of the interval (the documented limitation), but
		// still leaves unknown theoretical tokens off the efficiency.
		{"without a prompt counter, every hit of the interval", []step{
			{[]finish{known("a", 1000), {w: "a", prompt: 1000}}, ServerCounts{Cached: 1000}},
		}, map[string]float64{"a": 1000}, map[string]float64{"a": 500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(prometheus.NewRegistry())
			c.SetTarget("srv", "m", "chat", "vllm", "server_metrics")
			for _, st := range tt.steps {
				for _, f := range st.finished {
					c.Sent(f.w, "srv", time.Time{}, time.Time{})
					c.Finished(&replay.Result{Workload: f.w, Target: "srv", Outcome: replay.OutcomeSuccess,
						TraceInputLength: f.prompt - 10, PromptTokens: f.prompt, PromptKnown: true, TheoreticalKnown: f.theoKnown})
				}
				c.AddServerCounts("srv", st.engine)
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
