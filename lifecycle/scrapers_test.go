package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	promconfig "github.com/prometheus/common/config"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
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
	if n := len(d.scrapers.running); n != targets {
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

// reconcileTarget is one target of a TestReloadReconcilesScrapers step.
type reconcileTarget struct {
	name     string
	emulated bool
	capacity int  // of the emulated engine's cache
	scraped  bool // observed: server_metrics
}

func reconcileConfig(srvURL, trace string, targets []reconcileTarget) config.Config {
	var cfg config.Config
	for _, tg := range targets {
		target := daemontest.Target(tg.name, srvURL+"/"+tg.name)
		if tg.emulated {
			target = config.Target{Name: tg.name, Emulate: &config.Emulate{CapacityBlocks: tg.capacity}}
		}
		target.Cache.Observed = "usage"
		// The scrapers of server_metrics only: enginereads_test.go has
		// those of cache.reconcile.
		target.Cache.Reconcile = config.ReconcileOff
		if tg.scraped {
			target.Cache.Observed = "server_metrics"
		}
		cfg.Targets = append(cfg.Targets, target)
		cfg.Workloads = append(cfg.Workloads, daemontest.Workload("w-"+tg.name, trace, tg.name))
	}
	return cfg
}

// TestReloadReconcilesScrapers: each reload leaves the server-metrics
// scrapers and the emulated engines exactly as the file asks: one scraper
// per target with observed: server_metrics, started (its baseline read) when
// a target asks for one, stopped when it no longer does or is removed, and
// restarted when its target changed; one engine per emulated target, kept
// while unchanged, replaced when changed, stopped (its port closed) when
// removed.
func TestReloadReconcilesScrapers(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	steps := []struct {
		name    string
		targets []reconcileTarget
		// What must have been restarted by this step (changed), by name.
		restarted []string
	}{
		{"start", []reconcileTarget{
			{name: "real", scraped: true},
			{name: "emu1", emulated: true, capacity: 64, scraped: true},
			{name: "emu2", emulated: true, capacity: 64},
		}, nil},
		{"scraping moved, an engine changed", []reconcileTarget{
			{name: "real"},
			{name: "emu1", emulated: true, capacity: 64, scraped: true},
			{name: "emu2", emulated: true, capacity: 128, scraped: true},
		}, []string{"emu2"}},
		{"an emulated target removed, scraping back", []reconcileTarget{
			{name: "real", scraped: true},
			{name: "emu2", emulated: true, capacity: 128, scraped: true},
		}, nil},
	}
	var d *started
	var prevScrapers map[string]*scraping
	var prevEngines map[string]*emulated
	for i, step := range steps {
		daemontest.WriteConfig(t, path, reconcileConfig(srv.URL, trace, step.targets))
		scrapesBefore := srv.Count("/real/metrics")
		if i == 0 {
			var err error
			if d, err = startDaemon(t, path, nil); err != nil {
				t.Fatal(err)
			}
		} else if err := d.Reload(t.Context()); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		// Read once Start or Reload answered: the owner goroutine is idle.
		scrapers, engines := maps(d.scrapers.running), maps(d.emulators.running)

		var wantScrapers, wantEngines []string
		for _, tg := range step.targets {
			if tg.scraped {
				wantScrapers = append(wantScrapers, tg.name)
			}
			if tg.emulated {
				wantEngines = append(wantEngines, tg.name)
			}
		}
		if got := keys(scrapers); !slices.Equal(got, sorted(wantScrapers)) {
			t.Errorf("%s: scrapers of %v, want %v", step.name, got, sorted(wantScrapers))
		}
		if got := keys(engines); !slices.Equal(got, sorted(wantEngines)) {
			t.Errorf("%s: engines of %v, want %v", step.name, got, sorted(wantEngines))
		}
		// A scraper started for the real target read its baseline first.
		if _, had := prevScrapers["real"]; scrapers["real"] != nil && !had && srv.Count("/real/metrics") == scrapesBefore {
			t.Errorf("%s: the real target's new scraper never read its /metrics", step.name)
		}
		for name, old := range prevScrapers {
			restarted := slices.Contains(step.restarted, name)
			switch now := scrapers[name]; {
			case now == old && restarted:
				t.Errorf("%s: the scraper of changed target %s kept running", step.name, name)
			case now != old && now != nil && !restarted:
				t.Errorf("%s: the scraper of unchanged target %s was restarted", step.name, name)
			}
			if scrapers[name] != old {
				select {
				case <-old.done:
				default:
					t.Errorf("%s: the old scraper of %s still runs", step.name, name)
				}
			}
		}
		for name, old := range prevEngines {
			restarted := slices.Contains(step.restarted, name)
			switch now := engines[name]; {
			case now == old && restarted:
				t.Errorf("%s: the engine of changed target %s kept running", step.name, name)
			case now != old && now != nil && !restarted:
				t.Errorf("%s: the engine of unchanged target %s was restarted", step.name, name)
			}
			if engines[name] != old {
				// Stopped: its port no longer answers.
				if resp, err := http.Get(old.url + "/metrics"); err == nil {
					resp.Body.Close()
					t.Errorf("%s: the old engine of %s still answers at %s", step.name, name, old.url)
				}
			}
		}
		prevScrapers, prevEngines = scrapers, engines
	}
}

func maps[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// TestTargetReadsDoNotFollowRedirects: the server-metrics scrape and the
// cache discovery send the target's credentials; a redirect to the same host
// on another port must not take them there. Each read fails with an error
// naming the target and the redirect, and the other server sees nothing.
func TestTargetReadsDoNotFollowRedirects(t *testing.T) {
	t.Parallel()
	const token = "tok-r3d1rect"
	reads := []struct {
		name string
		read func(ctx context.Context, tg *config.Target, url string) error
	}{
		{"server metrics", func(ctx context.Context, tg *config.Target, url string) error {
			sc, err := newServerScraper(tg, url+"/metrics")
			if err != nil {
				return err
			}
			defer sc.Client.CloseIdleConnections()
			return sc.Prime(ctx)
		}},
		{"cache discovery", func(ctx context.Context, tg *config.Target, url string) error {
			_, err := discoverLayout(ctx, tg, url)
			return err
		}},
	}
	for _, rd := range reads {
		for _, status := range []int{301, 302, 303, 307, 308} {
			t.Run(fmt.Sprintf("%s %d", rd.name, status), func(t *testing.T) {
				t.Parallel()
				var mu sync.Mutex
				var elsewhere []string // what reached the other server
				var auth []string      // the Authorization the target got
				other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					elsewhere = append(elsewhere, fmt.Sprintf("%s %s Authorization=%q", r.Method, r.URL, r.Header.Get("Authorization")))
					mu.Unlock()
				}))
				t.Cleanup(other.Close)
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					auth = append(auth, r.Header.Get("Authorization"))
					mu.Unlock()
					http.Redirect(w, r, other.URL+r.URL.Path, status)
				}))
				t.Cleanup(srv.Close)
				// The defaults, where follow_redirects is true.
				hc := promconfig.DefaultHTTPClientConfig
				hc.Authorization = &promconfig.Authorization{Type: "Bearer", Credentials: token}
				tg := &config.Target{Name: "t-redirecting", Dialect: "vllm", HTTPClientConfig: &hc}

				err := rd.read(t.Context(), tg, srv.URL)
				if !errors.Is(err, engine.ErrRedirect) {
					t.Fatalf("error %v, want one wrapping engine.ErrRedirect", err)
				}
				for _, want := range []string{"t-redirecting", fmt.Sprintf("HTTP %d to %s/", status, other.URL)} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if len(elsewhere) > 0 {
					t.Errorf("the redirect was followed: %q", elsewhere)
				}
				// The credentials were sent, to the target only: the check
				// above would pass vacuously without them.
				if len(auth) != 1 || auth[0] != "Bearer "+token {
					t.Errorf("the target received Authorization %q, want one %q", auth, "Bearer "+token)
				}
			})
		}
	}
}
