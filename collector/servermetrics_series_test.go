package collector

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvload-exporter/kvload-exporter/cachetruth"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// trtllmPage is a TensorRT-LLM /metrics page with the cached-token
// counter of each rank in counts (rank i's value at index i; a negative
// value leaves the rank out), each series written times times.
func trtllmPage(counts []float64, times int) string {
	var b strings.Builder
	b.WriteString("# TYPE trtllm_prompt_cached_tokens_total counter\n")
	for rank, v := range counts {
		for range times {
			if v >= 0 {
				fmt.Fprintf(&b, "trtllm_prompt_cached_tokens_total{model=\"m\",rank=\"%d\"} %g\n", rank, v)
			}
		}
	}
	return b.String()
}

// hitPage is one page after the baseline (two ranks at 1e6): each rank's
// count rises by a quarter of the request's prompt; shown leaves a rank
// out where false, reset starts its count again, dup writes every series
// twice.
type hitPage struct {
	shown, reset [2]bool
	dup          bool
}

// TestServerMetricsObservedHitRate drives a TensorRT-LLM target through
// pages that drop a series, reset one, or repeat one, while the engine
// serves exactly half of every prompt from its cache: the observed hit
// rate must read 0.5 (a missing series read as a restart of the whole
// counter takes it to 133; a duplicated one, summed, to 0.891).
func TestServerMetricsObservedHitRate(t *testing.T) {
	const prompt = 1000 // per request, half of it hits
	tests := []struct {
		name           string
		pages          []hitPage
		wantDuplicates float64
	}{
		{name: "a series missing from one page", pages: []hitPage{{shown: [2]bool{true, true}}, {shown: [2]bool{true, false}}, {shown: [2]bool{true, true}}, {shown: [2]bool{true, true}}}},
		{name: "one rank's counter begins again", pages: []hitPage{{shown: [2]bool{true, true}}, {shown: [2]bool{true, true}, reset: [2]bool{false, true}}, {shown: [2]bool{true, true}}}},
		{name: "a page with every series twice", pages: []hitPage{{shown: [2]bool{true, true}}, {shown: [2]bool{true, true}, dup: true}, {shown: [2]bool{true, true}}}, wantDuplicates: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(prometheus.NewRegistry())
			tr := cachetruth.New(c)
			c.SetTarget("srv", "m", "chat", "trtllm")
			tr.SetTarget("srv", "trtllm", "server_metrics")
			var mu sync.Mutex
			page := trtllmPage([]float64{1e6, 1e6}, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprint(w, page)
			}))
			defer srv.Close()
			s := &engine.ServerScraper{Target: "srv", URL: srv.URL, Dialect: "trtllm", Client: srv.Client(), Interval: time.Hour}
			if err := s.Prime(context.Background()); err != nil {
				t.Fatal(err)
			}
			counts := []float64{1e6, 1e6}
			for i, p := range tt.pages {
				tr.Sent("w", "srv", time.Time{}, time.Time{})
				tr.Finished(&replay.Result{Response: openai.Response{Outcome: openai.OutcomeSuccess, PromptTokens: prompt, PromptKnown: true},
					Workload: "w", Target: "srv", TraceInputLength: prompt, TheoreticalKnown: true})
				shown := make([]float64, 2)
				for r := range counts {
					counts[r] += prompt / 4
					if p.reset[r] {
						counts[r] = prompt / 4 // restarted, and served its share since
					}
					shown[r] = -1
					if p.shown[r] {
						shown[r] = counts[r]
					}
				}
				times := 1
				if p.dup {
					times = 2
				}
				mu.Lock()
				page = trtllmPage(shown, times)
				mu.Unlock()
				if err := s.ScrapeOnce(context.Background(), tr); err != nil {
					t.Logf("page %d: %v", i, err)
				}
			}
			cached := testutil.ToFloat64(c.reportedCached.WithLabelValues("w", "srv"))
			prompts := testutil.ToFloat64(c.reportedPrompt.WithLabelValues("w", "srv"))
			// A refused page's hits are credited with the next page's.
			if rate := cached / prompts; math.Abs(rate-0.5) > 1e-9 {
				t.Errorf("observed hit rate %v (%v of %v), want 0.5", rate, cached, prompts)
			}
			if got := testutil.ToFloat64(c.serverErrors.WithLabelValues("srv", "duplicate")); got != tt.wantDuplicates {
				t.Errorf("duplicate errors %v, want %v", got, tt.wantDuplicates)
			}
		})
	}
}
