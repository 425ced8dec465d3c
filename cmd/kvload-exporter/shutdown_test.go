package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testconfig"
)

// process is the program re-executed as a child, as main runs it.
type process struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	base   string        // http://127.0.0.1:PORT, once listening
	exited chan struct{} // closed once err is set
	err    error
}

// startProcess runs the program with args; the test's cleanup kills it if
// it is still running.
func startProcess(t *testing.T, args ...string) *process {
	t.Helper()
	return startProcessEnv(t, nil, args...)
}

// startProcessEnv is startProcess with more environment variables.
func startProcessEnv(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	p := &process{stderr: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(append(os.Environ(), runMainEnv+"=1"), env...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// waitListening waits for the address the process bound.
func (p *process) waitListening(t *testing.T) {
	t.Helper()
	eventually(t, "process listening", func() (bool, string) {
		select {
		case <-p.exited:
			t.Fatalf("exited before listening (%v):\n%s", p.err, p.stderr.String())
		default:
		}
		m := listenRE.FindStringSubmatch(p.stderr.String())
		if m == nil {
			return false, p.stderr.String()
		}
		p.base = "http://" + m[1]
		return true, ""
	})
}

func (p *process) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// steadyConfig replays the steady trace for ever against srvURL/model.
func steadyConfig(srvURL, model, steady string) string {
	return fmt.Sprintf(`targets:
  - {name: t, url: %s, model: %s, dialect: vllm}
workloads:
  - {name: steady, trace: %s, targets: [t], block_size: 16, loop: repeat}
`, srvURL, model, steady)
}

// TestDaemonSignalsReachLifecycle is the wiring of SIGHUP and SIGTERM in a
// real process: SIGHUP asks for a reload, SIGTERM (alone, or just after a
// SIGHUP) ends the process with status 0 within the drain timeout plus a
// second, and no request leaves more than 0.5 s after it (issue 14's
// acceptance). What the lifecycle does with them is tested in package
// lifecycle (TestShutdownRacesReload, TestShutdownDrains).
func TestDaemonSignalsReachLifecycle(t *testing.T) {
	t.Parallel()
	const (
		drain       = 2 * time.Second
		exitBound   = drain + time.Second
		lastRequest = 500 * time.Millisecond
	)
	tests := []struct {
		name string
		// provoke sends the signals; it returns when SIGTERM was sent.
		provoke func(t *testing.T, p *process) time.Time
	}{
		{"SIGTERM", func(t *testing.T, p *process) time.Time {
			now := time.Now()
			p.signal(t, syscall.SIGTERM)
			return now
		}},
		{"SIGHUP and its reload then SIGTERM", func(t *testing.T, p *process) time.Time {
			p.signal(t, syscall.SIGHUP)
			eventually(t, "the changed configuration applied", func() (bool, string) {
				return strings.Count(p.stderr.String(), `msg="configuration applied"`) == 2, p.stderr.String()
			})
			now := time.Now()
			p.signal(t, syscall.SIGTERM)
			return now
		}},
		{"SIGHUP then SIGTERM at once", func(t *testing.T, p *process) time.Time {
			p.signal(t, syscall.SIGHUP)
			now := time.Now()
			p.signal(t, syscall.SIGTERM)
			return now
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			// Every answer takes 300 ms, so that requests are in flight when
			// the signals come and the drain lasts a while.
			srv := newFakeServer(t, func(f *fakeServer) {
				f.fail = func(r *http.Request, _ int) (int, string) {
					select {
					case <-time.After(300 * time.Millisecond):
					case <-r.Context().Done():
					}
					return 0, ""
				}
			})
			steady := testconfig.SteadyTrace(t, dir)
			path := filepath.Join(dir, "kvload.yml")
			writeConfig(t, path, steadyConfig(srv.URL, "a", steady))
			p := startProcess(t, "--config.file="+path, "--web.listen-address=127.0.0.1:0",
				"--shutdown.drain-timeout="+drain.String())
			p.waitListening(t)
			eventually(t, "requests flowing", func() (bool, string) {
				_, n := srv.lastArrival()
				return n >= 5, fmt.Sprint(n, " requests")
			})
			writeConfig(t, path, steadyConfig(srv.URL, "b", steady))
			sigterm := tt.provoke(t, p)

			select {
			case <-p.exited:
				took := time.Since(sigterm)
				last, _ := srv.lastArrival()
				t.Logf("exited %v after SIGTERM; last request %v after it", took.Round(time.Millisecond), last.Sub(sigterm).Round(time.Millisecond))
				if took > exitBound {
					t.Errorf("exited %v after SIGTERM, want within %v", took, exitBound)
				}
				if p.err != nil {
					t.Errorf("exit: %v, want status 0\n%s", p.err, p.stderr.String())
				}
			case <-time.After(exitBound):
				t.Fatalf("still running %v after SIGTERM:\n%s", exitBound, p.stderr.String())
			}
			if last, _ := srv.lastArrival(); last.Sub(sigterm) > lastRequest {
				t.Errorf("a request arrived %v after SIGTERM, want at most %v", last.Sub(sigterm), lastRequest)
			}
			for _, line := range []string{`msg=drained `, `msg=stopped`} {
				if !strings.Contains(p.stderr.String(), line) {
					t.Errorf("the log lacks %q:\n%s", line, p.stderr.String())
				}
			}
		})
	}
}
