package e2e

// Hardening tests of the daemon against a misbehaving target: an emulated
// engine injecting every fault at once (TestFaultsMatchGroundTruth), and a
// target that goes away and comes back on the same address
// (TestEndpointLoss). The engine runs in the test, behind the test's own
// HTTP server, so its ground truth (emulate.Engine.Stats) and its
// connections are at hand. Neither test is parallel: they count the
// process's goroutines and heap.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

var outageFlag = flag.Duration("outage", 5*time.Second,
	"TestEndpointLoss: how long the target refuses connections (the docs quote a 1m run)")

// checkLeaks fails t if goroutines started during it outlive it. It runs
// as the test's first cleanup, hence last, after the daemon and the
// servers have stopped.
func checkLeaks(t *testing.T) {
	t.Helper()
	existing := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		goleak.VerifyNone(t, existing)
	})
}

// faultTrace writes a generated trace of n rows, one every spacing, with
// prompts of 100 to 900 tokens sharing a few prefix blocks (so the engine's
// cache has hits) and outputs of 4 to 16 tokens. With hold, one more row
// follows an hour later: the workload stays alive (its dispatcher waiting,
// its requests' context open) after the n rows are done, so that anything
// a request left behind is still there to be counted.
func faultTrace(t *testing.T, path string, n int, spacing time.Duration, hold bool) {
	t.Helper()
	var b bytes.Buffer
	row := func(i int, at time.Duration) {
		isl := 100 + (i*37)%800
		ids := fmt.Sprint(i % 16)
		if isl > 512 {
			ids += fmt.Sprintf(", %d", 100+i%50)
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n",
			at.Milliseconds(), isl, 4+i%13, ids)
	}
	for i := range n {
		row(i, time.Duration(i)*spacing)
	}
	if hold {
		row(n, time.Duration(n)*spacing+time.Hour)
	}
	daemontest.WriteFile(t, path, b.String())
}

// faultTarget is an emulated engine behind the test's own HTTP server,
// which tracks its open connections.
type faultTarget struct {
	engine *emulate.Engine
	srv    *httptest.Server
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func newFaultTarget(t *testing.T, cfg emulate.Config) *faultTarget {
	t.Helper()
	eng, err := emulate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ft := &faultTarget{engine: eng, conns: map[net.Conn]bool{}}
	ft.srv = httptest.NewUnstartedServer(eng.Handler())
	ft.srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		switch s {
		case http.StateNew:
			ft.conns[c] = true
		case http.StateHijacked, http.StateClosed:
			delete(ft.conns, c)
		}
	}
	ft.srv.Start()
	t.Cleanup(ft.srv.Close)
	return ft
}

// setFaults changes the engine's faults at run time, as an operator
// would, through POST /emulator/faults.
func (ft *faultTarget) setFaults(t *testing.T, body string) {
	t.Helper()
	resp, err := http.Post(ft.srv.URL+"/emulator/faults", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /emulator/faults %s: %s", body, resp.Status)
	}
}

// quiesce closes every idle connection on both sides (the exporter's
// keep-alive pool to the engine and the test's own to the daemon), so that
// goroutine counts compare request machinery, not pooled sockets, and
// returns the settled goroutine count and live heap.
func (ft *faultTarget) quiesce(t *testing.T) (goroutines int, heap uint64) {
	t.Helper()
	testutil.Eventually(t, "no connection to the engine", func() (bool, string) {
		// Closes idle server connections; re-enabled at once for later work.
		ft.srv.Config.SetKeepAlivesEnabled(false)
		ft.srv.Config.SetKeepAlivesEnabled(true)
		ft.mu.Lock()
		defer ft.mu.Unlock()
		return len(ft.conns) == 0, fmt.Sprintf("%d open", len(ft.conns))
	})
	http.DefaultClient.CloseIdleConnections()
	return settle(t)
}

// settle waits until the goroutine count holds still for a few readings
// (closed connections end their goroutines asynchronously) and returns it
// with the heap left after a collection.
func settle(t *testing.T) (int, uint64) {
	t.Helper()
	last, same := -1, 0
	testutil.Eventually(t, "goroutine count settled", func() (bool, string) {
		n := runtime.NumGoroutine()
		if n == last {
			same++
		} else {
			last, same = n, 0
		}
		return same >= 5, fmt.Sprint(n)
	})
	return last, heapAlloc()
}

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// waitDone waits until workload has finished or dropped rows rows and
// has none in flight; with pass, until its (loop once) pass is counted too.
func waitDone(t *testing.T, d *daemonRun, workload string, rows int, pass bool) testutil.Families {
	t.Helper()
	var mfs testutil.Families
	testutil.Eventually(t, fmt.Sprintf("workload %s done with %d rows", workload, rows), func() (bool, string) {
		mfs = testutil.Scrape(t, d.url)
		loops, _ := mfs.Value("kvload_trace_loops_total", "workload", workload)
		done, _ := mfs.Value("kvload_requests_total", "workload", workload)
		dropped, _ := mfs.Value("kvload_requests_dropped_total", "workload", workload)
		inFlight, _ := mfs.Value("kvload_requests_in_flight", "workload", workload)
		return (!pass || loops == 1) && done+dropped == float64(rows) && inFlight == 0,
			fmt.Sprintf("%v passes, %v finished, %v dropped, %v in flight", loops, done, dropped, inFlight)
	})
	return mfs
}

// statsDelta is after minus before, for the counts.
func statsDelta(after, before emulate.Stats) emulate.Stats {
	return emulate.Stats{
		Received:         after.Received - before.Received,
		SlowFirstTokens:  after.SlowFirstTokens - before.SlowFirstTokens,
		Success:          after.Success - before.Success,
		Error500:         after.Error500 - before.Error500,
		Error429:         after.Error429 - before.Error429,
		Disconnected:     after.Disconnected - before.Disconnected,
		Malformed:        after.Malformed - before.Malformed,
		Hung:             after.Hung - before.Hung,
		Rejected:         after.Rejected - before.Rejected,
		Canceled:         after.Canceled - before.Canceled,
		PromptTokens:     after.PromptTokens - before.PromptTokens,
		CompletionTokens: after.CompletionTokens - before.CompletionTokens,
		CachedTokens:     after.CachedTokens - before.CachedTokens,
	}
}

func ended(s emulate.Stats) int64 {
	return s.Success + s.Error500 + s.Error429 + s.Disconnected + s.Malformed + s.Hung + s.Rejected + s.Canceled
}

// faultConfig is a daemon configuration replaying one loop-once workload
// against the engine at url.
func faultConfig(url, workload, trace string, timeout time.Duration) config.Config {
	return config.Config{
		Targets: []config.Target{{Name: "emu", URL: url, Model: emulate.DefaultModel, Dialect: "vllm",
			RequestTimeout: config.Duration(timeout)}},
		Workloads: []config.Workload{{Name: workload, Trace: trace, Targets: []string{"emu"},
			Loop: "once", MaxInFlight: 64, OnSaturation: "queue"}},
	}
}

// TestFaultsMatchGroundTruth replays a trace against an engine injecting
// every fault at once: 5% HTTP 500, 5% HTTP 429, 5% mid-stream
// disconnects, 1% malformed chunks, 1% hung streams and 5% slow first
// tokens. Every request must end in exactly one outcome, each outcome must
// match what the engine did, hung requests must end at request_timeout,
// and once the faults stop and the requests are done, the exporter must be
// back to the goroutines and heap it had before them.
//
// Phases, switched by reloading the configuration: "warm" (no faults; the
// baseline is taken once its rows are done), "storm" (the faults, set to
// zero at run time once its last row is sent; the resources are compared
// once its requests have ended), then "calm", which must succeed
// throughout.
func TestFaultsMatchGroundTruth(t *testing.T) {
	checkLeaks(t)
	// A normal request must end within the timeout however busy the
	// machine, or it would count as a timeout that no hang caused: under
	// -race on a machine at load 15, 144 of 400 requests took over 5 s. So
	// the timeout is far above any normal request's time; what it costs is
	// the hung requests' wait, which they spend side by side. The race
	// detector's slowdown gets fewer rows and a gentler pace.
	rows, spacing, timeout := 2000, 4*time.Millisecond, 20*time.Second // 250 rows/s
	if testutil.RaceEnabled {
		rows, spacing, timeout = 400, 20*time.Millisecond, 30*time.Second
	}
	const (
		calmRows = 50
		// A few goroutines come and go with the daemon's own housekeeping;
		// a leak per hung or broken request would be tens.
		goroutineSlack = 5
		heapSlack      = 2 << 20
	)
	dir := t.TempDir()
	// Warm and storm replay the same rows, so that their unit's trace,
	// series and the engine's (full, bounded) cache weigh the same at the
	// baseline and after the faults.
	faultTrace(t, filepath.Join(dir, "warm.jsonl"), rows, spacing, true)
	faultTrace(t, filepath.Join(dir, "storm.jsonl"), rows, spacing, true)
	faultTrace(t, filepath.Join(dir, "calm.jsonl"), calmRows, 10*time.Millisecond, false)

	ft := newFaultTarget(t, emulate.Config{
		Overhead: time.Millisecond, InterToken: time.Millisecond,
		// Bounded and filled by warm, so the engine's own heap (in this
		// process) stays flat.
		CapacityBlocks: 1024,
		Seed:           7,
	})
	path := filepath.Join(dir, "kvload.yml")
	daemontest.WriteConfig(t, path, faultConfig(ft.srv.URL, "warm", "warm.jsonl", timeout))
	d := startDaemon(t, "--config.file="+path)

	waitDone(t, d, "warm", rows, false)
	baseGoroutines, baseHeap := ft.quiesce(t)
	before := ft.engine.Stats()

	ft.setFaults(t, `{"error_500": 0.05, "error_429": 0.05, "disconnect": 0.05, "malformed": 0.01, "hang": 0.01,
		"slow_first_token": 0.05, "slow_first_token_delay": "300ms"}`)
	daemontest.WriteConfig(t, path, faultConfig(ft.srv.URL, "storm", "storm.jsonl", timeout))
	if code, body := postReload(t, d.url); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	// Once every row is sent, stop the faults, as an operator would; the
	// last requests (the hung ones above all) are still running.
	testutil.Eventually(t, "every storm row sent", func() (bool, string) {
		sent, _ := testutil.Scrape(t, d.url).Value("kvload_schedule_lag_seconds", "workload", "storm")
		return sent == float64(rows), fmt.Sprint(sent)
	})
	ft.setFaults(t, `{}`)
	mfs := waitDone(t, d, "storm", rows, false)
	var truth emulate.Stats
	testutil.Eventually(t, "the engine has seen every request end", func() (bool, string) {
		mfs = testutil.Scrape(t, d.url)
		s := ft.engine.Stats()
		truth = statsDelta(s, before)
		sent, _ := mfs.Value("kvload_schedule_lag_seconds", "workload", "storm")
		return s.Running == 0 && s.Waiting == 0 && truth.Received == int64(sent) && ended(truth) == truth.Received,
			fmt.Sprintf("exporter sent %v; engine %+v", sent, truth)
	})

	w := []string{"workload", "storm"}
	get := func(name string, pairs ...string) float64 {
		v, _ := mfs.Value(name, append(append([]string{}, w...), pairs...)...)
		return v
	}
	outcome := func(o string) float64 { return get("kvload_requests_total", "outcome", o) }
	finished, sent := get("kvload_requests_total"), get("kvload_schedule_lag_seconds")
	if finished != float64(rows) || sent != float64(rows) || truth.Received != int64(rows) {
		t.Errorf("%d rows: exporter finished %v, sent %v; engine received %d", rows, finished, sent, truth.Received)
	}
	if v := get("kvload_requests_dropped_total"); v != 0 {
		t.Errorf("%v requests dropped, want 0 (on_saturation: queue)", v)
	}
	if v := get("kvload_requests_in_flight"); v != 0 {
		t.Errorf("%v requests in flight after the pass", v)
	}
	for _, c := range []struct {
		what     string
		exported float64
		truth    int64
	}{
		{"success", outcome("success"), truth.Success},
		{"http_error (500 + 429 + rejected)", outcome("http_error"), truth.Error500 + truth.Error429 + truth.Rejected},
		{"stream_error (disconnected + malformed)", outcome("stream_error"), truth.Disconnected + truth.Malformed},
		{"timeout (hung)", outcome("timeout"), truth.Hung},
		{"connection_error", outcome("connection_error"), 0},
		// A request the exporter gave up on for any reason but its
		// timeout would show here and as canceled at the engine.
		{"canceled", outcome("canceled"), truth.Canceled},
		{"prompt tokens", get("kvload_prompt_tokens_total"), truth.PromptTokens},
		{"completion tokens", get("kvload_completion_tokens_total"), truth.CompletionTokens},
		{"cached prompt tokens", get("kvload_cached_prompt_tokens_total"), truth.CachedTokens},
		{"TTFT samples", get("kvload_time_to_first_token_seconds"), truth.Success},
	} {
		if c.exported != float64(c.truth) {
			t.Errorf("%s: exporter %v, engine %d", c.what, c.exported, c.truth)
		}
	}
	// Hung requests end at their timeout and nothing else: the engine saw
	// the client leave every hung stream and no other request.
	if truth.Canceled != 0 || truth.Rejected != 0 {
		t.Errorf("engine: %d requests canceled by the client, %d rejected; want 0", truth.Canceled, truth.Rejected)
	}
	// The faults really happened, each kind at least once.
	for what, n := range map[string]int64{"500": truth.Error500, "429": truth.Error429, "disconnect": truth.Disconnected,
		"malformed": truth.Malformed, "hang": truth.Hung, "slow first token": truth.SlowFirstTokens, "cache hit": truth.CachedTokens} {
		if n == 0 {
			t.Errorf("no %s in %d requests", what, rows)
		}
	}
	t.Logf("fault suite: %d requests sent, %d received by the engine; exporter = engine: success %.0f = %d, "+
		"http_error %.0f = %d (500) + %d (429), stream_error %.0f = %d (disconnect) + %d (malformed), timeout %.0f = %d (hung), "+
		"connection_error %.0f, canceled %.0f = %d; slow first tokens %d; tokens prompt %.0f = %d, completion %.0f = %d, cached %.0f = %d",
		int(sent), truth.Received, outcome("success"), truth.Success, outcome("http_error"), truth.Error500, truth.Error429,
		outcome("stream_error"), truth.Disconnected, truth.Malformed, outcome("timeout"), truth.Hung,
		outcome("connection_error"), outcome("canceled"), truth.Canceled, truth.SlowFirstTokens,
		get("kvload_prompt_tokens_total"), truth.PromptTokens, get("kvload_completion_tokens_total"), truth.CompletionTokens,
		get("kvload_cached_prompt_tokens_total"), truth.CachedTokens)

	// The storm workload is still running (its last row is an hour away):
	// whatever its requests left behind would still be here.
	var goroutines int
	var heap uint64
	testutil.Eventually(t, "goroutines and heap back to the baseline", func() (bool, string) {
		goroutines, heap = ft.quiesce(t)
		return goroutines <= baseGoroutines+goroutineSlack && heap <= baseHeap+heapSlack,
			fmt.Sprintf("goroutines %d (baseline %d), heap %.1f MiB (baseline %.1f MiB)", goroutines, baseGoroutines, mib(heap), mib(baseHeap))
	})
	t.Logf("fault suite resources: goroutines baseline %d, after %d; heap baseline %.1f MiB, after %.1f MiB",
		baseGoroutines, goroutines, mib(baseHeap), mib(heap))

	// After the storm: the exporter serves, and a clean workload succeeds
	// throughout.
	daemontest.WriteConfig(t, path, faultConfig(ft.srv.URL, "calm", "calm.jsonl", timeout))
	if code, body := postReload(t, d.url); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	mfs = waitDone(t, d, "calm", calmRows, true)
	if v, _ := mfs.Value("kvload_requests_total", "workload", "calm", "outcome", "success"); v != calmRows {
		t.Errorf("after the faults stopped: %v of %d requests succeeded", v, calmRows)
	}
	if code, _ := httpGet(t, d.url+"/-/healthy"); code != http.StatusOK {
		t.Errorf("GET /-/healthy: %d", code)
	}

	select {
	case code := <-d.exit:
		d.ended, d.code = true, code
		t.Fatalf("the daemon exited (%d) during the faults:\n%s", code, d.stderr.String())
	default:
	}
	if code := d.stop(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// maxGoroutines samples the goroutine count every 20ms for d and returns
// the highest.
func maxGoroutines(d time.Duration) int {
	highest := runtime.NumGoroutine()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		highest = max(highest, runtime.NumGoroutine())
	}
	return highest
}

// TestEndpointLoss takes the target away for -outage (connection refused:
// nothing listens on its port) and brings it back on the same address. The
// exporter must go on at the schedule's pace, each due row one connection
// error and no retries, without piling up goroutines, and recover by
// itself. The figures are logged on one line for the docs:
//
//	go test -count=1 -run TestEndpointLoss -v ./internal/e2e/ -outage=1m
func TestEndpointLoss(t *testing.T) {
	checkLeaks(t)
	outage := *outageFlag
	const (
		spacing     = 20 * time.Millisecond // 50 rows/s
		traceRows   = 100
		maxInFlight = 16
		warmup      = 25 // successes before the outage, and again after it
	)
	dir := t.TempDir()
	faultTrace(t, filepath.Join(dir, "steady.jsonl"), traceRows, spacing, false)

	eng, err := emulate.New(emulate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	// serve answers on l until stop; first is when its first request
	// arrived (Unix nanoseconds; 0 for none yet).
	serve := func(l net.Listener) (stop func(), first *atomic.Int64) {
		first = new(atomic.Int64)
		h := eng.Handler()
		srv := &http.Server{ReadHeaderTimeout: 10 * time.Second,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				first.CompareAndSwap(0, time.Now().UnixNano())
				h.ServeHTTP(w, r)
			})}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("serve: %v", err)
			}
		}()
		// Close, not Shutdown: a server that dies drops its connections.
		stop = sync.OnceFunc(func() { srv.Close(); <-done })
		t.Cleanup(stop)
		return stop, first
	}
	stopFirst, _ := serve(l)

	path := filepath.Join(dir, "kvload.yml")
	daemontest.WriteConfig(t, path, config.Config{
		Targets: []config.Target{{Name: "emu", URL: "http://" + addr, Model: emulate.DefaultModel, Dialect: "vllm",
			RequestTimeout: config.Duration(5 * time.Second)}},
		Workloads: []config.Workload{{Name: "steady", Trace: "steady.jsonl", Targets: []string{"emu"},
			Loop: "repeat", MaxInFlight: maxInFlight, OnSaturation: "drop"}},
	})
	d := startDaemon(t, "--config.file="+path)

	count := func(mfs testutil.Families, o string) float64 {
		v, _ := mfs.Value("kvload_requests_total", "outcome", o)
		return v
	}
	var mfs testutil.Families
	testutil.Eventually(t, "successes before the outage", func() (bool, string) {
		mfs = testutil.Scrape(t, d.url)
		n := count(mfs, "success")
		return n >= warmup, fmt.Sprint(n)
	})
	goroutinesBefore := maxGoroutines(500 * time.Millisecond)

	// The outage: nothing listens on addr until it ends. The counters are
	// read once the server is gone, so that only requests it had already
	// answered can still succeed; the window runs until the last scrape
	// has returned, an upper bound on the rows due before it.
	closed := time.Now()
	stopFirst()
	atClose := testutil.Scrape(t, d.url)
	maxDuring := maxGoroutines(outage - time.Since(closed))
	atEnd := testutil.Scrape(t, d.url)
	window := time.Since(closed)

	var l2 net.Listener
	testutil.Eventually(t, "listening again on "+addr, func() (bool, string) {
		l2, err = net.Listen("tcp", addr)
		return err == nil, fmt.Sprint(err)
	})
	relisten := time.Now()
	stopSecond, firstArrival := serve(l2)
	successAtEnd := count(atEnd, "success")
	// Recovery as /metrics shows it, polled every 10ms; the first arrival
	// at the target tells the exporter's delay from the target's.
	var recovery time.Duration
	testutil.Eventually(t, "a success after the outage", func() (bool, string) {
		mfs = testutil.Scrape(t, d.url)
		n := count(mfs, "success")
		recovery = time.Since(relisten)
		return n > successAtEnd, fmt.Sprint(n)
	})
	atRecovery := mfs
	testutil.Eventually(t, "successes after the outage", func() (bool, string) {
		mfs = testutil.Scrape(t, d.url)
		n := count(mfs, "success")
		return n >= successAtEnd+warmup, fmt.Sprint(n)
	})
	goroutinesAfter := maxGoroutines(500 * time.Millisecond)

	delta := func(o string) float64 { return count(atEnd, o) - count(atClose, o) }
	connErrors := delta("connection_error")
	others := delta("http_error") + delta("stream_error") + delta("timeout") + delta("canceled")
	droppedV, _ := atEnd.Value("kvload_requests_dropped_total")
	droppedV0, _ := atClose.Value("kvload_requests_dropped_total")
	dropped := droppedV - droppedV0
	due := float64(window / spacing)
	if delta("success") > maxInFlight {
		t.Errorf("%v successes during the outage: only requests in flight at its start may succeed", delta("success"))
	}
	// No retries: each due row is at most one connection error (plus the
	// requests cut at the close, and one row for the window's edges).
	if connErrors+dropped > due+maxInFlight+1 {
		t.Errorf("%v connection errors and %v drops for %v rows due in %v: retries?", connErrors, dropped, due, window.Round(time.Millisecond))
	}
	// The schedule goes on: a stall or a backoff would fall far behind.
	if connErrors < due/2 {
		t.Errorf("%v connection errors for %v rows due in %v: the schedule stalled", connErrors, due, window.Round(time.Millisecond))
	}
	if others > maxInFlight {
		t.Errorf("%v other failures during the outage: only requests cut at its start may fail otherwise", others)
	}
	if maxDuring > goroutinesBefore+maxInFlight {
		t.Errorf("goroutines piled up during the outage: %d, %d before", maxDuring, goroutinesBefore)
	}
	// Once back, every request succeeds: no dead pooled connection, no
	// lingering state from the outage.
	var total, sinceRecovery float64
	for _, o := range []string{"success", "http_error", "stream_error", "timeout", "connection_error", "canceled"} {
		total += count(mfs, o)
		if o != "success" {
			sinceRecovery += count(mfs, o) - count(atRecovery, o)
		}
	}
	if sinceRecovery != 0 {
		t.Errorf("%v failures after the first success following the outage", sinceRecovery)
	}
	arrival := time.Unix(0, firstArrival.Load()).Sub(relisten)
	t.Logf("endpoint loss: outage %v (measured %v) at %.0f rows/s: %.0f rows due, %.0f connection errors, %.0f other errors, %.0f dropped; "+
		"recovery %v from re-listen to the first success (first request in after %v); requests %.0f (success %.0f, connection_error %.0f, http_error %.0f, "+
		"stream_error %.0f, timeout %.0f, canceled %.0f); goroutines before %d, max during %d, after %d",
		outage, window.Round(time.Millisecond), float64(time.Second/spacing), due, connErrors, others, dropped,
		recovery.Round(time.Millisecond), arrival.Round(time.Millisecond), total, count(mfs, "success"), count(mfs, "connection_error"), count(mfs, "http_error"),
		count(mfs, "stream_error"), count(mfs, "timeout"), count(mfs, "canceled"),
		goroutinesBefore, maxDuring, goroutinesAfter)

	if code := d.stop(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
	stopSecond()
	http.DefaultClient.CloseIdleConnections()
}
