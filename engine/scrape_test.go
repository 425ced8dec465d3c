package engine

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
		// llama-server's prompt_tokens_total leaves the cached tokens out:
		// counts adds them back (TestServerScraperPromptExcludesCached).
		{"llamacpp", "# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total 1234\n# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 766\n", 1234, 766, true},
		{"dynamo", "# TYPE dynamo_frontend_cached_tokens histogram\ndynamo_frontend_cached_tokens_bucket{model=\"m\",le=\"+Inf\"} 3\ndynamo_frontend_cached_tokens_sum{model=\"m\"} 4096\ndynamo_frontend_cached_tokens_count{model=\"m\"} 3\n", 4096, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.dialect, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, tt.body)
			}))
			defer srv.Close()
			dialect, _, _ := strings.Cut(tt.dialect, " ")
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: Dialect(dialect), Client: srv.Client()}
			got, err := s.read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got.cached.sum() != tt.want || got.prompt.sum() != tt.wantPrompt || (got.prompt != nil) != tt.promptKnown {
				t.Errorf("cached %v, prompt %v (known %v); want %v, %v (%v)", got.cached.sum(), got.prompt.sum(), got.prompt != nil, tt.want, tt.wantPrompt, tt.promptKnown)
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
		got, err := s.counts(engineRead{cached: seriesValues{"": step.value}, start: step.start})
		if err != nil || got.Cached != step.want {
			t.Errorf("step %d: counts(%v, start %v) = %v, %v, want %v", i, step.value, step.start, got.Cached, err, step.want)
		}
	}
}

// TestServerScraperPromptExcludesCached: an engine whose prompt counter
// leaves the cached tokens out (llama.cpp) gets them added back to its
// prompt increase.
func TestServerScraperPromptExcludesCached(t *testing.T) {
	s := &ServerScraper{Dialect: DialectLlamaCpp}
	for i, step := range []struct{ cached, prompt, wantPrompt float64 }{
		{1234, 766, 0},
		{1300, 800, 100},
	} {
		got, err := s.counts(engineRead{cached: seriesValues{"": step.cached}, prompt: seriesValues{"": step.prompt}})
		if err != nil || got.Prompt != step.wantPrompt || !got.PromptKnown {
			t.Errorf("step %d: prompt %v (known %v), %v; want %v", i, got.Prompt, got.PromptKnown, err, step.wantPrompt)
		}
	}
}
