package dashtest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
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
    slo: {ttft: 30s, objective: 0.99}
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
			// A pair is settled after 20 minutes and a day's median
			// (a baseline, what the cache held) forms 15 minutes later,
			// longer than this test runs; the alert scenarios cover
			// those rules.
			if strings.Contains(name, "settled") || strings.HasSuffix(name, "_1d") || strings.HasSuffix(name, ":ratio_to_baseline") {
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
	// 40 minutes after the first requests: this run is younger, so it is
	// silent, as it is on any fresh deployment (the alert scenarios, on a
	// compressed clock, show it paging once the baseline is there).
	baseline := fmt.Sprintf(`workload_target:kvload_cache_efficiency:baseline_1d{workload=%q,target=%q}`, e2eWorkload, e2eTarget)
	if res, err := prom.query(baseline); err != nil || len(res) > 0 {
		t.Errorf("an efficiency baseline %v (%v) within minutes of the start, want none before 40 minutes", res, err)
	}
	if res, err := prom.query(`ALERTS{alertname="KvloadCacheHitRegression"}`); err != nil || len(res) > 0 {
		t.Errorf("KvloadCacheHitRegression without a baseline: %v %v", res, err)
	}
	th, _ = prom.scalar(theo)
	t.Logf("no baseline yet, no alert (theoretical hit rate %.3f)", th)

	// The engine's own counters (the cache dashboard's vLLM panel) agree.
	engine := `sum(rate(vllm:prompt_tokens_cached_total[30s])) / sum(rate(vllm:prompt_tokens_total[30s]))`
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

// --- processes ----------------------------------------------------------------

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
