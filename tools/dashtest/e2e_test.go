package dashtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
)

// The end-to-end test: the engine emulator, the exporter replaying a trace
// against it, a stub SGLang /metrics (the emulator's counters under SGLang's
// names) and a real Prometheus, all on 127.0.0.1, in a temporary directory.
//
// Binaries come from KVLOAD_EXPORTER_BIN, PROMETHEUS_BIN and PROMTOOL_BIN
// (the Makefile passes bin/...); any left unset is built with go build.

const (
	e2eWorkload = "e2e"
	e2eTarget   = "emulated"
	e2eModel    = "kvload-emulated"
)

func TestPrometheusEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: several minutes")
	}
	// Mostly waiting for Prometheus' rate windows to fill: it runs beside
	// the alert scenarios (make test-prometheus-alerts).
	t.Parallel()
	begin := time.Now()
	root := repoRoot(t)
	dir := t.TempDir()
	kvload := binary(t, "KVLOAD_EXPORTER_BIN", root, "./cmd/kvload-exporter", dir)
	prometheus := binary(t, "PROMETHEUS_BIN", filepath.Join(root, "tools"), "github.com/prometheus/prometheus/cmd/prometheus", dir)
	promtool := binary(t, "PROMTOOL_BIN", filepath.Join(root, "tools"), "github.com/prometheus/prometheus/cmd/promtool", dir)
	// The cache alert's threshold, as the rule file has it.
	effThreshold, _, err := alertThreshold(ruleFiles(root), hitRegression, efficiencyRule)
	if err != nil {
		t.Fatal(err)
	}

	// The engine emulator, with fast token timing so traffic is steady.
	emuAddr := freeAddr(t)
	// A capacity far above what the trace's first 1,000 rows need (the
	// cache dashboard draws the model's capacity beside the effective one
	// where it is known and finite).
	// Its KV events too, which the missed-hits panel draws.
	eventsAddr := freeAddr(t)
	emu := startProcess(t, dir, "emulator", kvload, "emulate", "--listen", emuAddr, "--model", e2eModel,
		"--overhead", "1ms", "--inter-token", "1ms", "--capacity-blocks", "1000000", "--kv-events", "tcp://"+eventsAddr)
	waitHTTP(t, emu, "http://"+emuAddr+"/metrics", time.Minute)

	sglangAddr := sglangStub(t, "http://"+emuAddr+"/metrics")

	// The exporter: the bundled conversation trace, 4x as fast as recorded.
	// Nothing about the cache: block size and capacity are read from the
	// engine (auto), as for a new user.
	trace := filepath.Join(root, "examples", "traces", "conversation_head1000.jsonl")
	cfg := fmt.Sprintf(`targets:
  - name: %s
    url: http://%s
    model: %s
    dialect: vllm
    cache: {kv_events: "tcp://%s"}
workloads:
  - name: %s
    trace: %s
    targets: [%s]
    seed: 7
    synthesis: {speedup_ratio: 4, max_osl: 32}
    loop: fresh
    max_in_flight: 64
`, e2eTarget, emuAddr, e2eModel, eventsAddr, e2eWorkload, trace, e2eTarget)
	writeFile(t, filepath.Join(dir, "kvload.yml"), cfg)
	expAddr := freeAddr(t)
	exp := startProcess(t, dir, "exporter", kvload, "--config.file="+filepath.Join(dir, "kvload.yml"),
		"--web.listen-address="+expAddr)
	waitHTTP(t, exp, "http://"+expAddr+"/-/ready", time.Minute)

	// Prometheus: 1 s scrapes and rule evaluations, the rules under test,
	// native histograms on (and the classic ones kept, so both query forms
	// can be checked).
	rules, _ := filepath.Glob(filepath.Join(root, "dashboards", "rules", "*.yml"))
	var rf strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&rf, "  - %q\n", r)
	}
	promCfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
%sscrape_configs:
  - job_name: kvload
    always_scrape_classic_histograms: true
    static_configs: [{targets: [%q]}]
  - job_name: vllm
    static_configs: [{targets: [%q]}]
  - job_name: sglang
    static_configs: [{targets: [%q]}]
`, rf.String(), expAddr, emuAddr, sglangAddr)
	writeFile(t, filepath.Join(dir, "prometheus.yml"), promCfg)
	promAddr := freeAddr(t)
	promProc := startProcess(t, dir, "prometheus", prometheus,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr,
		"--enable-feature=native-histograms")
	waitHTTP(t, promProc, "http://"+promAddr+"/-/ready", 2*time.Minute)
	prom := &promAPI{base: "http://" + promAddr}
	t.Logf("all processes up after %v", time.Since(begin).Round(time.Second))

	t.Run("rules", func(t *testing.T) {
		tests, _ := filepath.Glob(filepath.Join(root, "dashboards", "rules", "tests", "*.yml"))
		run(t, promtool, append([]string{"check", "rules"}, rules...)...)
		run(t, promtool, append([]string{"test", "rules"}, tests...)...)
	})

	t.Run("dashboard queries", func(t *testing.T) {
		start := time.Now()
		checkDashboardQueries(t, prom, 4*time.Minute)
		t.Logf("every dashboard query returned data after %v", time.Since(start).Round(time.Second))
	})

	t.Run("recording rules", func(t *testing.T) {
		recorded, _ := loadRules(t)
		var qs []check
		for name := range recorded {
			// A baseline forms 20 minutes after the first requests, longer
			// than this test runs; the alert scenarios cover those rules.
			if strings.HasSuffix(name, ":baseline_1d") || strings.HasSuffix(name, ":ratio_to_baseline") {
				continue
			}
			sel := fmt.Sprintf(`{workload=%q,target=%q}`, e2eWorkload, e2eTarget)
			if strings.HasPrefix(name, "target:") {
				sel = fmt.Sprintf(`{target=%q}`, e2eTarget) // of the target's engine: no workload
			}
			qs = append(qs, check{name: name, expr: name + sel})
		}
		pollChecks(t, prom, qs, 3*time.Minute)
	})

	t.Run("cache layout read from the engine", func(t *testing.T) {
		// vllm:cache_config_info: the emulator's default vLLM block.
		sel := fmt.Sprintf(`{target=%q}`, e2eTarget)
		waitValue(t, prom, "kvload_target_cache_block_size_tokens"+sel, func(v float64) bool { return v == 16 }, time.Minute, "block size 16 read from the engine")
		waitValue(t, prom, "kvload_target_cache_capacity_known"+sel, func(v float64) bool { return v == 1 }, time.Minute, "capacity read from the engine")
	})

	t.Run("cache regression", func(t *testing.T) {
		checkCacheRegression(t, prom, "http://"+emuAddr, effThreshold)
	})
	t.Logf("end-to-end test took %v", time.Since(begin).Round(time.Second))
}

// checkDashboardQueries runs every query of every dashboard panel and every
// variable query, variables substituted, until each returns at least one
// finite sample. The native and classic branches of the histogram
// quantile queries (A or B) are checked on their own too.
func checkDashboardQueries(t *testing.T, prom *promAPI, within time.Duration) {
	vals := map[string]string{
		"__rate_interval": "30s",
		"job":             ".*", "instance": ".*", "engine_job": ".*", "engine_instance": ".*",
		"workload": e2eWorkload, "target": e2eTarget,
	}
	var checks []check
	for _, d := range loadDashboards(t) {
		for _, q := range d.queries() {
			s, err := substitute(q.Expr, vals)
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			checks = append(checks, check{name: q.String(), expr: s})
			e, err := parser.ParseExpr(s)
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			if b, ok := e.(*parser.BinaryExpr); ok && b.Op == parser.LOR {
				checks = append(checks,
					check{name: q.String() + " (native branch)", expr: b.LHS.String()},
					check{name: q.String() + " (classic branch)", expr: b.RHS.String()})
			}
		}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			sel, label, ok := labelValues(v.queryString())
			if !ok {
				t.Fatalf("%s: variable %s: %q", filepath.Base(d.path), v.Name, v.queryString())
			}
			s, err := substitute(sel, vals)
			if err != nil {
				t.Fatal(err)
			}
			checks = append(checks, check{name: filepath.Base(d.path) + ": variable " + v.Name, labelValues: label, expr: s})
		}
	}
	pollChecks(t, prom, checks, within)
}

type check struct {
	name, expr  string
	labelValues string // set: a label_values(expr, labelValues) variable query
}

// pollChecks repeats the checks not yet satisfied until all are, or fails
// with the ones left when the deadline passes.
func pollChecks(t *testing.T, prom *promAPI, checks []check, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	pending := checks
	var last map[string]string
	for {
		last = map[string]string{}
		var still []check
		for _, c := range pending {
			if c.labelValues != "" {
				vs, err := prom.labelValues(c.labelValues, c.expr)
				if err == nil && len(vs) > 0 {
					continue
				}
				last[c.name] = fmt.Sprintf("label values %v, %v", vs, err)
			} else {
				res, err := prom.query(c.expr)
				if err == nil && res.finite() > 0 {
					continue
				}
				last[c.name] = fmt.Sprintf("%d series, %d finite, err %v", len(res), res.finite(), err)
			}
			still = append(still, c)
		}
		pending = still
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second) // polling interval
	}
	for _, c := range pending {
		t.Errorf("%s: no data within %v (%s)\n  %s", c.name, within, last[c.name], c.expr)
	}
}

// checkCacheRegression switches the emulator's prefix cache off at run
// time and waits for the cache-efficiency recording rule to fall below the
// KvloadCacheHitRegression threshold (read from the rule file) and the
// alert to go pending.
func checkCacheRegression(t *testing.T, prom *promAPI, emu string, efficiencyThreshold float64) {
	eff := fmt.Sprintf(`workload_target:kvload_cache_efficiency:ratio_rate5m{workload=%q,target=%q}`, e2eWorkload, e2eTarget)
	theo := fmt.Sprintf(`workload_target:kvload_cache_theoretical_hit:ratio_rate5m{workload=%q,target=%q}`, e2eWorkload, e2eTarget)

	// Healthy first: two minutes of history in which the emulator caches
	// what the trace allows, the trace offers enough to hit (above the
	// alert's 5 % epsilon) and the alert's condition never held.
	history := `count_over_time(up{job="kvload"}[5m])`
	waitValue(t, prom, history, func(v float64) bool { return v >= 120 }, 3*time.Minute, "two minutes of scrapes")
	before := waitValue(t, prom, eff, func(v float64) bool { return v > 0.8 }, time.Minute, "efficiency above 0.8")
	waitValue(t, prom, theo, func(v float64) bool { return v > 0.05 }, 2*time.Minute, "theoretical hit rate above 0.05")
	minEff := waitValue(t, prom, "min_over_time("+eff+"[1m])", func(v float64) bool { return v > efficiencyThreshold }, time.Minute, "efficiency above the threshold for a minute")
	if res, err := prom.query(`ALERTS{alertname="KvloadCacheHitRegression"}`); err != nil || len(res) > 0 {
		t.Fatalf("KvloadCacheHitRegression before the cache is disabled: %v %v", res, err)
	}
	th, _ := prom.scalar(theo)
	t.Logf("before: efficiency %.3f (minimum over the last minute %.3f), theoretical hit rate %.3f", before, minEff, th)

	resp, err := http.Post(emu+"/emulator/cache", "application/json", strings.NewReader(`{"enabled": false}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /emulator/cache: %s: %s", resp.Status, body)
	}
	off := time.Now()

	after := waitValue(t, prom, eff, func(v float64) bool { return v < efficiencyThreshold }, 6*time.Minute, "efficiency below the threshold")
	t.Logf("after disabling the cache: efficiency %.3f (< %g) after %v", after, efficiencyThreshold, time.Since(off).Round(time.Second))

	// The alert compares the efficiency with its own baseline, which forms
	// 20 minutes after the first requests: this run is younger, so it is
	// silent, as it is on any fresh deployment (the alert scenarios, on a
	// compressed clock, show it paging once the baseline is there).
	baseline := fmt.Sprintf(`workload_target:kvload_cache_efficiency:baseline_1d{workload=%q,target=%q}`, e2eWorkload, e2eTarget)
	if res, err := prom.query(baseline); err != nil || len(res) > 0 {
		t.Errorf("an efficiency baseline %v (%v) within minutes of the start, want none before 20 minutes", res, err)
	}
	if res, err := prom.query(`ALERTS{alertname="KvloadCacheHitRegression"}`); err != nil || len(res) > 0 {
		t.Errorf("KvloadCacheHitRegression without a baseline: %v %v", res, err)
	}
	th, _ = prom.scalar(theo)
	t.Logf("no baseline yet, no alert (theoretical hit rate %.3f)", th)

	// The engine's own counters (the cache dashboard's vLLM panel) agree.
	engine := `sum(rate(vllm:prefix_cache_hits_total[30s])) / sum(rate(vllm:prefix_cache_queries_total[30s]))`
	waitValue(t, prom, engine, func(v float64) bool { return v == 0 }, time.Minute, "engine-reported hit rate 0")
}

// waitValue polls a single-series query until ok(value) or the deadline.
func waitValue(t *testing.T, prom *promAPI, expr string, ok func(float64) bool, within time.Duration, what string) float64 {
	t.Helper()
	deadline := time.Now().Add(within)
	var v float64
	var err error
	for {
		v, err = prom.scalar(expr)
		if err == nil && ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v: last value %v, %v\n  %s", what, within, v, err, expr)
		}
		time.Sleep(time.Second) // polling interval
	}
}

// --- Prometheus HTTP API ----------------------------------------------------

type promAPI struct{ base string }

type sample struct {
	Metric    map[string]string `json:"metric"`
	Value     []any             `json:"value"`     // [time, "float"]
	Histogram []any             `json:"histogram"` // [time, {...}]: a native histogram
}

type result []sample

// finite counts the samples with a finite float value (histogram samples
// count too).
func (r result) finite() int {
	n := 0
	for _, s := range r {
		if s.Histogram != nil {
			n++
			continue
		}
		if len(s.Value) == 2 {
			str, _ := s.Value[1].(string)
			if f, err := strconv.ParseFloat(str, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
				n++
			}
		}
	}
	return n
}

func (p *promAPI) get(path string, params url.Values, into any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+params.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %s: %v", path, resp.Status, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, into)
}

func (p *promAPI) query(expr string) (result, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     result `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s, want vector", data.ResultType)
	}
	return data.Result, nil
}

// scalar is the value of a query that must return exactly one float sample.
func (p *promAPI) scalar(expr string) (float64, error) {
	res, err := p.query(expr)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || len(res[0].Value) != 2 {
		return 0, fmt.Errorf("%d series", len(res))
	}
	str, _ := res[0].Value[1].(string)
	return strconv.ParseFloat(str, 64)
}

func (p *promAPI) labelValues(label, selector string) ([]string, error) {
	var vs []string
	err := p.get("/api/v1/label/"+label+"/values", url.Values{"match[]": {selector}}, &vs)
	return vs, err
}

// --- processes ----------------------------------------------------------------

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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
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

// sglangStub serves the emulator's prefix-cache counters under SGLang's
// names (sglang:cached_tokens_total, sglang:prompt_tokens_total), so that
// the SGLang panels have a real, moving engine series to show.
func sglangStub(t *testing.T, emuMetrics string) string {
	t.Helper()
	rename := map[string]string{
		"vllm:prefix_cache_hits_total":    "sglang:cached_tokens_total",
		"vllm:prefix_cache_queries_total": "sglang:prompt_tokens_total",
	}
	client := &http.Client{Timeout: 5 * time.Second}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, emuMetrics, nil)
		req.Header.Set("Accept", "text/plain;version=0.0.4")
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			for from, to := range rename {
				if strings.HasPrefix(line, from+"{") || strings.HasPrefix(line, from+" ") {
					fmt.Fprintf(&out, "# TYPE %s counter\n%s%s\n", to, to, strings.TrimPrefix(line, from))
				}
			}
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(out.Bytes())
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}
