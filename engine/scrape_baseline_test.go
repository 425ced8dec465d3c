package engine

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"
)

// TestServerScraperBaselineFlag: only the first read a scraper makes is
// its baseline, whether it was Prime's or Run's; a rejected first read
// leaves the next one the baseline.
func TestServerScraperBaselineFlag(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		want   []bool // Baseline of each read that was not rejected
	}{
		{"first read", []float64{100, 150, 170}, []bool{true, false, false}},
		{"a rejected first read", []float64{-1, 100, 150}, []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
			var got []bool
			for _, v := range tt.values {
				c, err := s.counts(engineRead{cached: seriesValues{"": v}, prompt: seriesValues{"": 10 * v}})
				if err == nil {
					got = append(got, c.Baseline)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Baseline of each read = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCountsPromptTokens(t *testing.T) {
	got := CountingPromptTokens()
	want := []Dialect{DialectVLLM, DialectSGLang, DialectLlamaCpp}
	if !slices.Equal(got, want) {
		t.Errorf("CountingPromptTokens() = %v, want %v", got, want)
	}
}

// countsSink keeps what a scraper hands it.
type countsSink struct{ got []ServerCounts }

func (c *countsSink) AddServerCounts(_ string, d ServerCounts)                { c.got = append(c.got, d) }
func (c *countsSink) ServerMetricsError(_ string, _ ServerMetricsErrorReason) {}

// TestServerScraperReadTime: a read says when it was asked for, so that
// what happened while the page was on its way counts at the next.
func TestServerScraperReadTime(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "vllm:prefix_cache_hits_total 5\nvllm:prefix_cache_queries_total 50\n")
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: DialectVLLM, Client: srv.Client()}
	var sink countsSink
	for range 2 {
		before := time.Now()
		if err := s.ScrapeOnce(context.Background(), &sink); err != nil {
			t.Fatal(err)
		}
		if at := sink.got[len(sink.got)-1].At; at.Before(before) || at.After(time.Now()) {
			t.Errorf("read at %v, want between %v and now", at, before)
		}
	}
	if !sink.got[0].Baseline || sink.got[1].Baseline {
		t.Errorf("baselines %v, %v; want only the first", sink.got[0].Baseline, sink.got[1].Baseline)
	}
}

// TestServerScraperRestartedFlag: a read says when it found the engine
// restarted (a new process start time), never on the first read.
func TestServerScraperRestartedFlag(t *testing.T) {
	s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
	var got []bool
	for _, start := range []float64{10, 10, 99, 99, 0} {
		c, err := s.counts(engineRead{cached: seriesValues{"": 5}, prompt: seriesValues{"": 50}, start: start})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.Restarted)
	}
	if want := []bool{false, false, true, false, false}; !slices.Equal(got, want) {
		t.Errorf("Restarted of each read = %v, want %v", got, want)
	}
}
