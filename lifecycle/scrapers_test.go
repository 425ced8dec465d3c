package lifecycle

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// scrapedTarget is a vLLM target at url whose /metrics, at metricsURL, is
// scraped, with its cache configured (no discovery).
func scrapedTarget(name, url, metricsURL string) config.Target {
	t := daemontest.Target(name, url)
	t.Cache.Observed = "server_metrics"
	t.Cache.MetricsURL = metricsURL
	t.Cache.BlockSize, t.Cache.CapacityBlocks = config.Fixed(16), config.Fixed(1024)
	return t
}

// TestRemovedTargetLeavesNoSeries: a reload that removes a target while a
// scrape of it is in flight leaves none of its series: the scrape cut
// short counts nothing, and the target's series are deleted after its
// scraper ended. (A cancelled scrape that counted an error after the
// series were deleted would bring that series back for good.)
func TestRemovedTargetLeavesNoSeries(t *testing.T) {
	t.Parallel()
	kept := newFakeServer(t, nil)
	var mu sync.Mutex
	scrapes := 0
	inFlight := make(chan struct{})
	gone := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		scrapes++
		n := scrapes
		mu.Unlock()
		if n == 1 { // the baseline
			fmt.Fprint(w, testutil.VLLMMetrics)
			return
		}
		if n == 2 {
			close(inFlight)
		}
		<-r.Context().Done()
	}))
	t.Cleanup(gone.Close)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	cfg := config.Config{
		Targets:   []config.Target{scrapedTarget("kept", kept.URL, kept.URL+"/metrics"), scrapedTarget("gone", gone.URL, gone.URL+"/metrics")},
		Workloads: []config.Workload{daemontest.Workload("w", fixture(t, "future.jsonl"), "kept")},
	}
	daemontest.WriteConfig(t, path, cfg)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Wait(t, "a scrape of the target in flight", inFlight)
	cfg.Targets = cfg.Targets[:1]
	daemontest.WriteConfig(t, path, cfg)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	for name, mf := range testutil.Gather(t, d.reg) {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "target" && l.GetValue() == "gone" {
					t.Errorf("%s%v survived the removal of its target", name, m.GetLabel())
				}
			}
		}
	}
}

// openFiles is how many files this process holds open.
func openFiles(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("open files not countable here: %v", err)
	}
	return len(fds)
}

// TestReloadsCloseScraperConnections: 20 reloads that change each of 200
// scraped targets leave the process with the goroutines and open files it
// had after the first load: every stopped scraper closed its kept-alive
// connection. (When they did not, 200 targets and 20 reloads took the
// process from 213 to 4,213 open files.)
func TestReloadsCloseScraperConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("200 targets, 20 reloads")
	}
	// Not parallel: it counts the whole process's goroutines and files.
	const targets, reloads = 200, 20
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	write := func(gen int) {
		var cfg config.Config
		for i := range targets {
			name := fmt.Sprintf("t%03d", i)
			// A new metrics URL a reload: every scraper restarts.
			cfg.Targets = append(cfg.Targets, scrapedTarget(name, srv.URL+"/"+name, fmt.Sprintf("%s/%s/%d/metrics", srv.URL, name, gen)))
		}
		cfg.Workloads = []config.Workload{daemontest.Workload("w", trace, "t000")}
		daemontest.WriteConfig(t, path, cfg)
	}
	write(0)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.scrapers); n != targets {
		t.Fatalf("%d scrapers, want %d", n, targets)
	}
	// The baseline: 200 scrapers, each with its connection (both ends of
	// it are in this process) once its first scrape is done.
	testutil.Eventually(t, "every target scraped twice (the baseline, then Run's first scrape)", func() (bool, string) {
		n := srv.Count("/t199/0/metrics")
		return n >= 2, fmt.Sprintf("the last target's /metrics read %d times", n)
	})
	goroutines, files := runtime.NumGoroutine(), openFiles(t)
	for gen := 1; gen <= reloads; gen++ {
		write(gen)
		if err := d.Reload(t.Context()); err != nil {
			t.Fatalf("reload %d: %v", gen, err)
		}
	}
	// A few goroutines and files of the last reload's own reads may still
	// be closing; 200 left behind per reload is what this catches.
	const slack = 40
	testutil.Eventually(t, "goroutines and open files back to the baseline", func() (bool, string) {
		g, f := runtime.NumGoroutine(), openFiles(t)
		return g <= goroutines+slack && f <= files+slack,
			fmt.Sprintf("%d goroutines (baseline %d), %d open files (baseline %d)", g, goroutines, f, files)
	})
	t.Logf("baseline: %d goroutines, %d open files; after %d reloads: %d, %d", goroutines, files, reloads, runtime.NumGoroutine(), openFiles(t))
}
