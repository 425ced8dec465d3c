package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestServerScraperRejectsImplausible: a scraped cached-token counter that
// is NaN, ±Inf, negative, above 2^53 or that jumped by more than 2^40 in one
// scrape is not credited: the scrape fails with a *RejectedCount naming
// the reason, kvload_server_metrics_errors_total counts it, and the
// baseline stays where it was, so the next sane value is credited from
// there. (Credited, one such answer would ruin every rate.)
func TestServerScraperRejectsImplausible(t *testing.T) {
	tests := []struct {
		name   string
		values []string // served in turn; the first is the baseline
		want   []any    // per scrape after the baseline: the credit (float64) or the rejection's reason (string)
	}{
		{"sane", []string{"100", "150", "150"}, []any{50.0, 0.0}},
		{"NaN", []string{"100", "NaN", "130"}, []any{"not_finite", 30.0}},
		{"+Inf", []string{"100", "+Inf", "130"}, []any{"not_finite", 30.0}},
		{"-Inf", []string{"100", "-Inf", "130"}, []any{"not_finite", 30.0}},
		{"negative", []string{"100", "-5", "130"}, []any{"negative", 30.0}},
		{"above 2^53", []string{"100", "1e18", "130"}, []any{"too_large", 30.0}},
		{"jump by 2^41", []string{"100", "2199023255652", "130"}, []any{"jump", 30.0}},
		{"jump by exactly 2^40: accepted", []string{"100", "1099511627876"}, []any{1099511627776.0}},
		{"restart: a decrease credits the new count", []string{"100", "40"}, []any{40.0}},
		{"unreadable", []string{"100", "garbage {", "130"}, []any{"scrape", 30.0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			next := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				v := tt.values[next]
				next++
				mu.Unlock()
				fmt.Fprintf(w, "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total %s\n", v)
			}))
			defer srv.Close()
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: "vllm", Client: srv.Client()}
			if err := s.Prime(context.Background()); err != nil {
				t.Fatalf("baseline: %v", err)
			}
			for i, want := range tt.want {
				before := maps.Clone(s.cached)
				r, err := s.read(context.Background())
				var credit float64
				if err == nil {
					var counts ServerCounts
					counts, err = s.counts(r)
					credit = counts.Cached
				}
				// As Run would: a failed read is a scrape error.
				reason := ServerErrorScrape
				if bad := (*RejectedCount)(nil); errors.As(err, &bad) {
					reason = bad.Reason
					if bad.Target != "t" {
						t.Errorf("scrape %d: the rejection names target %q", i, bad.Target)
					}
				}
				switch w := want.(type) {
				case float64:
					if err != nil || credit != w {
						t.Errorf("scrape %d (%s): credit %v, %v; want %v", i, tt.values[i+1], credit, err, w)
					}
				case string:
					if err == nil || string(reason) != w {
						t.Errorf("scrape %d (%s): credit %v, err %v; want rejected as %s", i, tt.values[i+1], credit, err, w)
					}
					if !maps.Equal(s.cached, before) {
						t.Errorf("scrape %d (%s): the baseline moved from %v to %v", i, tt.values[i+1], before, s.cached)
					}
				}
			}
		})
	}
}
