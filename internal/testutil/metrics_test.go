package testutil

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestFamiliesValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reqs_total", Help: "h"}, []string{"w", "outcome"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lat_seconds", Help: "h"}, []string{"w"})
	reg.MustRegister(c, h)
	c.WithLabelValues("a", "ok").Add(3)
	c.WithLabelValues("a", "err").Add(1)
	c.WithLabelValues("b", "ok").Add(5)
	h.WithLabelValues("a").Observe(1)
	h.WithLabelValues("a").Observe(2)

	srv := httptestServer(t, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	for name, mfs := range map[string]Families{"gathered": Gather(t, reg), "scraped": Scrape(t, srv)} {
		for _, tt := range []struct {
			name  string
			pairs []string
			sum   float64
			n     int
		}{
			{"reqs_total", nil, 9, 3},
			{"reqs_total", []string{"w", "a"}, 4, 2},
			{"reqs_total", []string{"w", "a", "outcome", "ok"}, 3, 1},
			{"reqs_total", []string{"w", "c"}, 0, 0},
			{"reqs_total", []string{"nolabel", "x"}, 0, 0},
			{"lat_seconds", []string{"w", "a"}, 2, 1},
			{"absent", nil, 0, 0},
		} {
			if sum, n := mfs.Value(tt.name, tt.pairs...); sum != tt.sum || n != tt.n {
				t.Errorf("%s: Value(%s, %v) = %v in %d series, want %v in %d", name, tt.name, tt.pairs, sum, n, tt.sum, tt.n)
			}
		}
		if got := mfs.SeriesWith("w", "b"); len(got) != 1 || !strings.HasPrefix(got[0], "reqs_total") {
			t.Errorf("%s: SeriesWith(w, b) = %v", name, got)
		}
	}
	if _, err := TryScrape("http://127.0.0.1:1"); err == nil {
		t.Error("TryScrape of a closed port: no error")
	}
}

func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
