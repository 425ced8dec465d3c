package dashtest

// Real engines: llama.cpp's llama-server, built from the source that npm's
// node-llama-cpp carries, serving a tiny random-weight model with the real
// Llama-3.1 vocabulary (scripts/engines/). `make test-engines` builds or
// finds both and runs this; the exporter's figures are checked against what
// the server itself counts, a truth the exporter's code did not write.

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// TestRealEngineLlamaServer replays a prefix-sharing stretch of the shared
// synthetic trace once against a real llama-server, configured as a new
// user would (dialect llamacpp, nothing about its cache), and checks the
// exporter's counters against the server's own /metrics. One closed-loop
// user sends the rows, one after another in the trace's order: on the
// trace's own pace a slowed engine (two cores shared with other work) fell
// behind and rows were dropped, and with four users the slots a request
// met depended on the engine's speed, so the machine decided the figures.
func TestRealEngineLlamaServer(t *testing.T) {
	t.Parallel()             // see llamaParallel
	rc := newFailureRecap(t) // before the processes: see failureRecap
	root := repoRoot(t)
	server := engineBinary(t, "LLAMA_SERVER_BIN")
	modelFile := engineBinary(t, "TINY_MODEL")
	kvload := binary(t, "KVLOAD_EXPORTER_BIN", root, "./cmd/kvload-exporter", t.TempDir())
	dir := t.TempDir()
	writeLines(t, filepath.Join(root, "testdata", "mooncake", "synthetic_trace.jsonl"),
		filepath.Join(dir, "slice.jsonl"), engineSliceFrom, engineSliceTo)

	serverAddr := freeAddr(t)
	startLlamaServer(t, dir, "llama-server", server, modelFile, serverAddr)

	cfg := fmt.Sprintf(`targets:
  - name: llama
    url: http://%s
    model: tiny
    dialect: llamacpp
    api: completions
workloads:
  - name: slice
    trace: slice.jsonl
    targets: [llama]
    synthesis: {max_isl: %d, max_osl: 8}
    schedule: {users: 1}
    loop: once
`, serverAddr, engineMaxISL)
	expAddr := replayOnce(t, dir, kvload, cfg, 15*time.Minute)
	e := scrapeFamilies(t, "http://"+expAddr+"/metrics")
	s := scrapeFamilies(t, "http://"+serverAddr+"/metrics")

	ok := sumLabel(e, "kvload_requests_total", "outcome", "success")
	failed := familySum(e, "kvload_requests_total") - ok
	dropped := familySum(e, "kvload_requests_dropped_total")
	prompt := familySum(e, "kvload_prompt_tokens_total")
	trace := familySum(e, "kvload_trace_prompt_tokens_total")
	cached := familySum(e, "kvload_cached_prompt_tokens_total")
	completion := familySum(e, "kvload_completion_tokens_total")
	// llama.cpp counts the prompt tokens it evaluated, the cached ones
	// apart; it keeps no request counter.
	sEvaluated := familySum(s, "llamacpp:prompt_tokens_total")
	sCached := familySum(s, "llamacpp:prompt_tokens_cached_total")
	sPredicted := familySum(s, "llamacpp:tokens_predicted_total")
	t.Logf("exporter: %.0f ok, %.0f failed, %.0f dropped; prompt %.0f (trace %.0f), cached %.0f, completion %.0f",
		ok, failed, dropped, prompt, trace, cached, completion)
	t.Logf("llama-server: evaluated %.0f + cached %.0f prompt tokens, predicted %.0f", sEvaluated, sCached, sPredicted)
	// A real llama-server now and then drops a connection before it reads
	// the request (seen once in 201: EOF, no response byte, the server's
	// counters untouched, which the equalities below prove). Such a
	// connection error is the engine's, and at most 1 % of rows may end
	// so; any other failure is the exporter's.
	connErrs := sumLabel(e, "kvload_requests_total", "outcome", "connection_error")
	if ok == 0 || failed != connErrs || connErrs > 0.01*(ok+failed) {
		rc.fatalf(t, "%.0f requests succeeded, %.0f failed (%.0f connection errors): want every one to succeed but for at most 1 %% connection errors",
			ok, failed, connErrs)
	}
	for _, c := range []struct {
		what             string
		exporter, server float64
	}{
		{"prompt tokens", prompt, sEvaluated + sCached},
		{"cached prompt tokens", cached, sCached},
		{"completion tokens", completion, sPredicted},
	} {
		if c.exporter != c.server {
			rc.errorf(t, "%s: exporter %.0f, llama-server %.0f", c.what, c.exporter, c.server)
		}
	}
	// On /v1/completions the server's prompt is the trace's tokens and
	// its BOS.
	if r := prompt / trace; !(r >= 0.99 && r <= 1.01) {
		rc.errorf(t, "prompt / trace tokens %.4f, want within [0.99, 1.01]", r)
	}

	// The exporter's words are one token each in the Llama-3 vocabulary:
	// the server's own tokenizer must count a built prompt as built.
	if r := sumLabel(e, "kvload_target_tokenize_ratio", "target", "llama"); r != 1 {
		rc.errorf(t, "kvload_target_tokenize_ratio %v, want 1 (the server's /tokenize counting a built prompt)", r)
	}

	rCached := familySum(e, "kvload_cache_reported_cached_prompt_tokens_total")
	rPrompt := familySum(e, "kvload_cache_reported_prompt_tokens_total")
	rTheo := familySum(e, "kvload_cache_reported_theoretical_cached_prompt_tokens_total")
	rTrace := familySum(e, "kvload_cache_reported_trace_prompt_tokens_total")
	observed, theoretical := rCached/rPrompt, rTheo/rTrace
	eff := observed / theoretical
	t.Logf("observed hit rate %.4f, theoretical %.4f, efficiency %.4f", observed, theoretical, eff)
	// A healthy engine with nothing set about its cache: the efficiency
	// in the healthy band. The BOS llama.cpp reports as cached must
	// not lift it above what the cache really served. A dropped row would
	// make the comparison moot (the fleet model counts every row of the
	// schedule), so there must be none.
	if dropped != 0 {
		rc.errorf(t, "%.0f rows dropped: the engine could not keep up, so the efficiency says nothing", dropped)
	}
	if math.IsNaN(eff) || eff < 0.93 || eff > 1.05 {
		rc.errorf(t, "efficiency %.4f, want within [0.93, 1.05]", eff)
	}
}

// TestRealEngineChatPromptLength: on chat, the server's Llama-3 template
// wraps every prompt in a dozen tokens of its own, a tenth of a 100-token
// prompt. The exporter measures it before the first request (llama.cpp's
// /apply-template, then /tokenize as the chat route tokenizes) and leaves
// it room: over 30 short prompts (100 to 390 tokens, sent one at a time)
// the server counts the trace's tokens within 1 %.
func TestRealEngineChatPromptLength(t *testing.T) {
	t.Parallel()             // see llamaParallel
	rc := newFailureRecap(t) // before the processes: see failureRecap
	root := repoRoot(t)
	server := engineBinary(t, "LLAMA_SERVER_BIN")
	modelFile := engineBinary(t, "TINY_MODEL")
	kvload := binary(t, "KVLOAD_EXPORTER_BIN", root, "./cmd/kvload-exporter", t.TempDir())
	dir := t.TempDir()
	var trace strings.Builder
	const rows = 30
	for i := range rows {
		fmt.Fprintf(&trace, `{"timestamp": %d, "input_length": %d, "output_length": 4}`+"\n", 300*i, 100+10*i)
	}
	writeFile(t, filepath.Join(dir, "short.jsonl"), trace.String())

	serverAddr := freeAddr(t)
	startLlamaServer(t, dir, "llama-server", server, modelFile, serverAddr)
	expAddr := replayOnce(t, dir, kvload, fmt.Sprintf(`targets:
  - name: llama
    url: http://%s
    model: tiny
    dialect: llamacpp
workloads:
  - name: short
    trace: short.jsonl
    targets: [llama]
    loop: once
`, serverAddr), 10*time.Minute)

	e := scrapeFamilies(t, "http://"+expAddr+"/metrics")
	ok := sumLabel(e, "kvload_requests_total", "outcome", "success")
	prompt := familySum(e, "kvload_prompt_tokens_total")
	trc := familySum(e, "kvload_trace_prompt_tokens_total")
	t.Logf("chat: %.0f requests, the server counted %.0f prompt tokens for %.0f in the trace (%.4f)", ok, prompt, trc, prompt/trc)
	if ok != rows {
		rc.fatalf(t, "%.0f of %d requests succeeded", ok, rows)
	}
	if r := prompt / trc; r < 0.99 || r > 1.01 {
		rc.errorf(t, "chat prompt / trace tokens %.4f, want within [0.99, 1.01]", r)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "exporter.log"))
	if !strings.Contains(string(b), "chat template overhead read from the target's tokenize endpoint") {
		rc.errorf(t, "the exporter did not log the template it measured:\n%s", tail(filepath.Join(dir, "exporter.log"), 20))
	}
}

// TestRealEngineLlamaCppExample runs examples/llamacpp.yml as it is, but
// for the server's address and model name, against llama-server started
// with the context and slots its comment gives, and --metrics: every request must
// succeed and report its cached tokens, the server's tokenizer must count
// the exporter's prompts as built, and the exporter's counters must equal
// the server's.
func TestRealEngineLlamaCppExample(t *testing.T) {
	t.Parallel()             // see llamaParallel
	rc := newFailureRecap(t) // before the processes: see failureRecap
	root := repoRoot(t)
	server := engineBinary(t, "LLAMA_SERVER_BIN")
	modelFile := engineBinary(t, "TINY_MODEL")
	kvload := binary(t, "KVLOAD_EXPORTER_BIN", root, "./cmd/kvload-exporter", t.TempDir())
	dir := t.TempDir()
	example, err := os.ReadFile(filepath.Join(root, "examples", "llamacpp.yml"))
	if err != nil {
		t.Fatal(err)
	}
	const exampleURL, exampleModel = "http://localhost:8080", "Qwen/Qwen3-0.6B"
	if !strings.Contains(string(example), "url: "+exampleURL) || !strings.Contains(string(example), "model: "+exampleModel) {
		rc.fatalf(t, "examples/llamacpp.yml no longer has url: %s and model: %s; update this test", exampleURL, exampleModel)
	}
	// The trace path is relative to the configuration file.
	if err := os.MkdirAll(filepath.Join(dir, "traces"), 0o755); err != nil {
		t.Fatal(err)
	}
	trace, err := os.ReadFile(filepath.Join(root, "examples", "traces", "conversation_head1000.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "traces", "conversation_head1000.jsonl"), string(trace))

	addr := freeAddr(t)
	flags := regexp.MustCompile(`-c (\d+) -np (\d+)`).FindStringSubmatch(string(example))
	if flags == nil {
		t.Fatal("examples/llamacpp.yml's comment no longer gives llama-server's -c and -np; update this test")
	}
	startLlamaServer(t, dir, "llama-server", server, modelFile, addr, "-c", flags[1], "-np", flags[2], "--alias", "tiny")
	cfg := strings.NewReplacer("url: "+exampleURL, "url: http://"+addr, "model: "+exampleModel, "model: tiny").Replace(string(example))
	expAddr, exp := startExporter(t, dir, kvload, cfg)

	// The first requests of the example's replay: the tiny model on CPU
	// serves its 256-token answers one at a time, a few per minute.
	const want = 10
	deadline := time.Now().Add(5 * time.Minute) // a hang guard only
	var e map[string]*dto.MetricFamily
	for {
		e = scrapeFamilies(t, "http://"+expAddr+"/metrics")
		if familySum(e, "kvload_requests_total") >= want {
			break
		}
		if time.Now().After(deadline) {
			rc.fatalf(t, "fewer than %d requests finished in 5 minutes:\n%s", want, tail(filepath.Join(dir, "exporter.log"), 20))
		}
		select {
		case <-exp.done:
			rc.fatalf(t, "exporter exited: %v", exp.err)
		case <-time.After(time.Second): // polling interval
		}
	}
	ok := sumLabel(e, "kvload_requests_total", "outcome", "success")
	total := familySum(e, "kvload_requests_total")
	unreported := familySum(e, "kvload_cache_unreported_requests_total")
	t.Logf("%.0f of %.0f requests succeeded, %.0f without a cached count; tokenize ratio %v; observed %.4f, theoretical %.4f",
		ok, total, unreported, sumLabel(e, "kvload_target_tokenize_ratio", "target", "llamacpp"),
		familySum(e, "kvload_cache_reported_cached_prompt_tokens_total")/familySum(e, "kvload_cache_reported_prompt_tokens_total"),
		familySum(e, "kvload_cache_reported_theoretical_cached_prompt_tokens_total")/familySum(e, "kvload_cache_reported_trace_prompt_tokens_total"))
	if ok != total || unreported != 0 {
		rc.errorf(t, "%.0f of %.0f requests succeeded, %.0f without a cached-token count: want all, all reporting", ok, total, unreported)
	}
	if r := sumLabel(e, "kvload_target_tokenize_ratio", "target", "llamacpp"); r != 1 {
		rc.errorf(t, "kvload_target_tokenize_ratio %v, want 1", r)
	}
}

// The cache alerts on real engines. The engines serve the trace at its own
// pace, and the recording is time-compressed as in the alert scenarios
// (alertsim.go, rulesim.go): scrape i is stored at rule time
// i × F, the rule files are evaluated over it and promtool cross-checks
// the alerts' states. The alerts read ratios of rates, which F does not
// change; the one absolute rate, the contrast's 0.01 requests/s per cache
// class, becomes 0.01 × F real requests/s. F is lower than the emulator's
// 30: a real engine on 2 cores serves a few requests per second.
const (
	// llamaCompression is F for llama-server, whose alert reads the
	// efficiency, a ratio of token rates (a 5-minute window is 20 real
	// seconds: one closed-loop user finished 311 to 572 requests in the
	// 220 s of TestRealEngineCacheRegression, about 30 to 50 a window).
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
	// on settled samples (baselineAt: 10 evaluations of a pair running
	// 20 minutes, older than 10 minutes), as in the emulator's scenarios.
	engineChangeAt = alertChangeAt
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
//
// One closed-loop user sends the rows, as in TestRealEngineLlamaServer:
// on the trace's pace (8 rows a second at speedup 2) the engine without
// its cache fell far behind, its queued requests finished in clumps, and
// on a busy machine 20 real seconds (a 5-minute window) passed without
// one finishing, so the efficiency went unread and the page came late or
// not at all; the machine decided. A user finishes a request about every
// second without the cache, fewer on a slower machine but never none.
// While the engine restarts, the user's pause after each failure keeps it
// to a few refused connections.
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
    synthesis: {max_isl: %d, max_osl: 8}
    schedule: {users: 1}
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
			res.readsZeroAfter(t, res.changeAt+2*rateWindow)
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

	answers := ollamaCountsExactly(t, &res.failureRecap, tap, expAddr)
	healthy, defeated := sum(answers, time.Time{}, restarted), sum(answers, restarted, time.Now())
	t.Logf("Ollama's own hit rate: %.3f over %d answers before the change, %.3f over %d after it",
		healthy.hitRate(), healthy.answers, defeated.hitRate(), defeated.answers)
	res.neverActive(t, contrastLost)
	// Ollama's hit rate after the change over its healthy one, beside the
	// alert's own threshold on the efficiency over its baseline.
	kept := defeated.hitRate() / healthy.hitRate()
	switch {
	case healthy.answers == 0 || healthy.cached == 0:
		res.errorf(t, "the healthy Ollama reported %d cached tokens in %d answers: its cache served nothing", healthy.cached, healthy.answers)
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
			res.errorf(t, "%s firing at %v, before the change at %v", hitRegression, at, res.changeAt)
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
		res.errorf(t, "efficiency median %.3f on the healthy Ollama, want within [0.93, 1.05]", before)
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
func ollamaCountsExactly(t *testing.T, rc *failureRecap, tap *usageTap, expAddr string) []tapAnswer {
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
		rc.errorf(t, "Ollama answered %d requests, %d cached tokens, %d without a count: want answers, cached tokens, and a count in every one",
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
			rc.errorf(t, "%s: exporter %.0f, Ollama %.0f", c.what, c.exporter, c.ollama)
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
	res.recapFailures(t) // first registered: runs after the processes' cleanups
	var err error
	if res.effThreshold, res.hitHold, err = alertThreshold(files, hitRegression, efficiencyRule); err != nil {
		t.Fatal(err)
	}
	if res.contrastThreshold, res.contrastHold, err = alertThreshold(files, contrastLost, contrastRule); err != nil {
		t.Fatal(err)
	}
	return res
}
