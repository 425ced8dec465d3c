package collector

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/cachetruth"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestServerScraperCountsErrors: Run's scrape counts what it does not
// credit in kvload_server_metrics_errors_total.
func TestServerScraperCountsErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total NaN\n")
	}))
	defer srv.Close()
	c := New(prometheus.NewRegistry())
	tr := cachetruth.New(c)
	s := &engine.ServerScraper{Target: "t", URL: srv.URL, Dialect: "vllm", Client: srv.Client()}
	for range 2 {
		if err := s.ScrapeOnce(context.Background(), tr); err == nil {
			t.Fatal("a NaN counter was credited")
		}
	}
	if got := testutil.ToFloat64(c.serverErrors.WithLabelValues("t", "not_finite")); got != 2 {
		t.Errorf("kvload_server_metrics_errors_total{reason=\"not_finite\"} %v, want 2", got)
	}
	c.ForgetTarget("t")
	if n := testutil.CollectAndCount(c.serverErrors); n != 0 {
		t.Errorf("%d error series left after the target was forgotten", n)
	}
}
