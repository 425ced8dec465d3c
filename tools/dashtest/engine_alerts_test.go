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
	// ollamaCompression is F for Ollama: a 5-minute window of rule time
	// is 30 real seconds, 5 of pairsTrace's rows.
	ollamaCompression = 10
	// pairsEvery (milliseconds) and pairsBlock (tokens): pairsTrace's row
	// spacing and block size.
	pairsEvery = 6000
	pairsBlock = 256
	// engineChangeAt: when a real engine is restarted with its cache
	// defeated (rule time): once the cache alerts' baselines have formed
	// (10 evaluations older than 10 minutes).
	engineChangeAt = 16 * time.Minute
	// engineAfterChange: how long a scenario records after the change,
	// past the 15 minutes a page may take.
	engineAfterChange = 17 * time.Minute
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
// alone, before them: with OLLAMA_KEEP_ALIVE=0 it needs each request to
// end before the next is sent.

// TestRealEngineOllama: Ollama reports the prompt tokens its llama.cpp
// served from cache, and the exporter must count exactly what it
// reported: every answer passes through a usageTap, which sums the usage
// Ollama sent, read by code the exporter does not share. The exporter is
// configured as a new user would (dialect ollama, nothing about the
// cache). Then Ollama is restarted with OLLAMA_KEEP_ALIVE=0, a common
// setting to free memory between requests, which unloads the model, and
// its cache, after every request that has none waiting behind it; each
// request then loads the model again. KvloadCacheHitRegression must page
// when Ollama's own answers say its cache stopped serving. Whether it
// stopped is the engine's to say, not the test's: where a busy machine
// makes requests wait for each other, Ollama keeps the model, and its
// cache, for the one waiting, and then the alert must not page. The
// contrast alert, for targets that report nothing, stays silent. The
// signals that need nothing from the server (the cost fit and the TTFT
// contrast of the cache classes) judge times, which a busy machine moves:
// they are logged, not judged.
func TestRealEngineOllama(t *testing.T) {
	root := repoRoot(t)
	ollama := engineBinary(t, "OLLAMA_BIN")
	modelFile := engineBinary(t, "TINY_MODEL")
	kvload, promtool, files := alertTools(t, root)
	res := newEngineScenario(t, files)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "pairs.jsonl"), pairsTrace(60))
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
	tap, tapAddr := newUsageTap(t, addr)

	// The exporter's own estimates look back over real time: scaled by
	// 1/F, like the rules' rate windows.
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
    block_size: %d
    synthesis: {max_osl: 8}
`, tapAddr, rateWindow/ollamaCompression, pairsBlock))

	rec := newRecorder(t, expAddr, ollamaCompression)
	engine := srv
	var restarted time.Time // when the restarted Ollama answered
	recordScenario(t, rec, exp, fixedSpan(engineChangeAt+engineAfterChange), func(at time.Duration) *process {
		if res.changeAt < 0 && at >= engineChangeAt {
			srv.kill()
			engine = startOllama(t, dir, "ollama-keepalive0", ollama, addr, append(env, "OLLAMA_KEEP_ALIVE=0"))
			res.changeAt, restarted = at, time.Now()
		}
		return engine
	})
	evaluateScenario(t, res, rec, promtool, dir, files, "pairs", "ollama")
	res.logTimeline(t)
	res.logContrast(t)

	answers := ollamaCountsExactly(t, tap, expAddr)
	healthy, defeated := sum(answers, time.Time{}, restarted), sum(answers, restarted, time.Now())
	t.Logf("Ollama's own hit rate: %.3f over %d answers before the change, %.3f over %d after it",
		healthy.hitRate(), healthy.answers, defeated.hitRate(), defeated.answers)
	res.neverActive(t, contrastLost)
	// Ollama's hit rate after the change over its healthy one, beside the
	// alert's own threshold on the efficiency over its baseline.
	kept := defeated.hitRate() / healthy.hitRate()
	switch {
	case healthy.answers == 0 || healthy.cached == 0:
		t.Errorf("the healthy Ollama reported %d cached tokens in %d answers: its cache served nothing", healthy.cached, healthy.answers)
	case kept < 0.5:
		res.firesAfterChange(t, hitRegression)
	case kept >= res.effThreshold || math.IsNaN(kept):
		// Requests waited for each other, and Ollama kept its cache.
		t.Logf("Ollama's cache still served after OLLAMA_KEEP_ALIVE=0 (requests waited for each other): the alert must not page")
		res.neverFiring(t, hitRegression)
	default:
		// Partly emptied: the alert reads minutes, this share the whole
		// half, so either may be right; but not before the change.
		if at, ok := res.first(hitRegression, "firing", 0); ok && at < res.changeAt {
			t.Errorf("%s firing at %v, before the change at %v", hitRegression, at, res.changeAt)
		}
		at, fired := res.first(hitRegression, "firing", res.changeAt)
		t.Logf("Ollama's cache kept %.2f of its hit rate (requests waited for each other now and then): %s firing %v (at %v), not judged",
			kept, hitRegression, fired, at)
	}
	before, after := res.medianAround(func(s ruleStep) float64 { return s.effAbs })
	t.Logf("efficiency: median %.3f before the change, %.3f after", before, after)
	// Every pair's second row is served its whole prefix by a working
	// cache, as the model says: the efficiency in the healthy band.
	if math.IsNaN(before) || before < 0.93 || before > 1.05 {
		t.Errorf("efficiency median %.3f on the healthy Ollama, want within [0.93, 1.05]", before)
	}
	ttftBefore, ttftAfter := res.medianAround(func(s ruleStep) float64 { return s.ttftContrast })
	costBefore, costAfter := res.medianAround(func(s ruleStep) float64 { return s.contrast })
	t.Logf("not judged: TTFT contrast median %.3f before the change, %.3f after; cached-token cost over uncached %.3f before, %.3f after",
		ttftBefore, ttftAfter, costBefore, costAfter)
}

// ollamaCountsExactly: once the tap has stopped passing requests on, the
// exporter's counters hold exactly the usage Ollama answered with: every
// successful answer, its prompt and cached tokens, and every answer
// carrying a cached-token count. It hands back the answers.
func ollamaCountsExactly(t *testing.T, tap *usageTap, expAddr string) []tapAnswer {
	t.Helper()
	answers := tap.close()
	sent := sum(answers, time.Time{}, time.Now())
	// The exporter counts an answer once it has read it, a moment after
	// the tap passed its last byte on.
	e := scrapeFamilies(t, "http://"+expAddr+"/metrics")
	for range 50 {
		if sumLabel(e, "kvload_requests_total", "outcome", "success") >= float64(sent.answers) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling interval
		e = scrapeFamilies(t, "http://"+expAddr+"/metrics")
	}
	t.Logf("Ollama answered %d requests whole: %d prompt tokens, %d of them cached; %d without a cached-token count",
		sent.answers, sent.prompt, sent.cached, sent.unreported)
	if sent.answers == 0 || sent.cached == 0 || sent.unreported != 0 {
		t.Errorf("Ollama answered %d requests, %d cached tokens, %d without a count: want answers, cached tokens, and a count in every one",
			sent.answers, sent.cached, sent.unreported)
	}
	for _, c := range []struct {
		what             string
		exporter, ollama float64
	}{
		{"successful requests", sumLabel(e, "kvload_requests_total", "outcome", "success"), float64(sent.answers)},
		{"prompt tokens", familySum(e, "kvload_prompt_tokens_total"), float64(sent.prompt)},
		{"cached prompt tokens", familySum(e, "kvload_cached_prompt_tokens_total"), float64(sent.cached)},
		{"requests not reporting cached tokens", familySum(e, "kvload_cache_unreported_requests_total"), float64(sent.unreported)},
	} {
		if c.exporter != c.ollama {
			t.Errorf("%s: exporter %.0f, Ollama %.0f", c.what, c.exporter, c.ollama)
		}
	}
	return answers
}

// pairsTrace is n rows, one every 6 s, in pairs: a row with a new prefix
// of one to four 256-token blocks and a 64-token tail (cache class none),
// then one with the same prefix and another tail (class most, 80-94 %
// cacheable). Both rows of a pair have the same length, and the lengths
// vary from pair to pair, so that the cost fit can tell what a cached and
// an uncached token cost apart from what every request costs. Ollama
// serves the second row of a pair from the slot the first left. With
// OLLAMA_KEEP_ALIVE=0 every request loads the model again (2.8 s of CPU:
// llama-server's start) before its prefill of at most 1,088 tokens; rows
// 6 s apart let a request end before the next is sent on 2 idle cores: a
// queue would let Ollama keep the model, and its cache, for the request
// waiting. Short prompts keep the test cheap on a busy machine.
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
			pairsEvery*i, pairsBlock*blocks+64, strings.Join(ids, ", "))
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
