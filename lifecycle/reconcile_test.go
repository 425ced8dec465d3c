package lifecycle

import (
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

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
		scrapers, engines := maps(d.scrapers), maps(d.emulators)

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
