package collector

import (
	"context"
	"fmt"
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
		dialect string
		body    string
		want    float64
	}{
		{"vllm", "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 100\nvllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 28\n", 128},
		{"sglang", "# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total{model_name=\"m\"} 7\n", 7},
		{"trtllm", "# TYPE trtllm_prompt_cached_tokens_total counter\ntrtllm_prompt_cached_tokens_total 9\n", 9},
		{"llamacpp", "# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total 1234\n", 1234},
		{"dynamo", "# TYPE dynamo_frontend_cached_tokens histogram\ndynamo_frontend_cached_tokens_bucket{model=\"m\",le=\"+Inf\"} 3\ndynamo_frontend_cached_tokens_sum{model=\"m\"} 4096\ndynamo_frontend_cached_tokens_count{model=\"m\"} 3\n", 4096},
	}
	for _, tt := range tests {
		t.Run(tt.dialect, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, tt.body)
			}))
			defer srv.Close()
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: tt.dialect, Client: srv.Client()}
			got, _, err := s.read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("cached tokens %v, want %v", got, tt.want)
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
	if _, _, err := s.read(context.Background()); err == nil || !strings.Contains(err.Error(), "vllm:prefix_cache_hits_total") {
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
