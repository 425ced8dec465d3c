package e2e

// Acceptance tests of the daemon: the whole program (cli.Run) against local
// OpenAI-compatible servers, driven through its config file, its HTTP
// endpoints and, for shutdown, signals to a real process. Their harness is
// harness_test.go.

import (
	"bytes"
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

var updateDaemon = flag.Bool("update-daemon", false, "rewrite the daemon golden files")

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
	byMax := map[int]testutil.Usage{
		3: {Prompt: 45, Completion: 3, Cached: 0},
		5: {Prompt: 45, Completion: 5, Cached: 32},
		7: {Prompt: 25, Completion: 7, Cached: 0},
		9: {Prompt: 25, Completion: 9, Cached: 16},
	}
	srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) { f.Usage = func(n int) testutil.Usage { return byMax[n] } })
	cfg := filepath.Join(t.TempDir(), "kvload.yml")
	target := daemontest.Target("fake", srv.URL)
	target.Model = "fake-model"
	daemontest.WriteConfig(t, cfg, config.Config{
		Targets:   []config.Target{target},
		Workloads: []config.Workload{daemontest.Workload("golden", fixture(t, "tiny.jsonl"), "fake")},
	})
	d := startDaemon(t, "--config.file="+cfg)

	goldenPath := fixture(t, "golden.prom")
	if *updateDaemon {
		testutil.Eventually(t, "four requests counted", func() (bool, string) {
			mfs := testutil.Scrape(t, d.url)
			n, _ := mfs.Value("kvload_theoretical_cached_prompt_tokens_total")
			s, _ := mfs.Value("kvload_requests_total", "outcome", "success")
			return s == 4 && n == 48, fmt.Sprint(s, n)
		})
		var out bytes.Buffer
		mfs := testutil.Scrape(t, d.url)
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
	var mfs testutil.Families
	testutil.Eventually(t, "/metrics matching "+goldenPath, func() (bool, string) {
		mfs = testutil.Scrape(t, d.url)
		err := promtestutil.GatherAndCompare(mfs.Gatherer(), bytes.NewReader(golden), goldenMetrics...)
		if err != nil {
			return false, err.Error()
		}
		for _, h := range histograms {
			if n, series := mfs.Value(h, "workload", "golden", "target", "fake"); n != 4 || series != 1 {
				var text bytes.Buffer
				if mf := mfs[h]; mf != nil {
					_, _ = expfmt.MetricFamilyToText(&text, mf) // for the failure message only
				}
				return false, fmt.Sprintf("%s: count %v in %d series, want 4 in 1:\n%s", h, n, series, text.String())
			}
		}
		return true, ""
	})

	if got := srv.Count("/v1/chat/completions"); got != 4 {
		t.Errorf("the server saw %d requests, want 4", got)
	}

	var kv []string
	for name := range mfs {
		if strings.HasPrefix(name, "kvload_") {
			kv = append(kv, name)
		}
	}
	problems, err := promtestutil.GatherAndLint(mfs.Gatherer(), kv...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if code := d.stop(t); code != cli.ExitOK {
		t.Errorf("exit code %d, want 0", code)
	}
}

// TestDaemonReloadEndpoint is the wiring of POST /-/reload: 500 with every
// problem of a bad file, shown on the landing page, and the gauge at 0 in
// /metrics; 200 for a good one; 405 for a GET. What a reload keeps, restarts
// and removes is lifecycle.TestReloadUnits.
func TestDaemonReloadEndpoint(t *testing.T) {
	t.Parallel()
	srv := testutil.NewFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	good := func(workloads ...string) config.Config {
		cfg := config.Config{Targets: []config.Target{daemontest.Target("t", srv.URL)}}
		for _, w := range workloads {
			cfg.Workloads = append(cfg.Workloads, daemontest.Workload(w, trace, "t"))
		}
		return cfg
	}
	daemontest.WriteConfig(t, path, good("a", "b"))
	d := startDaemon(t, "--config.file="+path)
	testutil.Eventually(t, "both workloads replaying", func() (bool, string) {
		mfs := testutil.Scrape(t, d.url)
		a, _ := mfs.Value("kvload_requests_total", "workload", "a", "outcome", "success")
		b, _ := mfs.Value("kvload_requests_total", "workload", "b", "outcome", "success")
		return a == 2 && b == 2, fmt.Sprint(a, b)
	})

	bad := good("a", "b")
	bad.Workloads[0].Targets = []string{"nope"}
	bad.Workloads[0].Loop = "forever"
	daemontest.WriteConfig(t, path, bad)
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
	mfs := testutil.Scrape(t, d.url)
	if v, n := mfs.Value("kvload_config_last_reload_successful"); v != 0 || n != 1 {
		t.Errorf("kvload_config_last_reload_successful %v (%d series), want 0", v, n)
	}
	if _, page := httpGet(t, d.url+"/"); !strings.Contains(page, "unknown target &#34;nope&#34;") {
		t.Errorf("landing page does not show the reload problem:\n%s", page)
	}

	daemontest.WriteConfig(t, path, good("a"))
	if code, body := postReload(t, d.url); code != http.StatusOK || !strings.Contains(body, "Reloaded") {
		t.Errorf("POST /-/reload of a good file: %d %q, want 200", code, body)
	}
	if v, _ := testutil.Scrape(t, d.url).Value("kvload_config_last_reload_successful"); v != 1 {
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
	const want = "requests_success=0 requests_http_error=0 requests_stream_error=0 requests_timeout=0 requests_connection_error=0 requests_canceled=3 requests_abandoned=0 requests_in_flight=0"
	srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) { f.Release = make(chan struct{}) })
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, daemontest.Config(srv.URL, fixture(t, "held.jsonl")))
	p := startProcess(t, "--config.file="+path, "--web.listen-address=127.0.0.1:0",
		"--shutdown.drain-timeout=200ms", "--log.level=debug")
	p.waitListening(t)
	testutil.Eventually(t, "three requests in flight", func() (bool, string) {
		mfs, err := testutil.TryScrape(p.base)
		if err != nil {
			return false, err.Error()
		}
		f, _ := mfs.Value("kvload_requests_in_flight")
		return f == 3 && srv.Count("/v1/chat/completions") == 3, fmt.Sprint(f, " in flight")
	})
	p.signal(t, syscall.SIGTERM)
	testutil.Wait(t, "the exit after SIGTERM", p.exited)
	if p.err != nil {
		t.Errorf("exit: %v, want status 0\n%s", p.err, p.stderr.String())
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
	srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) {
		f.Fail = func(r *http.Request, n int) (int, string) {
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
	daemontest.WriteFile(t, path, config)
	d := startDaemon(t, "--config.file="+path, "--log.level=debug")
	testutil.Eventually(t, "every request failed", func() (bool, string) {
		v, _ := testutil.Scrape(t, d.url).Value("kvload_requests_total", "outcome", "http_error")
		return v == 12, fmt.Sprint(v)
	})
	for _, h := range []string{"Bearer " + bearer, "Basic " + secrets[3], "Basic " + secrets[4]} {
		if n := srv.Auth(h); n != 4 {
			t.Errorf("the server saw Authorization %q %d times, want 4 (the credentials are not in use)", h, n)
		}
	}

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
		daemontest.WriteFile(t, path, bad.config)
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
	if code := d.stop(t); code != cli.ExitOK {
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
		tests = append(tests, check{f, cli.ExitBadInput, want})
	}
	tests = append(tests, check{file: fixture(t, "check-good.yml"), wantCode: cli.ExitOK})

	for _, tt := range tests {
		t.Run(filepath.Base(tt.file), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := cli.Run(context.Background(), []string{"--config.file=" + tt.file, "--config.check"}, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			if tt.wantCode == cli.ExitOK {
				out := stdout.String()
				if want := tt.file + ": configuration is valid\n"; !strings.HasSuffix(out, want) || !strings.HasPrefix(out, "memory at the configuration's bounds (estimate):\n") {
					t.Errorf("stdout %q, want the memory estimate, then %q", out, want)
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

// TestConfigCheckMemoryLimit: --config.check refuses, with a YAML path, a
// configuration whose memory estimate exceeds --memory.limit, and a start
// refuses it too, before it listens; 0 is no limit.
func TestConfigCheckMemoryLimit(t *testing.T) {
	t.Parallel()
	good := fixture(t, "check-good.yml")
	for _, tc := range []struct {
		name  string
		args  []string
		code  int
		stdio string // in stdout or stderr
	}{
		{"check under the limit", []string{"--config.check", "--memory.limit=64GiB"}, cli.ExitOK, "configuration is valid"},
		{"check with no limit", []string{"--config.check", "--memory.limit=0"}, cli.ExitOK, "configuration is valid"},
		{"check past the limit", []string{"--config.check", "--memory.limit=1MiB"}, cli.ExitBadInput, good + ": workloads[0].targets[0]: the configuration's memory estimate exceeds the memory limit"},
		{"start past the limit", []string{"--memory.limit=1MiB", "--web.listen-address=127.0.0.1:0"}, cli.ExitBadInput, good + ": workloads[0].targets[0]: the configuration's memory estimate exceeds the memory limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := cli.Run(context.Background(), append([]string{"--config.file=" + good}, tc.args...), &stdout, &stderr)
			if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.stdio) {
				t.Errorf("exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", code, tc.code, tc.stdio, stdout.String(), stderr.String())
			}
		})
	}
}
