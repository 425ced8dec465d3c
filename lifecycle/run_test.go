package lifecycle

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// startInBackground starts a daemon on path under ctx, handing Start's
// error to the channel returned; the test's cleanup ends it.
func startInBackground(ctx context.Context, t *testing.T, path string) (*Daemon, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	d := New(Options{ConfigFile: path, DrainTimeout: time.Second, Collector: collector.New(prometheus.NewRegistry())})
	started := make(chan error, 1)
	go func() { started <- d.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-d.Done()
	})
	return d, started
}

// TestStartupReadsBounded: the reads a load makes of its targets (cache
// layouts, tokenize checks) run at most maxTargetReads at once, and the
// load waits for them. They once ran two per target at once, whatever
// the number of targets.
func TestStartupReadsBounded(t *testing.T) {
	t.Parallel()
	const targets = 40 // 80 reads
	h := testutil.NewHangingServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, daemontest.ManyTargets(h.URL, fixture(t, "future.jsonl"), targets, false))
	d, started := startInBackground(context.Background(), t, path)
	testutil.Eventually(t, "as many reads held as the bound allows", func() (bool, string) {
		_, held, _ := h.Counts()
		return held >= maxTargetReads, fmt.Sprint(held, " held")
	})
	if d.Ready() {
		t.Error("ready while its targets' reads are under way")
	}
	h.LetGo()
	if err := testutil.Wait(t, "the start", started); err != nil {
		t.Fatal(err)
	}
	arrived, _, most := h.Counts()
	t.Logf("%d reads, at most %d at once", arrived, most)
	if most != maxTargetReads {
		t.Errorf("at most %d reads held at once, want %d", most, maxTargetReads)
	}
	if arrived < 2*targets {
		t.Errorf("%d reads, want at least %d (a layout and a tokenize check each)", arrived, 2*targets)
	}
	if !d.Ready() {
		t.Error("not ready after the start")
	}
}

// TestStartupBaselinesBounded: the server-metrics baselines of a load's
// targets are read side by side, at most maxTargetReads at once, like
// its other reads. They were read one after another, so that 10 targets
// whose /metrics hung held the load back ten times discoverTimeout.
func TestStartupBaselinesBounded(t *testing.T) {
	t.Parallel()
	const targets = 40
	// Only the baselines hang: the layout and tokenize reads fail at once.
	h := testutil.NewHangingServer(t, func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/hang/") })
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, daemontest.ManyTargets(h.URL, fixture(t, "future.jsonl"), targets, true))
	d, started := startInBackground(context.Background(), t, path)
	testutil.Eventually(t, "as many baselines held as the bound allows", func() (bool, string) {
		_, held, _ := h.Counts()
		return held >= maxTargetReads, fmt.Sprint(held, " held")
	})
	h.LetGo()
	if err := testutil.Wait(t, "the start", started); err != nil {
		t.Fatal(err)
	}
	arrived, _, most := h.Counts()
	t.Logf("%d baseline reads, at most %d at once", arrived, most)
	if most != maxTargetReads {
		t.Errorf("at most %d baselines held at once, want %d", most, maxTargetReads)
	}
	if arrived < targets {
		t.Errorf("%d baseline reads, want %d", arrived, targets)
	}
	if !d.Ready() {
		t.Error("not ready after the start")
	}
}

// TestStartupEndsWithShutdown: a shutdown during the first load ends the
// targets' reads under way, starts no more, and Start returns
// ErrShuttingDown, whether it comes during the cache layouts' and
// tokenize checks' reads or the server-metrics baselines'. Against
// targets that never answer, every read would have waited for
// discoverTimeout: the baselines did, one after another (10 hanging
// targets held a start 31 s, and its SIGTERM 28 s).
func TestStartupEndsWithShutdown(t *testing.T) {
	t.Parallel()
	for _, scraped := range []bool{false, true} {
		t.Run(fmt.Sprint("scraped=", scraped), func(t *testing.T) {
			t.Parallel()
			const targets = 40
			// Scraped, only the baselines hang: the other reads fail at once.
			h := testutil.NewHangingServer(t, func(r *http.Request) bool {
				return !scraped || strings.HasPrefix(r.URL.Path, "/hang/")
			})
			path := filepath.Join(t.TempDir(), "kvload.yml")
			daemontest.WriteConfig(t, path, daemontest.ManyTargets(h.URL, fixture(t, "future.jsonl"), targets, scraped))
			ctx, shutdown := context.WithCancel(context.Background())
			d, started := startInBackground(ctx, t, path)
			testutil.Eventually(t, "reads held", func() (bool, string) {
				_, held, _ := h.Counts()
				return held > 0, fmt.Sprint(held, " held")
			})
			before, _, _ := h.Counts()
			shutdown()
			if err := testutil.Wait(t, "the start's end", started); !errors.Is(err, ErrShuttingDown) {
				t.Fatalf("Start: %v, want ErrShuttingDown", err)
			}
			testutil.Wait(t, "the daemon's end", d.Done())
			arrived, _, _ := h.Counts()
			t.Logf("%d reads before the shutdown, %d after", before, arrived-before)
			// Every read that hangs holds its slot until the shutdown, and
			// none starts after it: those that came were all under way
			// (some maybe still connecting) when it began.
			if arrived > maxTargetReads {
				t.Errorf("%d reads came (%d after the shutdown began), want at most %d", arrived, arrived-before, maxTargetReads)
			}
			testutil.Eventually(t, "no read left open", func() (bool, string) {
				_, held, _ := h.Counts()
				return held == 0, fmt.Sprint(held, " held")
			})
		})
	}
}

// TestShutdownDrains: the shutdown stops dispatching and lets the requests
// in flight finish within the drain timeout, counted as they end; those
// still running at the timeout are canceled and counted so. The daemon is
// not ready from the start of the drain.
func TestShutdownDrains(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		drain   time.Duration
		release bool // release the held requests during the drain
		want    map[string]float64
	}{
		{"released during the drain", time.Minute, true, map[string]float64{"success": 3, "canceled": 0}},
		{"cut at the drain timeout", 200 * time.Millisecond, false, map[string]float64{"success": 0, "canceled": 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			srv := newFakeServer(t, func(f *testutil.FakeServer) { f.Release = release })
			path := filepath.Join(t.TempDir(), "kvload.yml")
			daemontest.WriteConfig(t, path, twoWorkloads(srv.URL, fixture(t, "held.jsonl"), "w"))
			d, err := startDaemon(t, path, func(o *Options) { o.DrainTimeout = tt.drain })
			if err != nil {
				t.Fatal(err)
			}
			counts := func() (inFlight, success float64) {
				mfs := testutil.Gather(t, d.reg)
				inFlight, _ = mfs.Value("kvload_requests_in_flight")
				success, _ = mfs.Value("kvload_requests_total", "outcome", "success")
				return inFlight, success
			}
			testutil.Eventually(t, "three requests in flight", func() (bool, string) {
				f, _ := counts()
				return f == 3 && srv.Count("/w/v1/chat/completions") == 3, fmt.Sprint(f, " in flight")
			})

			d.stop()
			if tt.release {
				testutil.Eventually(t, "not ready while draining", func() (bool, string) { return !d.Ready(), "ready" })
				if f, _ := counts(); f != 3 {
					t.Errorf("%v requests in flight during the drain, want 3", f)
				}
				// Two finish during the drain and are counted at once.
				release <- struct{}{}
				release <- struct{}{}
				testutil.Eventually(t, "two released requests counted during the drain", func() (bool, string) {
					f, s := counts()
					return f == 1 && s == 2, fmt.Sprintf("%v in flight, %v succeeded", f, s)
				})
				release <- struct{}{}
			}
			testutil.Wait(t, "the daemon stopped", d.Done())
			mfs := testutil.Gather(t, d.reg)
			for outcome, want := range tt.want {
				if got, _ := mfs.Value("kvload_requests_total", "outcome", outcome); got != want {
					t.Errorf("%s: %v requests, want %v", outcome, got, want)
				}
			}
			if f, _ := mfs.Value("kvload_requests_in_flight"); f != 0 {
				t.Errorf("%v requests in flight after the drain", f)
			}
			if n := srv.Count("/w/v1/chat/completions"); n != 3 {
				t.Errorf("the server saw %d requests, want 3 (the hour-later row is never due)", n)
			}
			if !tt.release {
				testutil.Eventually(t, "the held requests ended by the client", func() (bool, string) {
					return srv.Ended() == 3, fmt.Sprint(srv.Ended(), " ended of ", srv.Requests())
				})
			}
		})
	}
}

// bigTrace writes a trace of rows rows, to make a (re)load take time:
// 500,000 take about a second to parse (more under the race detector).
func bigTrace(t *testing.T, dir string, rows int) string {
	t.Helper()
	path := filepath.Join(dir, "big.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i := range rows {
		fmt.Fprintf(w, `{"timestamp": %d, "input_length": 64, "output_length": 1, "hash_ids": [%d, %d, %d, %d]}`+"\n", i*10, 4*i+1, 4*i+2, 4*i+3, 4*i+4)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// raceConfig replays the steady trace for ever against srvURL/version;
// with big set, a second workload replays that trace too.
func raceConfig(srvURL, version, steady, big string) config.Config {
	cfg := config.Config{Targets: []config.Target{daemontest.Target("t", srvURL+"/"+version)}}
	w := daemontest.Workload("steady", steady, "t")
	w.Loop = "repeat"
	cfg.Workloads = append(cfg.Workloads, w)
	if big != "" {
		w := daemontest.Workload("big", big, "t")
		w.Loop = "fresh"
		cfg.Workloads = append(cfg.Workloads, w)
	}
	return cfg
}

// raceDrain is the drain timeout of the shutdown races.
const raceDrain = 2 * time.Second

// raceInFlight is the max_in_flight of every workload of the shutdown
// races. Their server holds every request until the shutdown has halted
// dispatch, so a unit sends exactly this many, then drops its due rows,
// until then: what reaches the server after the shutdown began is decided
// by the daemon's state, not by how fast the machine is.
const raceInFlight = 2

// heldRaceConfig is raceConfig with every workload's max_in_flight
// raceInFlight.
func heldRaceConfig(srvURL, version, steady, big string) config.Config {
	cfg := raceConfig(srvURL, version, steady, big)
	for i := range cfg.Workloads {
		cfg.Workloads[i].MaxInFlight = raceInFlight
	}
	return cfg
}

// lateAllowed is how many requests may reach the server of a shutdown
// race after the shutdown began: the steady unit's dispatcher may be in
// the middle of sending a row as it is halted (one); when the reload was
// applied, its two units may have started before the halt, each sending
// up to raceInFlight rows and one more in the middle of being sent. A
// dispatch that went on after the halt sends a row every 20 ms once the
// held requests are answered; a reload's units started after it send the
// big trace's rows due at once.
func lateAllowed(reloadApplied bool) int {
	if reloadApplied {
		return 1 + 2*(raceInFlight+1)
	}
	return 1
}

// TestShutdownRacesReload: a shutdown close to a reload (just after one is
// asked for, just before, during a big trace's parse, while one is held
// before applying) ends everything, and dispatch stops at once: not ready
// means dispatch has halted, even while the owner goroutine is busy with
// the reload, and no request starts after that. (The daemon before package
// lifecycle drained while a reload was still applying the new
// configuration; the units it then started were never stopped.)
//
// The server holds every request until the daemon says it is no longer
// ready; only then may answers free a slot for a dispatch that went on.
func TestShutdownRacesReload(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		rows int // of the trace the reload adds
		// hold: the reload is held between parsing and applying until the
		// test releases it.
		hold bool
		// provoke asks for the reload and begins the shutdown by calling
		// shutdown, returning the reload's answer.
		provoke func(t *testing.T, d *started, shutdown func()) <-chan error
	}{
		{"reload then shutdown", 20_000, false, func(t *testing.T, d *started, shutdown func()) <-chan error {
			reloaded := make(chan error, 1)
			go func() { reloaded <- d.Reload(context.Background()) }()
			shutdown()
			return reloaded
		}},
		{"shutdown then reload", 20_000, false, func(t *testing.T, d *started, shutdown func()) <-chan error {
			shutdown()
			reloaded := make(chan error, 1)
			reloaded <- d.Reload(context.Background())
			return reloaded
		}},
		{"shutdown during a big trace's reload", 500_000, false, func(t *testing.T, d *started, shutdown func()) <-chan error {
			// The owner goroutine is idle until the reload: the count of
			// parses is read where the reload leaves it.
			parses := d.traces.stats.parses.Load
			before := parses()
			reloaded := make(chan error, 1)
			go func() { reloaded <- d.Reload(context.Background()) }()
			// The shutdown comes once the reload has begun to parse the
			// big trace, which takes about a second (more under -race);
			// should the parse be over first, the case is "reload then
			// shutdown".
			testutil.Eventually(t, "the reload's parse of the big trace begun", func() (bool, string) {
				n := parses()
				return n > before, fmt.Sprint(n, " traces parsed")
			})
			shutdown()
			return reloaded
		}},
		{"shutdown during a reload held before applying", 20_000, true, func(t *testing.T, d *started, shutdown func()) <-chan error {
			reloaded := make(chan error, 1)
			go func() { reloaded <- d.Reload(context.Background()) }()
			<-d.held
			// Held before applying, the owner goroutine changes no unit:
			// the steady one is read where the start left it.
			steady := d.units.byKey[unitKey{"steady", "t"}]
			// The owner goroutine is busy with the reload until released:
			// the halt, which shutdown waits for, must not wait for it.
			shutdown()
			// The held requests answered, the old unit has free slots
			// while the owner is still busy. Its replay must end all the
			// same: every request it sends, it sends before its end, and
			// a dispatch that went on would never end while the owner is
			// held.
			testutil.Wait(t, "the end of the steady unit's replay while the reload is held", steady.done)
			d.release()
			if err := <-reloaded; !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload: %v, want ErrShuttingDown", err)
			}
			reloaded <- ErrShuttingDown
			return reloaded
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			srv := newFakeServer(t, func(f *testutil.FakeServer) { f.Release = make(chan struct{}) })
			steady := daemontest.SteadyTrace(t, dir)
			path := filepath.Join(dir, "kvload.yml")
			daemontest.WriteConfig(t, path, heldRaceConfig(srv.URL, "a", steady, ""))
			held, release := make(chan struct{}, 1), make(chan struct{})
			first := true
			d, err := startDaemon(t, path, func(o *Options) {
				o.DrainTimeout = raceDrain
				o.beforeApply = func(ctx context.Context) {
					if first || !tt.hold {
						first = false // the first configuration goes through
						return
					}
					held <- struct{}{}
					<-release // a reload slow until the test says
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			// A failed wait in provoke leaves the reload held: the
			// cleanup lets it go before the daemon's waits for its end.
			d.held, d.release = held, sync.OnceFunc(func() { close(release) })
			t.Cleanup(d.release)
			testutil.Eventually(t, "the steady unit's slots all taken by held requests", func() (bool, string) {
				n := srv.Requests()
				return n == raceInFlight, fmt.Sprint(n, " requests")
			})
			// A changed configuration: the reload stops and starts units,
			// after parsing a new trace for a while.
			daemontest.WriteConfig(t, path, heldRaceConfig(srv.URL, "b", steady, bigTrace(t, dir, tt.rows)))
			var before int
			reloaded := tt.provoke(t, d, func() {
				before = srv.Requests()
				d.stop()
				testutil.Eventually(t, "not ready: dispatch halted", func() (bool, string) { return !d.Ready(), "ready" })
				close(srv.Release)
			})
			testutil.Wait(t, "the daemon's end after the shutdown began", d.Done())
			err = <-reloaded
			if err != nil && !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload: %v, want nil or ErrShuttingDown", err)
			}
			late := srv.Requests() - before
			t.Logf("%d requests before the shutdown began, %d after it; reload: %v", before, late, err)
			if want := lateAllowed(err == nil); late > want {
				t.Errorf("%d requests reached the server after the shutdown began, want at most %d", late, want)
			}
		})
	}
}

// TestShutdownDuringFirstLoad: a shutdown during the first load ends it at
// once: Start answers ErrShuttingDown, nothing is sent. (Before, the load
// finished, every unit started and sent the rows due at once, and only
// then drained.) The load is held between parsing and applying until the
// shutdown, so that the shutdown surely comes during it.
func TestShutdownDuringFirstLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := newFakeServer(t, nil)
	path := filepath.Join(dir, "kvload.yml")
	daemontest.WriteConfig(t, path, raceConfig(srv.URL, "a", daemontest.SteadyTrace(t, dir), bigTrace(t, dir, 20_000)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make(chan struct{}, 1)
	d := New(Options{ConfigFile: path, DrainTimeout: raceDrain, Collector: collector.New(prometheus.NewRegistry()),
		beforeApply: func(ctx context.Context) {
			held <- struct{}{}
			<-ctx.Done()
		}})
	started := make(chan error, 1)
	go func() { started <- d.Start(ctx) }()
	<-held
	cancel()
	testutil.Wait(t, "the daemon's end after the shutdown began", d.Done())
	if err := <-started; !errors.Is(err, ErrShuttingDown) {
		t.Errorf("Start: %v, want ErrShuttingDown", err)
	}
	if n := srv.Requests(); n != 0 {
		t.Errorf("%d requests sent, want none", n)
	}
}

// twoWorkloads is a configuration whose workloads (one for each name) each
// send to their own path of srvURL, so that the server tells which
// configuration runs.
func twoWorkloads(srvURL, trace string, names ...string) config.Config {
	var cfg config.Config
	for _, n := range names {
		cfg.Targets = append(cfg.Targets, daemontest.Target("t-"+n, srvURL+"/"+n))
		cfg.Workloads = append(cfg.Workloads, daemontest.Workload(n, trace, "t-"+n))
	}
	return cfg
}

// TestShutdownIsAState: once the shutdown began, a reload, asked for
// before or after it, answers ErrShuttingDown and starts nothing; a
// reload being applied when it begins is abandoned before any unit starts.
func TestShutdownIsAState(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// during: cancel while the reload is between parsing and applying.
		during bool
	}{
		{"reload after the shutdown began", false},
		{"shutdown during a slow reload", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, nil)
			path := filepath.Join(t.TempDir(), "kvload.yml")
			trace := fixture(t, "future.jsonl")
			daemontest.WriteConfig(t, path, twoWorkloads(srv.URL, trace, "old"))
			entered := make(chan struct{}, 1)
			var armed bool
			d, err := startDaemon(t, path, func(o *Options) {
				o.beforeApply = func(ctx context.Context) {
					if !armed { // the first configuration goes through
						armed = true
						return
					}
					entered <- struct{}{}
					<-ctx.Done() // slow until the shutdown
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, "the first configuration sending", func() (bool, string) {
				n := srv.Count("/old/v1/chat/completions")
				return n == 2, fmt.Sprint(n)
			})
			daemontest.WriteConfig(t, path, twoWorkloads(srv.URL, trace, "new"))

			reloaded := make(chan error, 1)
			if tt.during {
				go func() { reloaded <- d.Reload(context.Background()) }()
				<-entered
				d.stop()
			} else {
				d.stop()
				reloaded <- d.Reload(context.Background())
			}
			if err := testutil.Wait(t, "the reload's answer", reloaded); !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload: %v, want ErrShuttingDown", err)
			}
			testutil.Wait(t, "the daemon stopped", d.Done())
			if err := d.Reload(context.Background()); !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload after the stop: %v, want ErrShuttingDown", err)
			}
			if d.Ready() {
				t.Error("ready after the shutdown")
			}
			if n := srv.Count("/new/v1/chat/completions"); n != 0 {
				t.Errorf("the configuration asked for during the shutdown sent %d requests", n)
			}
			if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 1 {
				t.Errorf("kvload_config_last_reload_successful %v: an abandoned reload is not a failed one", v)
			}
		})
	}
}

// watching is a daemon reloading on file changes, with its log.
// With a timer, the watch measures its quiet on it.
func watching(t *testing.T, path string, timer replay.DispatchTimer) (*started, *testutil.Buffer) {
	t.Helper()
	var logs testutil.Buffer
	d, err := startDaemon(t, path, func(o *Options) {
		o.Watch = true
		o.watchTimer = timer
		o.Logger = log.NewLogfmtLogger(&logs)
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, &logs
}

// appliedModel is the model of the running target t, and how many
// configurations were applied so far according to the log.
func appliedModel(d *started, logs *testutil.Buffer) (string, int) {
	model := ""
	for _, tg := range d.Status().Targets {
		if tg.Name == "t" {
			model = tg.Model
		}
	}
	return model, strings.Count(logs.String(), `msg="configuration applied"`)
}

// watchConfig is a valid configuration whose target model tells which
// version of the file was applied.
func watchConfig(srvURL, trace, model string) config.Config {
	cfg := daemontest.Config(srvURL, trace)
	cfg.Targets[0].Model = model
	return cfg
}

// TestWatchCoalescesWrites: ten writes of the file within a fraction of the
// debounce, each leaving it half-written (invalid) for a moment, give
// exactly one reload, of the last version, and no rejection. The watch's
// quiet is measured on a fake clock, which moves only as the test says: a
// stalled write (a slow fsync) cannot pass for the end of the burst.
func TestWatchCoalescesWrites(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	daemontest.WriteConfig(t, path, watchConfig(srv.URL, trace, "m-initial"))
	clock := testutil.NewClock()
	d, logs := watching(t, path, clock.NewTimer())
	if model, applied := appliedModel(d, logs); model != "m-initial" || applied != 1 {
		t.Fatalf("at start: model %q, %d applied", model, applied)
	}

	// Paced like an editor or a config tool, 20 ms apart on the clock,
	// well under the 500 ms debounce.
	for i := range 10 {
		if i > 0 {
			clock.Advance(20 * time.Millisecond)
		}
		content := string(daemontest.Marshal(t, watchConfig(srv.URL, trace, fmt.Sprintf("m-%d", i))))
		half := strings.Index(content, "workloads:") // targets only: invalid
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err1 := f.WriteString(content[:half])
		err2 := f.Sync()
		_, err3 := f.WriteString(content[half:])
		if err := errors.Join(err1, err2, err3, f.Close()); err != nil {
			t.Fatal(err)
		}
	}
	// The burst over, the quiet lasts: each look moves the clock past the
	// debounce, whenever the watch took in the writes' events.
	testutil.Eventually(t, "the last write applied", func() (bool, string) {
		clock.Advance(reloadDebounce)
		model, applied := appliedModel(d, logs)
		return model == "m-9" && applied >= 2, fmt.Sprintf("model %q, %d applied", model, applied)
	})
	// A reload asked for now is served after any the writes caused: once
	// it answered, every one of those has been applied or skipped.
	if err := d.request(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	if _, applied := appliedModel(d, logs); applied != 2 {
		t.Errorf("%d configurations applied, want 2 (the initial one and one reload):\n%s", applied, logs)
	}
	if strings.Contains(logs.String(), "configuration rejected") {
		t.Errorf("a half-written file was loaded:\n%s", logs)
	}
	if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 1 {
		t.Errorf("kvload_config_last_reload_successful %v, want 1", v)
	}
}

// TestWatchSymlinkSwap: a ConfigMap volume's update, where the kubelet
// re-points ..data at a new directory in one rename, is applied, trace and
// all.
func TestWatchSymlinkSwap(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	trace, err := os.ReadFile(fixture(t, "future.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	version := func(name, model string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		daemontest.WriteConfig(t, filepath.Join(dir, name, "kvload.yml"), watchConfig(srv.URL, "trace.jsonl", model))
		daemontest.WriteFile(t, filepath.Join(dir, name, "trace.jsonl"), trace)
	}
	symlink := func(target, name string) {
		t.Helper()
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "m-v1")
	symlink("..v1", "..data")
	symlink("..data/kvload.yml", "kvload.yml")
	symlink("..data/trace.jsonl", "trace.jsonl")

	d, logs := watching(t, filepath.Join(dir, "kvload.yml"), nil)
	if model, _ := appliedModel(d, logs); model != "m-v1" {
		t.Fatalf("at start: model %q", model)
	}
	version("..v2", "m-v2")
	symlink("..v2", "..data_tmp")
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the swapped configuration applied", func() (bool, string) {
		model, applied := appliedModel(d, logs)
		return model == "m-v2", fmt.Sprintf("model %q, %d applied", model, applied)
	})
	if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 1 {
		t.Errorf("kvload_config_last_reload_successful %v, want 1", v)
	}
}
