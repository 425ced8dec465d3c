package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newFakeServer is the kit's fake server standing for a vLLM: its /metrics
// answers the cache discovery and the server-metrics scrapers.
func newFakeServer(t *testing.T, configure func(*testutil.FakeServer)) *testutil.FakeServer {
	t.Helper()
	return testutil.NewFakeServer(t, func(f *testutil.FakeServer) {
		f.Metrics = testutil.VLLMMetrics
		if configure != nil {
			configure(f)
		}
	})
}

// started is a daemon started on path, stopped (and drained) by the test's
// cleanup.
type started struct {
	*Daemon
	reg     *prometheus.Registry
	stop    context.CancelFunc
	held    <-chan struct{} // a test's beforeApply hook says it holds a reload
	release func()          // and lets it go on (once; later calls do nothing)
}

func startDaemon(t *testing.T, path string, configure func(*Options)) (*started, error) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o := Options{ConfigFile: path, DrainTimeout: time.Second, Collector: collector.New(reg)}
	if configure != nil {
		configure(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := New(o)
	if err := d.Start(ctx); err != nil {
		cancel()
		return nil, err
	}
	s := &started{Daemon: d, reg: reg, stop: cancel}
	t.Cleanup(func() {
		cancel()
		<-d.Done()
	})
	return s, nil
}

// reloadConfig is the configuration of the direct reload test: three
// workloads on three targets (paths of one server), each replaying
// future.jsonl: two rows at once, the third an hour later, so every
// workload stands at position {0 2} for the whole test.
func reloadConfig(srvURL, trace string, changeInFlight int, withRemove bool) config.Config {
	names := []string{"keep", "change"}
	if withRemove {
		names = append(names, "remove")
	}
	cfg := twoWorkloads(srvURL, trace, names...)
	for i := range cfg.Workloads {
		cfg.Workloads[i].MaxInFlight = 8
		if cfg.Workloads[i].Name == "change" {
			cfg.Workloads[i].MaxInFlight = changeInFlight
		}
	}
	return cfg
}

// TestReloadUnits reloads a real file through the owner goroutine and looks at the units themselves:
// (a) an unchanged workload keeps its unit, trace position and counters;
// (b) a changed one restarts from the start with fresh series;
// (c) a removed one's series are gone;
// (d) an invalid file changes nothing but the reload gauge.
func TestReloadUnits(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	ctx := t.Context()
	daemontest.WriteConfig(t, path, reloadConfig(srv.URL, trace, 8, true))
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := d.reg
	successes := func(w string) float64 {
		v, _ := testutil.Gather(t, reg).Value("kvload_requests_total", "workload", w, "outcome", "success")
		return v
	}
	testutil.Eventually(t, "the first two rows of every workload done", func() (bool, string) {
		k, c, r := successes("keep"), successes("change"), successes("remove")
		return k == 2 && c == 2 && r == 2, fmt.Sprintf("keep %v, change %v, remove %v", k, c, r)
	})
	keepKey, changeKey := unitKey{"keep", "t-keep"}, unitKey{"change", "t-change"}
	keep, change := d.units.byKey[keepKey], d.units.byKey[changeKey]
	wantPos := replay.TracePosition{Pass: 0, Conv: 2}
	for _, u := range []*unit{keep, change} {
		if got := u.workload.Position(); got != wantPos {
			t.Fatalf("position before the reload %+v, want %+v", got, wantPos)
		}
	}

	// (d) An invalid file: nothing changes but the gauge.
	invalid := reloadConfig(srv.URL, trace, 8, true)
	invalid.Workloads[0].Targets = []string{"t-nope"}
	daemontest.WriteConfig(t, path, invalid)
	if err := d.Reload(ctx); err == nil || !strings.Contains(err.Error(), `unknown target "t-nope"`) {
		t.Fatalf("reload of an invalid file: %v", err)
	}
	mfs := testutil.Gather(t, reg)
	if v, _ := mfs.Value("kvload_config_last_reload_successful"); v != 0 {
		t.Errorf("kvload_config_last_reload_successful %v after a bad reload, want 0", v)
	}
	if len(d.units.byKey) != 3 || d.units.byKey[keepKey] != keep || d.units.byKey[changeKey] != change {
		t.Errorf("a rejected file changed the units: %v", d.units.byKey)
	}
	if v, _ := mfs.Value("kvload_requests_total", "workload", "remove"); v != 2 {
		t.Errorf("a rejected file reset the counters: remove has %v requests, want 2", v)
	}

	// Change "change", drop "remove", leave "keep" alone.
	daemontest.WriteConfig(t, path, reloadConfig(srv.URL, trace, 4, false))
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}

	// (a) kept: the same unit, still at its position, counters intact.
	if got := d.units.byKey[keepKey]; got != keep {
		t.Errorf("unchanged workload got a new unit (%p, was %p)", got, keep)
	} else if got.workload != keep.workload {
		t.Errorf("unchanged workload got a new replay.Workload")
	}
	if got := keep.workload.Position(); got != wantPos {
		t.Errorf("unchanged workload's position %+v, want %+v", got, wantPos)
	}
	if v := successes("keep"); v != 2 {
		t.Errorf("unchanged workload's requests %v after the reload, want 2 (not reset)", v)
	}

	// (b) changed: a new unit replaying from the start, counted afresh.
	if got := d.units.byKey[changeKey]; got == nil || got == change || got.workload == change.workload {
		t.Fatalf("changed workload kept its unit")
	}
	testutil.Eventually(t, "the changed workload replayed again from the start", func() (bool, string) {
		return srv.Count("/change/v1/chat/completions") == 4 && successes("change") == 2,
			fmt.Sprintf("server saw %d, counted %v", srv.Count("/change/v1/chat/completions"), successes("change"))
	})
	if got := d.units.byKey[changeKey].workload.Position(); got != wantPos {
		t.Errorf("restarted workload's position %+v, want %+v", got, wantPos)
	}
	if got := srv.Count("/keep/v1/chat/completions"); got != 2 {
		t.Errorf("unchanged workload sent %d requests in all, want 2 (it must not start over)", got)
	}

	// (c) removed: no series left with its workload or target label.
	mfs = testutil.Gather(t, reg)
	if s := append(mfs.SeriesWith("workload", "remove"), mfs.SeriesWith("target", "t-remove")...); len(s) > 0 {
		t.Errorf("series of the removed workload remain: %v", s)
	}
	if _, ok := d.units.byKey[unitKey{"remove", "t-remove"}]; ok || len(d.units.byKey) != 2 {
		t.Errorf("units after the reload: %v", d.units.byKey)
	}
	if v, _ := mfs.Value("kvload_config_last_reload_successful"); v != 1 {
		t.Errorf("kvload_config_last_reload_successful %v, want 1", v)
	}
}

// TestReloadGaugeAfterRevert: the file is made invalid, then restored to
// exactly the bytes that run. The watcher's content check must not take the
// restored file for "unchanged": the gauge returns to 1. Writing the same
// invalid bytes again sets it back to 0.
func TestReloadGaugeAfterRevert(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	good := daemontest.Marshal(t, twoWorkloads(srv.URL, fixture(t, "future.jsonl"), "w"))
	badCfg := twoWorkloads(srv.URL, fixture(t, "future.jsonl"), "w")
	badCfg.Workloads[0].Targets = []string{"t-nope"}
	bad := daemontest.Marshal(t, badCfg)
	daemontest.WriteFile(t, path, good)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		write []byte
		want  float64
	}{
		{bad, 0},
		{good, 1}, // the bytes that run
		{bad, 0},  // the bytes last rejected, rejected again
		{good, 1},
	}
	for i, s := range steps {
		daemontest.WriteFile(t, path, s.write)
		// As the file watcher asks: an unchanged file is skipped. A bad
		// file's error is what the gauge and the status must show.
		_ = d.request(t.Context(), false)
		if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != s.want {
			t.Errorf("step %d: kvload_config_last_reload_successful %v, want %v", i, v, s.want)
		}
		if got := d.Status().ReloadOK; got != (s.want == 1) {
			t.Errorf("step %d: landing page's reload ok %v", i, got)
		}
	}
}

// changeInFlight writes good with its workload's max_in_flight changed: a
// valid configuration whose swap would restart the unit.
func changeInFlight(t *testing.T, dir string, good config.Config) {
	good.Workloads[0].MaxInFlight = 3
	daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
}

// TestBadReloadKeepsRunning: a reload of input that cannot be applied (the
// configuration, or a trace it names, broken in ways a user would) answers
// the problem, sets the reload gauge to 0 and leaves the running set alone:
// the same unit keeps sending. So does a configuration whose build fails
// or panics after it parsed. The whole catalogue of bad inputs, with the
// exact messages, is internal/e2e's TestBadInputReload (through
// POST /-/reload).
func TestBadReloadKeepsRunning(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// breakIt leaves dir/kvload.yml broken; good is the configuration
		// that runs, the test's own copy.
		breakIt func(t *testing.T, dir string, good config.Config)
		// seam, when set, makes every build after the first fail, through
		// a test hook of o, once armed.
		seam   func(o *Options, armed *atomic.Bool)
		errSub string
	}{
		{"unknown target", func(t *testing.T, dir string, good config.Config) {
			good.Workloads[0].Targets = []string{"t-nope"}
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, nil, `unknown target "t-nope"`},
		{"truncated YAML", func(t *testing.T, dir string, good config.Config) {
			text := daemontest.Marshal(t, good)
			daemontest.WriteFile(t, filepath.Join(dir, "kvload.yml"), text[:len(text)/2])
		}, nil, "kvload.yml"},
		{"trace missing", func(t *testing.T, dir string, good config.Config) {
			good.Workloads[0].Trace = "gone.jsonl"
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, nil, "gone.jsonl"},
		{"trace with a bad row", func(t *testing.T, dir string, good config.Config) {
			daemontest.WriteFile(t, filepath.Join(dir, "bad.jsonl"), []byte(`{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": "soon", "input_length": 20}
`))
			good.Workloads[0].Trace = "bad.jsonl"
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, nil, "bad.jsonl:2"},
		{"configuration is a directory", func(t *testing.T, dir string, _ config.Config) {
			path := filepath.Join(dir, "kvload.yml")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, nil, "kvload.yml"},
		{"build fails", changeInFlight, func(o *Options, armed *atomic.Bool) {
			o.buildStep = func(*config.Config) error {
				if armed.Load() {
					return errors.New("the engine cannot be built")
				}
				return nil
			}
		}, "the engine cannot be built"},
		{"past the memory limit", func(t *testing.T, dir string, good config.Config) {
			good.Workloads[0].MaxInFlight = config.MaxInFlightLimit // 64 KiB a request in flight: 4 GiB
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, func(o *Options, _ *atomic.Bool) {
			o.MemoryLimit = 1 << 30 // the good configuration needs about 100 MiB
		}, "exceeds the memory limit"},
		{"build panics", changeInFlight, func(o *Options, armed *atomic.Bool) {
			o.beforeApply = func(context.Context) {
				if armed.Load() {
					panic("a build that panics")
				}
			}
		}, "building the configuration panicked: a build that panics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, nil)
			dir := t.TempDir()
			steady, err := os.ReadFile(daemontest.SteadyTrace(t, dir))
			if err != nil {
				t.Fatal(err)
			}
			daemontest.WriteFile(t, filepath.Join(dir, "trace.jsonl"), steady)
			good := func() config.Config {
				cfg := twoWorkloads(srv.URL, "trace.jsonl", "w")
				cfg.Workloads[0].Loop = "repeat"
				return cfg
			}
			path := filepath.Join(dir, "kvload.yml")
			daemontest.WriteConfig(t, path, good())
			var armed atomic.Bool
			d, err := startDaemon(t, path, func(o *Options) {
				if tt.seam != nil {
					tt.seam(o, &armed)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			armed.Store(true)
			before := d.units.byKey[unitKey{"w", "t-w"}] // Start answered: the owner is idle

			tt.breakIt(t, dir, good())
			err = d.Reload(t.Context())
			if err == nil || !strings.Contains(err.Error(), tt.errSub) {
				t.Fatalf("reload: %v, want an error naming %q", err, tt.errSub)
			}
			if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 0 {
				t.Errorf("kvload_config_last_reload_successful %v, want 0", v)
			}
			if st := d.Status(); st.ReloadOK || !strings.Contains(st.ReloadError, tt.errSub) {
				t.Errorf("landing page status: ok %v, error %q", st.ReloadOK, st.ReloadError)
			}
			if got := d.units.byKey[unitKey{"w", "t-w"}]; got != before || len(d.units.byKey) != 1 {
				t.Errorf("the rejected reload changed the units: %v", d.units.byKey)
			}
			sent := srv.Count("/w/v1/chat/completions")
			testutil.Eventually(t, "the old workload still sending", func() (bool, string) {
				n := srv.Count("/w/v1/chat/completions")
				return n > sent, fmt.Sprintf("%d requests, %d at the reload", n, sent)
			})
		})
	}
}
