package lifecycle

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

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

// raceLate bounds how many requests may reach the server after the
// shutdown began: those the daemon had handed to its client just before,
// a few rows of the steady trace (one every 20 ms; 1 to 5 seen under
// -race on an idle machine, 16 on one running seven builds). A dispatch
// that went on would send one every 20 ms through the drain (about 100),
// or through the second a held reload keeps the owner busy (about 50); a
// reload's units started after the shutdown would send the big trace's
// rows due at once.
const raceLate = 25

// slowServer answers every request after 300 ms, so that requests are in
// flight when the shutdown begins and the drain lasts a while.
func slowServer(t *testing.T) *testutil.FakeServer {
	return newFakeServer(t, func(f *testutil.FakeServer) {
		f.Hold = func(r *http.Request) bool {
			select {
			case <-time.After(300 * time.Millisecond):
				return true
			case <-r.Context().Done():
				return false
			}
		}
	})
}

// checkEnd waits for done (the daemon's end: it comes, within the test's
// deadline) and checks that at most raceLate requests reached srv after
// the shutdown began, when srv had seen before.
func checkEnd(t *testing.T, srv *testutil.FakeServer, before int, done <-chan struct{}) {
	t.Helper()
	testutil.Wait(t, "the daemon's end after the shutdown began", done)
	after := srv.Requests()
	t.Logf("%d requests before the shutdown began, %d after it", before, after-before)
	if late := after - before; late > raceLate {
		t.Errorf("%d requests reached the server after the shutdown began, want at most %d (those already handed to the client)", late, raceLate)
	}
}

// TestShutdownRacesReload: a shutdown close to a reload (just after one is
// asked for, just before, 0.3 s into a slow one) ends everything, and
// dispatch stops at once: no request starts after the shutdown began. (The
// daemon before package lifecycle drained while a reload was still
// applying the new configuration; the units it then started were never
// stopped.)
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
		{"shutdown 0.3 s into a big trace's reload", 500_000, false, func(t *testing.T, d *started, shutdown func()) <-chan error {
			reloaded := make(chan error, 1)
			go func() { reloaded <- d.Reload(context.Background()) }()
			// The stimulus's timing, not a synchronisation: the reload
			// parses for about a second (more under -race).
			<-time.After(300 * time.Millisecond)
			shutdown()
			return reloaded
		}},
		{"shutdown 0.3 s into a reload held before applying", 20_000, true, func(t *testing.T, d *started, shutdown func()) <-chan error {
			reloaded := make(chan error, 1)
			go func() { reloaded <- d.Reload(context.Background()) }()
			<-d.held
			// The old units dispatch meanwhile; the owner goroutine is
			// busy with the reload when the shutdown begins, and stays so
			// for a second more: dispatch must not wait for it.
			<-time.After(300 * time.Millisecond)
			shutdown()
			<-time.After(time.Second)
			close(d.release)
			if err := <-reloaded; !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload: %v, want ErrShuttingDown", err)
			}
			reloaded <- nil
			return reloaded
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			srv := slowServer(t)
			steady := daemontest.SteadyTrace(t, dir)
			path := filepath.Join(dir, "kvload.yml")
			daemontest.WriteConfig(t, path, raceConfig(srv.URL, "a", steady, ""))
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
			d.held, d.release = held, release
			testutil.Eventually(t, "requests flowing", func() (bool, string) {
				n := srv.Requests()
				return n >= 5, fmt.Sprint(n, " requests")
			})
			// A changed configuration: the reload stops and starts units,
			// after parsing a new trace for a while.
			daemontest.WriteConfig(t, path, raceConfig(srv.URL, "b", steady, bigTrace(t, dir, tt.rows)))
			var before int
			reloaded := tt.provoke(t, d, func() {
				before = srv.Requests()
				d.stop()
			})
			checkEnd(t, srv, before, d.Done())
			if err := <-reloaded; err != nil && !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload: %v, want nil or ErrShuttingDown", err)
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
