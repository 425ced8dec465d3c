package dashtest

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// binary returns the path in env, or builds pkg (in the module at dir).
func binary(t *testing.T, env, dir, pkg, out string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(abs); err != nil {
			t.Fatalf("%s: %v", env, err)
		}
		return abs
	}
	bin := filepath.Join(out, filepath.Base(pkg))
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s unset; go build %s: %v\n%s", env, pkg, err, b)
	}
	t.Logf("%s unset: built %s in %v", env, pkg, time.Since(start).Round(time.Second))
	return bin
}

// freeAddr picks a free port on 127.0.0.1.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// process is a long-lived child process; done is closed when it exits.
type process struct {
	name   string
	cmd    *exec.Cmd
	done   chan struct{}
	err    error // valid after done is closed
	killed bool  // by kill: its exit is expected
}

// kill ends the process and its own children at once (SIGKILL), as a
// crash or an OOM kill would, and waits until it has exited.
func (p *process) kill() {
	p.killed = true
	killGroup(p.cmd)
	<-p.done
}

// startProcess runs a long-lived process with its output in dir/name.log;
// it is stopped (SIGTERM, then SIGKILL) when the test ends, and its log
// tail is printed if the test failed.
func startProcess(t *testing.T, dir, name, bin string, args ...string) *process {
	t.Helper()
	return startProcessEnv(t, dir, name, nil, bin, args...)
}

// startProcessEnv is startProcess with env added to the test's own
// environment.
func startProcessEnv(t *testing.T, dir, name string, env []string, bin string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
			if !p.killed {
				t.Errorf("%s exited early: %v", name, p.err)
			}
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(15 * time.Second):
				killGroup(cmd)
				<-p.done
			}
		}
		logf.Close()
		if t.Failed() {
			t.Logf("--- tail of %s:\n%s", logPath, tail(logPath, 30))
		}
	})
	return p
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// waitHTTP polls url until it answers 200; it gives up at once if p exits.
func waitHTTP(t *testing.T, p *process, url string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	client := &http.Client{Timeout: 5 * time.Second}
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within %v: %v", url, within, err)
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before %s was ready: %v", p.name, url, p.err)
		case <-time.After(200 * time.Millisecond): // polling interval
		}
	}
}

func run(t *testing.T, bin string, args ...string) {
	t.Helper()
	// Bounded by the test binary's -timeout, not a clock of its own: a
	// loaded machine makes promtool slower, not wrong.
	out, err := exec.CommandContext(t.Context(), bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args[:2], " "), err, out)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// failureRecap keeps a test's failure messages and says them again at the
// end of its output, after the tails of the processes' logs that a failing
// test prints: a CI log cut to its last lines still shows why it failed.
type failureRecap struct {
	failures []string
}

// recapFailures registers the recap. Register it before starting the
// test's processes: cleanups run last first, so it then prints after
// their log tails.
func (r *failureRecap) recapFailures(t *testing.T) {
	t.Cleanup(func() {
		if len(r.failures) > 0 {
			t.Logf("failed (%d):\n  %s", len(r.failures), strings.Join(r.failures, "\n  "))
		}
	})
}

// errorf fails the test and keeps the message for the recap.
func (r *failureRecap) errorf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	r.failures = append(r.failures, msg)
	t.Error(msg)
}

// fatalf is errorf, then stops the test.
func (r *failureRecap) fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	r.errorf(t, format, args...)
	t.FailNow()
}

// newFailureRecap is a registered recap for a test without a scenario.
func newFailureRecap(t *testing.T) *failureRecap {
	r := &failureRecap{}
	r.recapFailures(t)
	return r
}
