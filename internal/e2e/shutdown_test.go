package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// steadyConfig replays the steady trace for ever against srvURL, asking
// for model.
func steadyConfig(srvURL, model, steady string) config.Config {
	cfg := daemontest.Config(srvURL, steady)
	cfg.Targets[0].Model = model
	cfg.Workloads[0].Name, cfg.Workloads[0].Loop = "steady", "repeat"
	return cfg
}

// signalLate bounds how many requests may reach the server after SIGTERM
// was sent: those the daemon had handed to its client before the signal
// reached it, a few rows of the steady trace (one every 20 ms; 25 for
// 0.5 s). A dispatch that went on through the drain would send about 100.
const signalLate = 25

// TestDaemonSignalsReachLifecycle is the wiring of SIGHUP and SIGTERM in a
// real process: SIGHUP asks for a reload, SIGTERM (alone, or just after a
// SIGHUP) ends the process with status 0, and dispatch stops with it: at
// most a handful of requests reach the server after SIGTERM, the bound a
// clean shutdown must keep. What the lifecycle does with them is tested in
// package lifecycle (TestShutdownRacesReload, TestShutdownDrains).
func TestDaemonSignalsReachLifecycle(t *testing.T) {
	t.Parallel()
	const drain = 2 * time.Second
	tests := []struct {
		name string
		// provoke sends the signals, SIGTERM by calling sigterm.
		provoke func(t *testing.T, p *process, sigterm func())
	}{
		{"SIGTERM", func(t *testing.T, p *process, sigterm func()) {
			sigterm()
		}},
		{"SIGHUP and its reload then SIGTERM", func(t *testing.T, p *process, sigterm func()) {
			p.signal(t, syscall.SIGHUP)
			testutil.Eventually(t, "the changed configuration applied", func() (bool, string) {
				return strings.Count(p.stderr.String(), `msg="configuration applied"`) == 2, p.stderr.String()
			})
			sigterm()
		}},
		{"SIGHUP then SIGTERM at once", func(t *testing.T, p *process, sigterm func()) {
			p.signal(t, syscall.SIGHUP)
			sigterm()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			// Every answer takes 300 ms, so that requests are in flight when
			// the signals come and the drain lasts a while.
			srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) {
				f.Hold = func(r *http.Request) bool {
					select {
					case <-time.After(300 * time.Millisecond):
						return true
					case <-r.Context().Done():
						return false
					}
				}
			})
			steady := daemontest.SteadyTrace(t, dir)
			path := filepath.Join(dir, "kvload.yml")
			daemontest.WriteConfig(t, path, steadyConfig(srv.URL, "a", steady))
			p := startProcess(t, "--config.file="+path, "--web.listen-address=127.0.0.1:0",
				"--shutdown.drain-timeout="+drain.String())
			p.waitListening(t)
			testutil.Eventually(t, "requests flowing", func() (bool, string) {
				n := srv.Requests()
				return n >= 5, fmt.Sprint(n, " requests")
			})
			daemontest.WriteConfig(t, path, steadyConfig(srv.URL, "b", steady))
			var before int
			tt.provoke(t, p, func() {
				before = srv.Requests()
				p.signal(t, syscall.SIGTERM)
			})

			testutil.Wait(t, "the exit after SIGTERM", p.exited)
			if p.err != nil {
				t.Errorf("exit: %v, want status 0\n%s", p.err, p.stderr.String())
			}
			late := srv.Requests() - before
			t.Logf("%d requests before SIGTERM, %d after it", before, late)
			if late > signalLate {
				t.Errorf("%d requests reached the server after SIGTERM, want at most %d (those already handed to the client)", late, signalLate)
			}
			for _, line := range []string{`msg=drained `, `msg=stopped`} {
				if !strings.Contains(p.stderr.String(), line) {
					t.Errorf("the log lacks %q:\n%s", line, p.stderr.String())
				}
			}
		})
	}
}
