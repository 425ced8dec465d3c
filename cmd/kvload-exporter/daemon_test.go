package main

// Acceptance tests of the daemon: the whole program (run) against local
// OpenAI-compatible servers, driven through its config file, its HTTP
// endpoints and, for shutdown, signals to a real process.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvload-exporter/kvload-exporter/internal/testconfig"
)

var updateDaemon = flag.Bool("update-daemon", false, "rewrite the daemon golden files")

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
		main() // exits
	}
	os.Exit(m.Run())
}

// pollDeadline only guards against a hang; no test asserts speed.
const pollDeadline = 2 * time.Minute

// eventually polls cond until it holds; detail says what was last seen.
func eventually(t *testing.T, what string, cond func() (ok bool, detail string)) {
	t.Helper()
	deadline := time.Now().Add(pollDeadline)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v; last seen: %s", what, pollDeadline, detail)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// listenRE finds the address exporter-toolkit logs for each listener: with
// --web.listen-address=127.0.0.1:0 it is the port actually bound.
var listenRE = regexp.MustCompile(`msg="Listening on" address=(127\.0\.0\.1:\d+)`)

// daemonRun is the program running in this process, as main would run it.
type daemonRun struct {
	url    string // http://127.0.0.1:PORT
	stderr *syncBuffer
	cancel context.CancelFunc
	exit   chan int
	code   int
	ended  bool
}

// startDaemon runs the daemon with args (plus a loopback listen address and
// a short drain unless args set them) and waits until it serves HTTP. The
// test's cleanup stops it.
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
	d := &daemonRun{stderr: &syncBuffer{}, cancel: cancel, exit: make(chan int, 1)}
	go func() { d.exit <- run(ctx, all, streams{stdout: io.Discard, stderr: d.stderr}) }()
	t.Cleanup(func() { d.stop(t) })
	eventually(t, "daemon listening", func() (bool, string) {
		select {
		case d.code = <-d.exit:
			d.ended = true
			t.Fatalf("daemon exited with %d before listening:\n%s", d.code, d.stderr.String())
		default:
		}
		m := listenRE.FindStringSubmatch(d.stderr.String())
		if m == nil {
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
	select {
	case d.code = <-d.exit:
	case <-time.After(pollDeadline):
		t.Fatalf("daemon did not stop:\n%s", d.stderr.String())
	}
	d.ended = true
	return d.code
}

// families is a parsed scrape, by metric name.
type families map[string]*dto.MetricFamily

func parseMetrics(r io.Reader) (families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	return families(mfs), err
}

// scrape fetches and parses /metrics (text format).
func scrape(t *testing.T, base string) families {
	t.Helper()
	mfs, err := tryScrape(base)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

func tryScrape(base string) (families, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// gatherer serves a parsed scrape to testutil.
func (mfs families) gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		out := make([]*dto.MetricFamily, 0, len(mfs))
		for _, mf := range mfs {
			out = append(out, mf)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
		return out, nil
	})
}

// value sums the series of name whose labels include the given pairs; a
// histogram contributes its sample count. n is how many series matched.
func (mfs families) value(name string, pairs ...string) (sum float64, n int) {
	mf := mfs[name]
	if mf == nil {
		return 0, 0
	}
	want := map[string]string{}
	for i := 0; i+1 < len(pairs); i += 2 {
		want[pairs[i]] = pairs[i+1]
	}
next:
	for _, m := range mf.GetMetric() {
		matched := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok {
				if v != l.GetValue() {
					continue next
				}
				matched++
			}
		}
		if matched != len(want) {
			continue
		}
		n++
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, n
}

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	return fetch(t, http.DefaultClient, http.MethodGet, u, nil)
}

// postReload is POST /-/reload with a deadline, so that a reload stuck on
// a file fails the test rather than hanging it.
func postReload(t *testing.T, base string) (int, string) {
	t.Helper()
	return fetch(t, &http.Client{Timeout: pollDeadline}, http.MethodPost, base+"/-/reload", nil)
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

func writeConfig(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
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

// usage is what the fake server reports for one request.
type usage struct{ prompt, completion, cached int }

// fakeServer speaks OpenAI chat completions over SSE: a role chunk, one
// content chunk per output token, a usage chunk, [DONE]. The numbers
// depend only on the request's max tokens, never on arrival order.
type fakeServer struct {
	*httptest.Server
	usage func(maxTokens int) usage
	// release, when set, holds every request until it receives from it
	// (one request per value sent; closing releases all) or the client
	// goes away.
	release chan struct{}
	// fail, when set, may answer instead (status, body); status 0 means no.
	fail func(r *http.Request, maxTokens int) (int, string)

	mu      sync.Mutex
	arrived map[string]int // by URL path
	times   []time.Time    // when each request arrived
	auth    map[string]int // Authorization headers seen
	ended   int            // held requests whose client went away
}

func newFakeServer(t *testing.T, configure func(*fakeServer)) *fakeServer {
	t.Helper()
	f := &fakeServer{
		usage:   func(n int) usage { return usage{prompt: 10 * n, completion: n} },
		arrived: map[string]int{},
		auth:    map[string]int{},
	}
	if configure != nil {
		configure(f)
	}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	if f.release != nil {
		// Runs before Close (cleanups are last in, first out), so that no
		// handler is left waiting.
		t.Cleanup(func() {
			defer func() { recover() }() // already closed by the test
			close(f.release)
		})
	}
	return f
}

func (f *fakeServer) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.arrived[path]
}

// lastArrival is when the latest request arrived, and how many did.
func (f *fakeServer) lastArrival() (time.Time, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last time.Time
	for _, a := range f.times {
		if a.After(last) {
			last = a
		}
	}
	return last, len(f.times)
}

func (f *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		MaxTokens           int  `json:"max_tokens"`
		MaxCompletionTokens int  `json:"max_completion_tokens"`
		Stream              bool `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	n := max(req.MaxTokens, req.MaxCompletionTokens)
	f.mu.Lock()
	f.arrived[r.URL.Path]++
	f.times = append(f.times, time.Now())
	f.auth[r.Header.Get("Authorization")]++
	f.mu.Unlock()

	if f.release != nil {
		select {
		case <-f.release:
		case <-r.Context().Done():
			f.mu.Lock()
			f.ended++
			f.mu.Unlock()
			return
		}
	}
	if f.fail != nil {
		if status, body := f.fail(r, n); status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, body)
			return
		}
	}
	u := f.usage(n)
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	chunk := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
	}
	type delta struct {
		Role    string `json:"role,omitempty"`
		Content string `json:"content"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Delta        delta   `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	}
	type body struct {
		ID      string         `json:"id"`
		Object  string         `json:"object"`
		Choices []choice       `json:"choices"`
		Usage   map[string]any `json:"usage,omitempty"`
	}
	chunk(body{ID: "c", Object: "chat.completion.chunk", Choices: []choice{{Delta: delta{Role: "assistant"}}}})
	stop := "stop"
	for i := range n {
		c := choice{Delta: delta{Content: " tok"}}
		if i == n-1 {
			c.FinishReason = &stop
		}
		chunk(body{ID: "c", Object: "chat.completion.chunk", Choices: []choice{c}})
	}
	chunk(body{ID: "c", Object: "chat.completion.chunk", Choices: []choice{}, Usage: map[string]any{
		"prompt_tokens":         u.prompt,
		"completion_tokens":     u.completion,
		"total_tokens":          u.prompt + u.completion,
		"prompt_tokens_details": map[string]any{"cached_tokens": u.cached},
	}})
	io.WriteString(w, "data: [DONE]\n\n")
	fl.Flush()
}

// goldenMetrics are the series compared with testdata/daemon/golden.prom;
// histograms are checked by their counts only (their values are timings).
var goldenMetrics = []string{
	"kvload_requests_total",
	"kvload_requests_dropped_total",
	"kvload_requests_in_flight",
	"kvload_prompt_tokens_total",
	"kvload_trace_prompt_tokens_total",
	"kvload_completion_tokens_total",
	"kvload_cached_prompt_tokens_total",
	"kvload_theoretical_cached_prompt_tokens_total",
	"kvload_trace_loops_total",
	"kvload_target_info",
	"kvload_config_last_reload_successful",
}

// TestDaemonGoldenMetrics replays tiny.jsonl once against a server with
// known usage numbers and compares /metrics with the golden file.
//
// tiny.jsonl holds two pairs of identical rows (16-token blocks, the
// target's block size too): the second of each pair could be served from
// cache, so whatever order the requests go in, theoretical cached tokens
// are floor(min(3·16, 40−1)/16)·16 + floor(min(2·16, 20−1)/16)·16 = 48, and
// the server reports exactly those as cached.
func TestDaemonGoldenMetrics(t *testing.T) {
	t.Parallel()
	byMax := map[int]usage{
		3: {prompt: 45, completion: 3, cached: 0},
		5: {prompt: 45, completion: 5, cached: 32},
		7: {prompt: 25, completion: 7, cached: 0},
		9: {prompt: 25, completion: 9, cached: 16},
	}
	srv := newFakeServer(t, func(f *fakeServer) { f.usage = func(n int) usage { return byMax[n] } })
	cfg := filepath.Join(t.TempDir(), "kvload.yml")
	writeConfig(t, cfg, fmt.Sprintf(`targets:
  - name: fake
    url: %s
    model: fake-model
    dialect: vllm
workloads:
  - name: golden
    trace: %s
    targets: [fake]
    block_size: 16
    loop: once
`, srv.URL, fixture(t, "tiny.jsonl")))
	d := startDaemon(t, "--config.file="+cfg)

	goldenPath := fixture(t, "golden.prom")
	if *updateDaemon {
		eventually(t, "four requests counted", func() (bool, string) {
			mfs := scrape(t, d.url)
			n, _ := mfs.value("kvload_theoretical_cached_prompt_tokens_total")
			s, _ := mfs.value("kvload_requests_total", "outcome", "success")
			return s == 4 && n == 48, fmt.Sprint(s, n)
		})
		var out bytes.Buffer
		mfs := scrape(t, d.url)
		for _, name := range goldenMetrics {
			if _, err := expfmt.MetricFamilyToText(&out, mfs[name]); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(goldenPath, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}

	// The series of a request are updated one after another, and a scrape
	// may fall between two of them: poll until both the counters and the
	// histogram counts match, and report the last difference if they never do.
	histograms := []string{
		"kvload_schedule_lag_seconds",
		"kvload_time_to_first_token_seconds",
		"kvload_inter_token_latency_seconds",
		"kvload_request_duration_seconds",
	}
	var mfs families
	eventually(t, "/metrics matching "+goldenPath, func() (bool, string) {
		mfs = scrape(t, d.url)
		err := testutil.GatherAndCompare(mfs.gatherer(), bytes.NewReader(golden), goldenMetrics...)
		if err != nil {
			return false, err.Error()
		}
		for _, h := range histograms {
			if n, series := mfs.value(h, "workload", "golden", "target", "fake"); n != 4 || series != 1 {
				var text bytes.Buffer
				if mf := mfs[h]; mf != nil {
					expfmt.MetricFamilyToText(&text, mf)
				}
				return false, fmt.Sprintf("%s: count %v in %d series, want 4 in 1:\n%s", h, n, series, text.String())
			}
		}
		return true, ""
	})

	if got := srv.count("/v1/chat/completions"); got != 4 {
		t.Errorf("the server saw %d requests, want 4", got)
	}

	var kv []string
	for name := range mfs {
		if strings.HasPrefix(name, "kvload_") {
			kv = append(kv, name)
		}
	}
	problems, err := testutil.GatherAndLint(mfs.gatherer(), kv...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if code := d.stop(t); code != exitOK {
		t.Errorf("exit code %d, want 0", code)
	}
}

// TestDaemonReloadEndpoint is the wiring of POST /-/reload: 500 with every
// problem of a bad file, shown on the landing page, and the gauge at 0 in
// /metrics; 200 for a good one; 405 for a GET. What a reload keeps, restarts
// and removes is lifecycle.TestReloadUnits.
func TestDaemonReloadEndpoint(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	good := func(workloads ...string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "targets:\n  - {name: t, url: %s, model: m, dialect: vllm}\nworkloads:\n", srv.URL)
		for _, w := range workloads {
			fmt.Fprintf(&b, "  - {name: %s, trace: %s, targets: [t], block_size: 16, loop: once}\n", w, trace)
		}
		return b.String()
	}
	writeConfig(t, path, good("a", "b"))
	d := startDaemon(t, "--config.file="+path)
	eventually(t, "both workloads replaying", func() (bool, string) {
		mfs := scrape(t, d.url)
		a, _ := mfs.value("kvload_requests_total", "workload", "a", "outcome", "success")
		b, _ := mfs.value("kvload_requests_total", "workload", "b", "outcome", "success")
		return a == 2 && b == 2, fmt.Sprint(a, b)
	})

	bad := strings.Replace(good("a", "b"), "targets: [t]", "targets: [nope]", 1)
	bad = strings.Replace(bad, "loop: once}", "loop: forever}", 1)
	writeConfig(t, path, bad)
	code, body := postReload(t, d.url)
	if code != http.StatusInternalServerError {
		t.Errorf("POST /-/reload of a bad file: %d, want 500:\n%s", code, body)
	}
	for _, problem := range []string{
		path + `: workloads[0].targets[0]: unknown target "nope"`,
		path + `: workloads[0].loop: "forever" is not one of fresh, repeat, once`,
	} {
		if !strings.Contains(body, problem) {
			t.Errorf("reload error lacks %q:\n%s", problem, body)
		}
	}
	mfs := scrape(t, d.url)
	if v, n := mfs.value("kvload_config_last_reload_successful"); v != 0 || n != 1 {
		t.Errorf("kvload_config_last_reload_successful %v (%d series), want 0", v, n)
	}
	if _, page := httpGet(t, d.url+"/"); !strings.Contains(page, "unknown target &#34;nope&#34;") {
		t.Errorf("landing page does not show the reload problem:\n%s", page)
	}

	writeConfig(t, path, good("a"))
	if code, body := postReload(t, d.url); code != http.StatusOK || !strings.Contains(body, "Reloaded") {
		t.Errorf("POST /-/reload of a good file: %d %q, want 200", code, body)
	}
	if v, _ := scrape(t, d.url).value("kvload_config_last_reload_successful"); v != 1 {
		t.Errorf("kvload_config_last_reload_successful %v, want 1", v)
	}
	if code, _ := httpGet(t, d.url+"/-/reload"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /-/reload: %d, want 405", code)
	}
}

// TestDaemonSIGTERMDrains is the wiring of the drain in a real process:
// --shutdown.drain-timeout reaches the lifecycle, requests held past it are
// counted as canceled in the final log line, and the exit code is 0. The
// drain itself (requests that finish during it are counted, readiness) is
// lifecycle.TestShutdownDrains.
func TestDaemonSIGTERMDrains(t *testing.T) {
	t.Parallel()
	const want = "requests_success=0 requests_http_error=0 requests_stream_error=0 requests_timeout=0 requests_connection_error=0 requests_canceled=3 requests_in_flight=0"
	srv := newFakeServer(t, func(f *fakeServer) { f.release = make(chan struct{}) })
	path := filepath.Join(t.TempDir(), "kvload.yml")
	writeConfig(t, path, testconfig.WatchConfig(srv.URL, fixture(t, "held.jsonl"), "m"))
	p := startProcess(t, "--config.file="+path, "--web.listen-address=127.0.0.1:0",
		"--shutdown.drain-timeout=200ms", "--log.level=debug")
	p.waitListening(t)
	eventually(t, "three requests in flight", func() (bool, string) {
		mfs, err := tryScrape(p.base)
		if err != nil {
			return false, err.Error()
		}
		f, _ := mfs.value("kvload_requests_in_flight")
		return f == 3 && srv.count("/v1/chat/completions") == 3, fmt.Sprint(f, " in flight")
	})
	p.signal(t, syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("exit: %v, want status 0\n%s", p.err, p.stderr.String())
		}
	case <-time.After(pollDeadline):
		t.Fatalf("no exit after SIGTERM:\n%s", p.stderr.String())
	}
	log := p.stderr.String()
	if !strings.Contains(log, `msg=drained `+want) {
		t.Errorf("the log lacks the final count %q:\n%s", want, log)
	}
	if !strings.Contains(log, `msg=stopped`) {
		t.Errorf("the log lacks the stop:\n%s", log)
	}
}

// TestDaemonKeepsSecrets: credentials of every kind are used but never
// appear in the log (at debug level), /metrics, the landing page or a
// reload error (5).
func TestDaemonKeepsSecrets(t *testing.T) {
	t.Parallel()
	const (
		bearer   = "s3cr3t-token-xyz"
		password = "b4sic-pa55word-qrs"
		userinfo = "hunter2"
	)
	secrets := []string{
		bearer, password, userinfo,
		base64.StdEncoding.EncodeToString([]byte("alice:" + password)),
		base64.StdEncoding.EncodeToString([]byte("user:" + userinfo)),
	}
	srv := newFakeServer(t, func(f *fakeServer) {
		f.fail = func(r *http.Request, n int) (int, string) {
			if n%2 == 1 {
				return http.StatusUnauthorized, `{"error":{"message":"invalid credentials","type":"authentication_error"}}`
			}
			return http.StatusInternalServerError, `{"error":{"message":"the engine failed","type":"internal_error"}}`
		}
	})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("user", userinfo)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	config := fmt.Sprintf(`targets:
  - name: bearer
    url: %[1]s
    model: m
    http_client_config:
      authorization: {credentials: %[3]s}
  - name: basic
    url: %[1]s
    model: m
    http_client_config:
      basic_auth: {username: alice, password: %[4]s}
  - name: userinfo
    url: %[2]s
    model: m
workloads:
  - name: w
    trace: %[5]s
    targets: [bearer, basic, userinfo]
    block_size: 16
    loop: once
`, srv.URL, u.String(), bearer, password, fixture(t, "secrets.jsonl"))
	writeConfig(t, path, config)
	d := startDaemon(t, "--config.file="+path, "--log.level=debug")
	eventually(t, "every request failed", func() (bool, string) {
		v, _ := scrape(t, d.url).value("kvload_requests_total", "outcome", "http_error")
		return v == 12, fmt.Sprint(v)
	})
	srv.mu.Lock()
	for _, h := range []string{"Bearer " + bearer, "Basic " + secrets[3], "Basic " + secrets[4]} {
		if srv.auth[h] != 4 {
			t.Errorf("the server saw Authorization %q %d times, want 4 (the credentials are not in use)", h, srv.auth[h])
		}
	}
	srv.mu.Unlock()

	// Rejected reloads whose problems sit right next to the secrets.
	var reloadBodies, landings []string
	for _, bad := range []struct {
		config string
		want   []string
	}{
		{
			config: strings.Replace(config, "url: "+u.String(), "url: "+strings.Replace(u.String(), "http://", "gopher://", 1), 1),
			want:   []string{"targets[2].url: gopher://user:xxxxx@", "scheme must be http or https"},
		},
		{
			config: strings.Replace(config, "password: "+password+"}", "password: "+password+", passwrd: x}", 1),
			want:   []string{`targets[1].http_client_config.basic_auth: unknown key "passwrd"`},
		},
		{
			config: strings.Replace(config, "credentials: "+bearer+"}", "credentials: "+bearer+", credentials_file: /etc/token}", 1),
			want:   []string{"at most one of authorization credentials & credentials_file"},
		},
	} {
		writeConfig(t, path, bad.config)
		code, body := postReload(t, d.url)
		if code != http.StatusInternalServerError {
			t.Errorf("POST /-/reload of a bad file: %d, want 500:\n%s", code, body)
		}
		_, landing := httpGet(t, d.url+"/")
		for _, w := range bad.want {
			if !strings.Contains(body, w) {
				t.Errorf("the reload error lacks %q:\n%s", w, body)
			}
			if !strings.Contains(landing, template.HTMLEscapeString(w)) {
				t.Errorf("the landing page lacks %q:\n%s", w, landing)
			}
		}
		reloadBodies = append(reloadBodies, body)
		landings = append(landings, landing)
	}
	_, metrics := httpGet(t, d.url+"/metrics")
	if code := d.stop(t); code != exitOK {
		t.Errorf("exit code %d", code)
	}

	for _, place := range []struct{ name, text string }{
		{"log", d.stderr.String()},
		{"/metrics", metrics},
		{"landing page", strings.Join(landings, "\n")},
		{"reload error", strings.Join(reloadBodies, "\n")},
	} {
		if place.text == "" {
			t.Errorf("%s: empty", place.name)
		}
		for _, s := range secrets {
			if i := strings.Index(place.text, s); i >= 0 {
				t.Errorf("%s holds the secret %q: …%s…", place.name, s, place.text[max(0, i-80):min(len(place.text), i+len(s)+20)])
			}
		}
	}
}

// TestConfigCheck runs --config.check on config/testdata's bad files (exit
// 2, every problem of the golden file printed) and on a good one (exit 0).
func TestConfigCheck(t *testing.T) {
	t.Parallel()
	bad, err := filepath.Glob(filepath.Join("..", "..", "config", "testdata", "bad-*.yml"))
	if err != nil || len(bad) == 0 {
		t.Fatalf("no bad configurations found: %v", err)
	}
	type check struct {
		file     string
		wantCode int
		want     []string // problems, without the file name prefix
	}
	var tests []check
	for _, f := range bad {
		golden, err := os.ReadFile(strings.TrimSuffix(f, ".yml") + ".golden")
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, line := range strings.Split(strings.TrimSpace(string(golden)), "\n") {
			want = append(want, stripConfigPath(line))
		}
		tests = append(tests, check{f, exitBadInput, want})
	}
	tests = append(tests, check{file: fixture(t, "check-good.yml"), wantCode: exitOK})

	for _, tt := range tests {
		t.Run(filepath.Base(tt.file), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), []string{"--config.file=" + tt.file, "--config.check"}, streams{stdout: &stdout, stderr: &stderr})
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			if tt.wantCode == exitOK {
				if want := tt.file + ": configuration is valid\n"; stdout.String() != want {
					t.Errorf("stdout %q, want %q", stdout.String(), want)
				}
				return
			}
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
				if !strings.HasPrefix(line, tt.file+": ") {
					t.Errorf("line not prefixed with the file name %s: %q", tt.file, line)
				}
				got = append(got, stripConfigPath(line))
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("problems differ from the golden file:\n got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if !strings.Contains(stderr.String(), "configuration check failed") {
				t.Errorf("stderr %q lacks the failure", stderr.String())
			}
			if strings.Contains(stdout.String(), "hunter2") {
				t.Errorf("the check printed a secret:\n%s", stdout.String())
			}
		})
	}
}

// stripConfigPath drops the "path/to/file.yml: " prefix of a problem line.
func stripConfigPath(line string) string {
	if i := strings.Index(line, ".yml: "); i >= 0 {
		return line[i+len(".yml: "):]
	}
	return line
}
