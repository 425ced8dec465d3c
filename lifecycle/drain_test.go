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
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/internal/testconfig"
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
			srv := newHoldingServer(t, func(r *http.Request) bool {
				if !strings.HasSuffix(r.URL.Path, "/chat/completions") {
					return true // the cache discovery's /metrics
				}
				select {
				case <-release:
					return true
				case <-r.Context().Done():
					return false
				}
			})
			t.Cleanup(func() {
				defer func() { _ = recover() }() // closed already by the test
				close(release)
			})
			path := filepath.Join(t.TempDir(), "kvload.yml")
			writeConfig(t, path, twoWorkloads(srv.URL, fixture(t, "held.jsonl"), "w"))
			d, err := startDaemon(t, path, func(o *Options) { o.DrainTimeout = tt.drain })
			if err != nil {
				t.Fatal(err)
			}
			counts := func() (inFlight, success float64) {
				mfs := gatherFamilies(t, d.reg)
				inFlight, _ = mfs.value("kvload_requests_in_flight")
				success, _ = mfs.value("kvload_requests_total", "outcome", "success")
				return inFlight, success
			}
			eventually(t, "three requests in flight", func() (bool, string) {
				f, _ := counts()
				return f == 3 && srv.count("/w/v1/chat/completions") == 3, fmt.Sprint(f, " in flight")
			})

			d.stop()
			if tt.release {
				eventually(t, "not ready while draining", func() (bool, string) { return !d.Ready(), "ready" })
				if f, _ := counts(); f != 3 {
					t.Errorf("%v requests in flight during the drain, want 3", f)
				}
				// Two finish during the drain and are counted at once.
				release <- struct{}{}
				release <- struct{}{}
				eventually(t, "two released requests counted during the drain", func() (bool, string) {
					f, s := counts()
					return f == 1 && s == 2, fmt.Sprintf("%v in flight, %v succeeded", f, s)
				})
				release <- struct{}{}
			}
			select {
			case <-d.Done():
			case <-time.After(pollDeadline):
				t.Fatal("the daemon never stopped")
			}
			mfs := gatherFamilies(t, d.reg)
			for outcome, want := range tt.want {
				if got, _ := mfs.value("kvload_requests_total", "outcome", outcome); got != want {
					t.Errorf("%s: %v requests, want %v", outcome, got, want)
				}
			}
			if f, _ := mfs.value("kvload_requests_in_flight"); f != 0 {
				t.Errorf("%v requests in flight after the drain", f)
			}
			if n := srv.count("/w/v1/chat/completions"); n != 3 {
				t.Errorf("the server saw %d requests, want 3 (the hour-later row is never due)", n)
			}
			if !tt.release {
				eventually(t, "the held requests ended by the client", func() (bool, string) {
					srv.mu.Lock()
					defer srv.mu.Unlock()
					return srv.ended == 3, fmt.Sprint(srv.ended, " ended of ", srv.arrived)
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
func raceConfig(srvURL, version, steady, big string) string {
	cfg := fmt.Sprintf(`targets:
  - {name: t, url: %s/%s, model: m, dialect: vllm}
workloads:
  - {name: steady, trace: %s, targets: [t], block_size: 16, loop: repeat}
`, srvURL, version, steady)
	if big != "" {
		cfg += fmt.Sprintf("  - {name: big, trace: %s, targets: [t], block_size: 16, loop: fresh}\n", big)
	}
	return cfg
}

// Bounds of the shutdown: everything is over within the drain timeout plus
// a second (issue 14's acceptance), and no request arrives more than a
// small margin after the shutdown began: the margin covers a request
// handed to the client just before, and the server's own delay in seeing
// it on a loaded machine (up to 115 ms seen under -race while a big trace
// was being parsed on both cores). The acceptance allows 0.5 s.
const (
	raceDrain      = 2 * time.Second
	raceExitBound  = raceDrain + time.Second
	raceSendMargin = 200 * time.Millisecond
)

// slowServer answers every request after 300 ms, so that requests are in
// flight when the shutdown begins and the drain lasts a while.
func slowServer(t *testing.T) *fakeServer {
	return newHoldingServer(t, func(r *http.Request) bool {
		select {
		case <-time.After(300 * time.Millisecond):
			return true
		case <-r.Context().Done():
			return false
		}
	})
}

// checkQuickEnd waits for done and checks the bounds against stop, the
// moment the shutdown began.
func checkQuickEnd(t *testing.T, srv *fakeServer, stop time.Time, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(raceExitBound):
		t.Fatalf("still running %v after the shutdown began", raceExitBound)
	}
	took := time.Since(stop)
	last, n := srv.lastArrival()
	if took > raceExitBound {
		t.Errorf("over %v after the shutdown began, want within %v", took, raceExitBound)
	}
	if n == 0 {
		t.Logf("over %v after the shutdown began; no request sent", took.Round(time.Millisecond))
		return
	}
	t.Logf("over %v after the shutdown began; last of %d requests arrived %v after it", took.Round(time.Millisecond), n, last.Sub(stop).Round(time.Millisecond))
	if late := last.Sub(stop); late > raceSendMargin {
		t.Errorf("a request arrived %v after the shutdown began, want none after %v", late, raceSendMargin)
	}
}

// TestShutdownRacesReload: a shutdown close to a reload (just after one is
// asked for, just before, 0.3 s into a slow one) ends everything within the
// drain timeout plus a second, and dispatch stops at once: no request
// starts after the shutdown began. (The daemon before package lifecycle
// drained while a reload was still applying the new configuration; the
// units it then started were never stopped.)
func TestShutdownRacesReload(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		rows int // of the trace the reload adds
		// provoke asks for the reload and begins the shutdown, returning
		// when it began and the reload's answer.
		provoke func(t *testing.T, d *started) (time.Time, <-chan error)
	}{
		{"reload then shutdown", 20_000, func(t *testing.T, d *started) (time.Time, <-chan error) {
			reloaded := make(chan error, 1)
			go func() { reloaded <- d.Reload(context.Background()) }()
			now := time.Now()
			d.stop()
			return now, reloaded
		}},
		{"shutdown then reload", 20_000, func(t *testing.T, d *started) (time.Time, <-chan error) {
			now := time.Now()
			d.stop()
			reloaded := make(chan error, 1)
			reloaded <- d.Reload(context.Background())
			return now, reloaded
		}},
		{"shutdown 0.3 s into a big trace's reload", 500_000, func(t *testing.T, d *started) (time.Time, <-chan error) {
			reloaded := make(chan error, 1)
			go func() { reloaded <- d.Reload(context.Background()) }()
			// The stimulus's timing, not a synchronisation: the reload
			// parses for about a second (more under -race).
			<-time.After(300 * time.Millisecond)
			now := time.Now()
			d.stop()
			return now, reloaded
		}},
		{"shutdown 0.3 s into a reload held before applying", 20_000, func(t *testing.T, d *started) (time.Time, <-chan error) {
			reloaded := make(chan error, 1)
			go func() { reloaded <- d.Reload(context.Background()) }()
			<-d.held
			// The old units dispatch meanwhile; the owner goroutine is
			// busy with the reload when the shutdown begins, and stays so
			// for 0.45 s more: dispatch must not wait for it.
			<-time.After(300 * time.Millisecond)
			now := time.Now()
			d.stop()
			<-time.After(450 * time.Millisecond)
			close(d.release)
			if err := <-reloaded; !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload: %v, want ErrShuttingDown", err)
			}
			reloaded <- nil
			return now, reloaded
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			srv := slowServer(t)
			steady := testconfig.SteadyTrace(t, dir)
			path := filepath.Join(dir, "kvload.yml")
			writeConfig(t, path, raceConfig(srv.URL, "a", steady, ""))
			held, release := make(chan struct{}, 1), make(chan struct{})
			first := true
			d, err := startDaemon(t, path, func(o *Options) {
				o.DrainTimeout = raceDrain
				o.beforeApply = func(ctx context.Context) {
					if first || !strings.Contains(tt.name, "held") {
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
			eventually(t, "requests flowing", func() (bool, string) {
				_, n := srv.lastArrival()
				return n >= 5, fmt.Sprint(n, " requests")
			})
			// A changed configuration: the reload stops and starts units,
			// after parsing a new trace for a while.
			writeConfig(t, path, raceConfig(srv.URL, "b", steady, bigTrace(t, dir, tt.rows)))
			stop, reloaded := tt.provoke(t, d)
			checkQuickEnd(t, srv, stop, d.Done())
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
	srv := newFakeServer(t)
	path := filepath.Join(dir, "kvload.yml")
	writeConfig(t, path, raceConfig(srv.URL, "a", testconfig.SteadyTrace(t, dir), bigTrace(t, dir, 20_000)))
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
	stop := time.Now()
	cancel()
	checkQuickEnd(t, srv, stop, d.Done())
	if err := <-started; !errors.Is(err, ErrShuttingDown) {
		t.Errorf("Start: %v, want ErrShuttingDown", err)
	}
	if _, n := srv.lastArrival(); n != 0 {
		t.Errorf("%d requests sent, want none", n)
	}
}
