package e2e

// Whole-program scenarios: the program (internal/cli) run as a user runs
// it, against emulated engines, fake servers and bad input. This file is
// their harness: the program in this process (startDaemon, e2eStart:
// cli.Run, as main runs it) or as a child process (startProcess: the test
// binary re-executed as kvload-exporter, for signals and process limits),
// and the slots that pace the fast replays.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// runMainEnv makes the test binary act as kvload-exporter itself, so that
// the shutdown tests can signal a real process without building one.
const runMainEnv = "KVLOAD_EXPORTER_TEST_RUN_MAIN"

// nofileEnv, set with runMainEnv, lowers the process's file descriptor
// limit first (the Go runtime raised it at start).
const nofileEnv = "KVLOAD_EXPORTER_TEST_NOFILE"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		if n, err := strconv.ParseUint(os.Getenv(nofileEnv), 10, 64); err == nil {
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
				panic(err)
			}
		}
		cli.Main() // exits
	}
	os.Exit(m.Run())
}

// runCLI runs the program in this process on args.
func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// listenRE finds the address exporter-toolkit logs for each listener: with
// --web.listen-address=127.0.0.1:0 it is the port actually bound.
var listenRE = regexp.MustCompile(`msg="Listening on" address=(127\.0\.0\.1:\d+)`)

// daemonRun is the program running in this process, as main would run it.
type daemonRun struct {
	url    string // http://127.0.0.1:PORT
	stderr *testutil.Buffer
	cancel context.CancelFunc
	exit   chan int
	code   int
	ended  bool
}

// readyLogged finds the line the daemon logs once its first configuration
// is applied: the web server answers before.
var readyLogged = regexp.MustCompile(`msg="` + regexp.QuoteMeta(cli.ReadyMessage) + `"`)

// startDaemon runs the daemon with args (plus a loopback listen address and
// a short drain unless args set them) and waits until it serves HTTP with
// its configuration applied. The test's cleanup stops it.
func startDaemon(t *testing.T, args ...string) *daemonRun {
	t.Helper()
	all := append([]string{}, args...)
	joined := strings.Join(args, " ")
	if !strings.Contains(joined, "--web.listen-address") {
		all = append(all, "--web.listen-address=127.0.0.1:0")
	}
	if !strings.Contains(joined, "--shutdown.drain-timeout") {
		all = append(all, "--shutdown.drain-timeout=2s")
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemonRun{stderr: &testutil.Buffer{}, cancel: cancel, exit: make(chan int, 1)}
	go func() { d.exit <- cli.Run(ctx, all, io.Discard, d.stderr) }()
	t.Cleanup(func() { d.stop(t) })
	testutil.Eventually(t, "daemon listening", func() (bool, string) {
		select {
		case d.code = <-d.exit:
			d.ended = true
			t.Fatalf("daemon exited with %d before listening:\n%s", d.code, d.stderr.String())
		default:
		}
		m := listenRE.FindStringSubmatch(d.stderr.String())
		if m == nil || !readyLogged.MatchString(d.stderr.String()) {
			return false, d.stderr.String()
		}
		d.url = "http://" + m[1]
		return true, ""
	})
	return d
}

// stop ends the daemon as a signal would and returns its exit code.
func (d *daemonRun) stop(t *testing.T) int {
	t.Helper()
	if d.ended {
		return d.code
	}
	d.cancel()
	d.code = testutil.WaitShowing(t, "the daemon's stop", d.exit, d.stderr)
	d.ended = true
	return d.code
}

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	return fetch(t, http.DefaultClient, http.MethodGet, u, nil)
}

// postReload is POST /-/reload with a deadline, so that a reload stuck on
// a file fails the test rather than hanging it.
func postReload(t *testing.T, base string) (int, string) {
	t.Helper()
	return fetch(t, &http.Client{Timeout: testutil.Ceiling}, http.MethodPost, base+"/-/reload", nil)
}

// fetch sends one bodiless request with c, with basic auth when userPass is
// given, and returns the status and the body.
func fetch(t *testing.T, c *http.Client, method, u string, userPass []string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(userPass) == 2 {
		req.SetBasicAuth(userPass[0], userPass[1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// fixture is the absolute path of a file of testdata/daemon.
func fixture(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", "daemon", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// process is the program re-executed as a child, as main runs it.
type process struct {
	cmd    *exec.Cmd
	stderr *testutil.Buffer
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
	p := &process{stderr: &testutil.Buffer{}, exited: make(chan struct{})}
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
			_ = p.cmd.Process.Kill() // it may have exited meanwhile; exited says when
			<-p.exited
		}
	})
	return p
}

// waitListening waits for the address the process bound and for its
// first configuration applied.
func (p *process) waitListening(t *testing.T) {
	t.Helper()
	p.waitServing(t)
	testutil.Eventually(t, "process ready", func() (bool, string) {
		select {
		case <-p.exited:
			t.Fatalf("exited before it was ready (%v):\n%s", p.err, p.stderr.String())
		default:
		}
		return readyLogged.MatchString(p.stderr.String()), p.stderr.String()
	})
}

// waitServing waits for the address the process bound, which answers
// before the configuration is applied.
func (p *process) waitServing(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, "process listening", func() (bool, string) {
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

// e2eEmulatorRE finds each emulated engine's loopback URL, which the daemon
// logs as it starts it.
var e2eEmulatorRE = regexp.MustCompile(`msg="emulated engine started" target=(\S+) url=(http://127\.0\.0\.1:\d+)`)

// e2eDaemon is the daemon running in this process.
type e2eDaemon struct {
	base      string            // http://127.0.0.1:PORT
	emulators map[string]string // target → emulator base URL
	log       *testutil.Buffer
	cancel    context.CancelFunc
	exit      chan int
	stopped   bool
}

// e2eStart runs the daemon on cfg, listening on a free loopback port, and
// waits until it serves and every emulated target of cfg has its engine.
// The test's cleanup stops it (and fails the test on a non-zero exit).
func e2eStart(t *testing.T, cfg string, emulated ...string) *e2eDaemon {
	t.Helper()
	return e2eStartFlags(t, cfg, nil, emulated...)
}

// e2eStartFlags is e2eStart with extra command-line flags.
func e2eStartFlags(t *testing.T, cfg string, flags []string, emulated ...string) *e2eDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &e2eDaemon{log: &testutil.Buffer{}, cancel: cancel, exit: make(chan int, 1), emulators: map[string]string{}}
	args := append([]string{"--config.file=" + cfg, "--web.listen-address=127.0.0.1:0", "--shutdown.drain-timeout=10s"}, flags...)
	go func() { d.exit <- cli.Run(ctx, args, io.Discard, d.log) }()
	t.Cleanup(func() { d.stop(t) })
	testutil.Eventually(t, "daemon serving", func() (bool, string) {
		select {
		case code := <-d.exit:
			d.stopped = true
			t.Fatalf("daemon exited with %d before serving:\n%s", code, d.log.String())
		default:
		}
		logged := d.log.String()
		m := listenRE.FindStringSubmatch(logged)
		for _, e := range e2eEmulatorRE.FindAllStringSubmatch(logged, -1) {
			d.emulators[e[1]] = e[2]
		}
		for _, name := range emulated {
			if d.emulators[name] == "" {
				return false, logged
			}
		}
		if m == nil {
			return false, logged
		}
		d.base = "http://" + m[1]
		code, _, err := e2eGet(d.base + "/-/ready")
		return err == nil && code == http.StatusOK, fmt.Sprintf("GET /-/ready: %d %v", code, err)
	})
	return d
}

// stop ends the daemon as SIGTERM would; it must drain and exit 0.
func (d *e2eDaemon) stop(t *testing.T) {
	t.Helper()
	if d.stopped {
		return
	}
	d.stopped = true
	d.cancel()
	if code := testutil.WaitShowing(t, "the daemon's stop", d.exit, d.log); code != cli.ExitOK {
		t.Errorf("daemon exited with %d:\n%s", code, d.log.String())
	}
}

// The end-to-end tests mostly wait on paced replays, so `make test-e2e`
// runs them side by side (-parallel), but a fast replay also keeps its
// engine busy tokenizing: at ten or more times a trace's speed it uses
// about 0.4 of a core (some 400k prompt tokens a second). e2eReplays
// admits two such replays at a time, as many as two cores serve without
// slowing the engines' answers enough to move what a pass reads. Tests
// that replay a few rows, or slowly, need little CPU and run beside them
// without a slot; those whose requests must reach a single-slot engine in
// the order sent, 100 ms apart, do not run in parallel with them at all
// (TestE2ECacheTruthPreamble).
var e2eReplays = make(chan struct{}, 2)

// e2eReplaysTaking makes a test that takes several slots take them all
// before another test takes any, so that two such tests cannot each hold
// a part and wait for the rest.
var e2eReplaysTaking sync.Mutex

// e2eReplaySlot waits for one of e2eReplays' slots and holds it until t
// and everything it started have stopped (cleanups registered later run
// first). Call it after t.Parallel, so that a test waiting for its turn
// holds no slot.
func e2eReplaySlot(t *testing.T) {
	t.Helper()
	e2eReplaysTake(t, 1)
}

// e2eReplayAlone is e2eReplaySlot for a replay that must have the CPU to
// itself: one whose band rests on the engine seeing requests nearly in the
// order sent (a bounded cache's evictions, two replicas' interleaving),
// which another fast replay in this process can disturb.
func e2eReplayAlone(t *testing.T) {
	t.Helper()
	e2eReplaysTake(t, cap(e2eReplays))
}

func e2eReplaysTake(t *testing.T, n int) {
	t.Helper()
	e2eReplaysTaking.Lock()
	for range n {
		e2eReplays <- struct{}{}
	}
	e2eReplaysTaking.Unlock()
	t.Cleanup(func() {
		for range n {
			<-e2eReplays
		}
	})
}
