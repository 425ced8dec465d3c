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
// for model, with at most signalInFlight requests in flight.
func steadyConfig(srvURL, model, steady string) config.Config {
	cfg := daemontest.Config(srvURL, steady)
	cfg.Targets[0].Model = model
	cfg.Workloads[0].Name, cfg.Workloads[0].Loop = "steady", "repeat"
	cfg.Workloads[0].MaxInFlight = signalInFlight
	return cfg
}

// signalInFlight is the steady workload's max_in_flight. The server holds
// every request until the daemon says it is no longer ready, so a unit
// sends exactly this many, then drops its due rows, until then: what
// reaches the server after SIGTERM is decided by the daemon's state, not
// by how fast the machine is.
const signalInFlight = 2

// signalLateAllowed is how many requests may reach the server after
// SIGTERM was sent: the unit's dispatcher may be in the middle of sending
// a row as it is halted (one); when the SIGHUP's reload was applied, its
// new unit may have sent up to signalInFlight rows and one more in the
// middle of being sent. A dispatch that went on through the drain sends a
// row every 20 ms once the held requests are answered.
func signalLateAllowed(reloadApplied bool) int {
	if reloadApplied {
		return 1 + signalInFlight + 1
	}
	return 1
}

// TestDaemonSignalsReachLifecycle is the wiring of SIGHUP and SIGTERM in a
// real process: SIGHUP asks for a reload, SIGTERM (alone, or just after a
// SIGHUP) ends the process with status 0, and dispatch stops with it: once
// GET /-/ready says not ready, no request starts. What the lifecycle does
// with them is tested in package lifecycle (TestShutdownRacesReload,
// TestShutdownDrains).
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
			// Every request waits until dispatch has halted: requests are
			// in flight when the signals come, and no slot frees before.
			srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) { f.Release = make(chan struct{}) })
			steady := daemontest.SteadyTrace(t, dir)
			path := filepath.Join(dir, "kvload.yml")
			daemontest.WriteConfig(t, path, steadyConfig(srv.URL, "a", steady))
			p := startProcess(t, "--config.file="+path, "--web.listen-address=127.0.0.1:0",
				"--shutdown.drain-timeout="+drain.String())
			p.waitListening(t)
			testutil.Eventually(t, "the unit's slots all taken by held requests", func() (bool, string) {
				n := srv.Requests()
				return n == signalInFlight, fmt.Sprint(n, " requests")
			})
			daemontest.WriteConfig(t, path, steadyConfig(srv.URL, "b", steady))
			var before int
			tt.provoke(t, p, func() {
				before = srv.Requests()
				p.signal(t, syscall.SIGTERM)
				testutil.Eventually(t, "not ready: dispatch halted", func() (bool, string) {
					code := readyStatus(t, p.base)
					return code == http.StatusServiceUnavailable, fmt.Sprint("GET /-/ready: ", code)
				})
				close(srv.Release)
			})

			testutil.Wait(t, "the exit after SIGTERM", p.exited)
			if p.err != nil {
				t.Errorf("exit: %v, want status 0\n%s", p.err, p.stderr.String())
			}
			late := srv.Requests() - before
			applied := strings.Count(p.stderr.String(), `msg="configuration applied"`) == 2
			t.Logf("%d requests before SIGTERM, %d after it; reload applied: %v", before, late, applied)
			if want := signalLateAllowed(applied); late > want {
				t.Errorf("%d requests reached the server after SIGTERM, want at most %d", late, want)
			}
			for _, line := range []string{`msg=drained `, `msg=stopped`} {
				if !strings.Contains(p.stderr.String(), line) {
					t.Errorf("the log lacks %q:\n%s", line, p.stderr.String())
				}
			}
		})
	}
}

// readyStatus is the status of GET /-/ready at base; 0 when there is no
// answer.
func readyStatus(t *testing.T, base string) int {
	t.Helper()
	resp, err := http.Get(base + "/-/ready")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
