package dashtest

// The cache alerts on real engines. The engines serve the trace at its own
// pace, and the recording is time-compressed as in the alert scenarios
// (alertsim.go, rulesim.go): scrape i is stored at rule time
// i × F, the rule files are evaluated over it and promtool cross-checks
// the alerts' states. The alerts read ratios of rates, which F does not
// change; the one absolute rate, the contrast's 0.01 requests/s per cache
// class, becomes 0.01 × F real requests/s. F is lower than the emulator's
// 30: a real engine on 2 cores serves a few requests per second.

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	// llamaCompression is F for llama-server, whose alert reads the
	// efficiency, a ratio of token rates (a 5-minute window is 20 real
	// seconds, about 40 requests).
	llamaCompression = 15
	// ollamaCompression is F for Ollama, whose alert needs each cache
	// class at 0.01 requests/s of rule time: 0.1 real requests/s at 10.
	ollamaCompression = 10
	// engineChangeAt: when a real engine is restarted with its cache
	// defeated (rule time): once the cache alerts' baselines have formed
	// (10 evaluations older than 10 minutes).
	engineChangeAt = 16 * time.Minute
	// engineAfterChange: how long a scenario records after the change,
	// past the 15 minutes a page may take.
	engineAfterChange = 17 * time.Minute
	// ollamaEstimateWindow is the Ollama target's cache.estimate_window,
	// in real time: 40 requests at its one every 3 s, enough for the cost
	// fit (32 at least). It is 20 rule minutes at F = 10, so Ollama's
	// scenario changes later and records longer, to have the fit decided
	// for a while on either side of the change.
	ollamaEstimateWindow = 120 * time.Second
	ollamaChangeAt       = 26 * time.Minute
	ollamaAfterChange    = 30 * time.Minute
)

// TestRealEngineCacheRegression: a deploy restarts llama-server with its
// prompt cache off (--no-cache-prompt), as a bad flag or image would. The
// exporter, configured as a new user would (dialect llamacpp, chat, nothing
// about the cache), keeps replaying the sharing stretch; the cache alert
// must stay quiet while the cache works and page after the restart. The
// same again with the observed hits read from the server's own counter
// (observed: server_metrics, llamacpp:prompt_tokens_cached_total), which
// the restart resets. That variant's healthy half says little: a replica
// takes its share of the engine's counter over 2 real minutes, longer than
// the half's 40 real seconds at F = 15, so there it may read anything
// (0.28-1.14 seen); what it proves is the reset read as a reset and the
// page after it.
func TestRealEngineCacheRegression(t *testing.T) {
	t.Parallel() // see llamaParallel
	root := repoRoot(t)
	server := engineBinary(t, "LLAMA_SERVER_BIN")
	modelFile := engineBinary(t, "TINY_MODEL")
	kvload, promtool, files := alertTools(t, root)
	for _, observed := range []string{"", "server_metrics"} {
		// The exporter's own estimates (the effective capacity, the cost
		// fit) look back over real time, 5 minutes by default: 75 rule
		// minutes at F = 15. Scaled by 1/F, like the rules' rate windows.
		window := fmt.Sprintf("estimate_window: %s", rateWindow/llamaCompression)
		name := "observed usage (default)"
		cache := "\n    cache: {" + window + "}"
		if observed != "" {
			name, cache = "observed "+observed, "\n    cache: {observed: "+observed+", "+window+"}"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res := newEngineScenario(t, files)
			dir := t.TempDir()
			writeLines(t, filepath.Join(root, "testdata", "mooncake", "synthetic_trace.jsonl"),
				filepath.Join(dir, "slice.jsonl"), engineSliceFrom, engineSliceTo)

			addr := freeAddr(t)
			srv := startLlamaServer(t, dir, "llama-server", server, modelFile, addr)
			expAddr, exp := startExporter(t, dir, kvload, fmt.Sprintf(`targets:
  - name: llama
    url: http://%s
    model: tiny
    dialect: llamacpp%s
workloads:
  - name: slice
    trace: slice.jsonl
    targets: [llama]
    synthesis: {speedup_ratio: 2, max_isl: %d, max_osl: 8}
`, addr, cache, engineMaxISL))

			rec := newRecorder(t, expAddr, llamaCompression)
			engine := srv
			recordScenario(t, rec, exp, fixedSpan(engineChangeAt+engineAfterChange), func(at time.Duration) *process {
				if res.changeAt < 0 && at >= engineChangeAt {
					srv.kill()
					engine = startLlamaServer(t, dir, "llama-server-nocache", server, modelFile, addr, "--no-cache-prompt")
					res.changeAt = at
				}
				return engine
			})
			evaluateScenario(t, res, rec, promtool, dir, files, "slice", "llama")
			res.logTimeline(t)
			t.Logf("requests by outcome at the end: %v", res.outcomes)
			res.firesAfterChange(t, hitRegression)
			res.neverActive(t, contrastLost)
			res.whatIf(t, res.efficiencyWhatIf())
			// A window past the restart the cache serves nothing: the
			// efficiency must read so, and with server_metrics the
			// counter's reset must not read as hits (or as a fault).
			for _, s := range res.steps {
				if s.at >= res.changeAt+2*rateWindow && !(s.efficiency < 0.05) {
					t.Errorf("efficiency %.3f at %v, with the cache off since %v: want below 0.05", s.efficiency, s.at, res.changeAt)
					break
				}
			}
		})
	}
}

// llamaParallel: the llama-server tests run side by side (t.Parallel), as
// many at once as go test's -parallel allows, after the tests that run
// alone. They judge counts (prompt, cached and completion tokens, the
// efficiency), which a busy machine does not change. Ollama's test runs
// alone, before them: it judges times.

// TestRealEngineOllama: Ollama reports no cached tokens anywhere, so every
// request counts as not reported, there is no efficiency, and only the
// signals that need nothing from the server can tell the cache works: the
// cached-token cost fit, on TTFT, must read a cached token as nearly free
// on a healthy Ollama, without an alert. Then Ollama is restarted with
// OLLAMA_KEEP_ALIVE=0, a common setting to free memory between requests,
// which unloads the model, and its cache, after every request: a cached
// token must then cost as much as an uncached one.
func TestRealEngineOllama(t *testing.T) {
	root := repoRoot(t)
	ollama := engineBinary(t, "OLLAMA_BIN")
	modelFile := engineBinary(t, "TINY_MODEL")
	kvload, promtool, files := alertTools(t, root)
	res := newEngineScenario(t, files)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "pairs.jsonl"), pairsTrace(120))
	addr := freeAddr(t)
	env := []string{"HOME=" + filepath.Join(dir, "home"), "OLLAMA_NO_CLOUD=1", "OLLAMA_HOST=" + addr, "OLLAMA_MODELS=" + filepath.Join(dir, "models")}
	if err := os.MkdirAll(filepath.Join(dir, "home"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startOllama(t, dir, "ollama", ollama, addr, env)
	writeFile(t, filepath.Join(dir, "Modelfile"), "FROM "+modelFile+"\n")
	create := exec.CommandContext(t.Context(), ollama, "create", "tiny", "-f", filepath.Join(dir, "Modelfile"))
	create.Env = append(os.Environ(), env...)
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("ollama create: %v\n%s", err, out)
	}

	expAddr, exp := startExporter(t, dir, kvload, fmt.Sprintf(`targets:
  - name: ollama
    url: http://%s
    model: tiny
    dialect: ollama
    cache: {estimate_window: %s}
workloads:
  - name: pairs
    trace: pairs.jsonl
    targets: [ollama]
    synthesis: {max_osl: 8}
`, addr, ollamaEstimateWindow))

	rec := newRecorder(t, expAddr, ollamaCompression)
	engine := srv
	recordScenario(t, rec, exp, fixedSpan(ollamaChangeAt+ollamaAfterChange), func(at time.Duration) *process {
		if res.changeAt < 0 && at >= ollamaChangeAt {
			srv.kill()
			engine = startOllama(t, dir, "ollama-keepalive0", ollama, addr, append(env, "OLLAMA_KEEP_ALIVE=0"))
			res.changeAt = at
		}
		return engine
	})
	evaluateScenario(t, res, rec, promtool, dir, files, "pairs", "ollama")
	res.logTimeline(t)
	res.logContrast(t)
	res.whatIf(t, res.contrastWhatIf())

	e := scrapeFamilies(t, "http://"+expAddr+"/metrics")
	ok := sumLabel(e, "kvload_requests_total", "outcome", "success")
	unreported := familySum(e, "kvload_cache_unreported_requests_total")
	reportedPrompt := familySum(e, "kvload_cache_reported_prompt_tokens_total")
	t.Logf("requests by outcome at the end: %v; %.0f not reporting cached tokens", res.outcomes, unreported)
	if ok == 0 || unreported != ok || reportedPrompt != 0 {
		t.Errorf("%.0f of %.0f successful requests counted as not reported, %.0f prompt tokens on the reported side: Ollama reports no cached tokens",
			unreported, ok, reportedPrompt)
	}
	res.efficiencyAbsent(t)
	res.neverActive(t, hitRegression)
	// Healthy: after the first window, no contrast alert; the contrast
	// itself well below the threshold.
	for _, s := range res.steps {
		if s.at >= rateWindow && s.at < res.changeAt && s.state(contrastLost) != "inactive" {
			t.Errorf("%s %s at %v on a healthy Ollama", contrastLost, s.state(contrastLost), s.at)
			break
		}
	}
	// Both black-box signals must separate the two: the TTFT contrast
	// between cache classes (most over none, per prompt token), and the
	// cached-token cost fit that the alert reads, once its window holds
	// only requests of one side.
	before, after := res.medianAround(func(s ruleStep) float64 { return s.ttftContrast })
	t.Logf("TTFT contrast: median %.3f before the change, %.3f after", before, after)
	if math.IsNaN(before) || before > 0.5 {
		t.Errorf("TTFT contrast median %.3f before the change, want at most 0.5 on a working cache", before)
	}
	if math.IsNaN(after) || after <= 0.5 {
		t.Errorf("TTFT contrast median %.3f once the cache is defeated, want above 0.5", after)
	}
	settle := time.Duration(ollamaCompression) * ollamaEstimateWindow
	costBefore, costAfter, nBefore, nAfter := res.medianAroundSettled(func(s ruleStep) float64 { return s.contrast }, settle)
	t.Logf("cached-token cost over uncached: median %.3f of %d steps before the change, %.3f of %d from %v after it",
		costBefore, nBefore, costAfter, nAfter, settle)
	if nBefore < 5 || math.IsNaN(costBefore) || costBefore > 0.3 {
		t.Errorf("cached-token cost ratio median %.3f over %d decided steps before the change, want at most 0.3 over 5 or more: a cached token is nearly free on a working cache",
			costBefore, nBefore)
	}
	if nAfter < 5 || math.IsNaN(costAfter) || costAfter < 0.7 || costAfter-costBefore < 0.5 {
		t.Errorf("cached-token cost ratio median %.3f over %d decided steps after the change (%.3f before), want 0.7 or more over 5 or more, and 0.5 above before: with OLLAMA_KEEP_ALIVE=0 a cached token costs what an uncached one does",
			costAfter, nAfter, costBefore)
	}
}

// pairsTrace is n rows, one every 3 s, in pairs: a row with a new prefix
// of one to four 512-token blocks and a 64-token tail (cache class none),
// then one with the same prefix and another tail (class most, 89-97 %
// cacheable). Both rows of a pair have the same length, so the classes
// have equal lengths and a cache that serves nothing gives them equal TTFT
// per token even when requests queue; and each class runs at 1/6
// requests/s, 0.017 at F = 10, above the contrast's 0.01. The lengths vary
// from pair to pair so that the cost fit can tell what a cached and an
// uncached token cost apart from what every request costs (with one
// length, uncached and cached tokens sum to a constant). Ollama keeps one
// slot, the last prompt it ran: it serves the second row of a pair from
// it, as a longer trace interleaving conversations would not show as
// reliably. With the model reloaded for every request (about 1.1 s on an
// idle machine, more on a busy one) and a 2,112-token prefill (0.6 s), a
// request still ends before the next is sent: a queue would let Ollama
// keep the model, and its cache, for the request waiting.
func pairsTrace(n int) string {
	var b strings.Builder
	next := 0 // the first hash id of the pair's prefix
	for i := range n {
		blocks := 1 + (i/2)%4
		ids := make([]string, 0, blocks+1)
		for k := range blocks {
			ids = append(ids, fmt.Sprint(next+k))
		}
		ids = append(ids, fmt.Sprint(next+blocks+i%2*1000000)) // the row's own tail
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 8, "hash_ids": [%s]}`+"\n",
			3000*i, 512*blocks+64, strings.Join(ids, ", "))
		if i%2 == 1 {
			next += blocks + 1
		}
	}
	return b.String()
}

// alertTools are what an alert scenario runs and reads: the exporter,
// promtool and both rule files.
func alertTools(t *testing.T, root string) (kvload, promtool string, files []string) {
	t.Helper()
	bin := t.TempDir()
	kvload = binary(t, "KVLOAD_EXPORTER_BIN", root, "./cmd/kvload-exporter", bin)
	promtool = binary(t, "PROMTOOL_BIN", filepath.Join(root, "tools"), "github.com/prometheus/prometheus/cmd/promtool", bin)
	return kvload, promtool, ruleFiles(root)
}

// newEngineScenario is a scenario without its change yet, with the cache
// alerts' thresholds and holds as the rule files have them.
func newEngineScenario(t *testing.T, files []string) *scenarioResult {
	t.Helper()
	res := &scenarioResult{changeAt: -1}
	var err error
	if res.effThreshold, res.hitHold, err = alertThreshold(files, hitRegression, efficiencyRule); err != nil {
		t.Fatal(err)
	}
	if res.contrastThreshold, res.contrastHold, err = alertThreshold(files, contrastLost, contrastRule); err != nil {
		t.Fatal(err)
	}
	return res
}
