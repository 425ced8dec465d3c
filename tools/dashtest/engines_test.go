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
// exporter's counters against the server's own /metrics.
func TestRealEngineLlamaServer(t *testing.T) {
	t.Parallel() // see llamaParallel
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
    synthesis: {speedup_ratio: 2, max_isl: %d, max_osl: 8}
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
		t.Fatalf("%.0f requests succeeded, %.0f failed (%.0f connection errors): want every one to succeed but for at most 1 %% connection errors",
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
			t.Errorf("%s: exporter %.0f, llama-server %.0f", c.what, c.exporter, c.server)
		}
	}
	// On /v1/completions the server's prompt is the trace's tokens and
	// its BOS.
	if r := prompt / trace; !(r >= 0.99 && r <= 1.01) {
		t.Errorf("prompt / trace tokens %.4f, want within [0.99, 1.01]", r)
	}

	// The exporter's words are one token each in the Llama-3 vocabulary:
	// the server's own tokenizer must count a built prompt as built.
	if r := sumLabel(e, "kvload_target_tokenize_ratio", "target", "llama"); r != 1 {
		t.Errorf("kvload_target_tokenize_ratio %v, want 1 (the server's /tokenize counting a built prompt)", r)
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
		t.Errorf("%.0f rows dropped: the engine could not keep up, so the efficiency says nothing", dropped)
	}
	if math.IsNaN(eff) || eff < 0.93 || eff > 1.05 {
		t.Errorf("efficiency %.4f, want within [0.93, 1.05]", eff)
	}
}

// TestRealEngineChatPromptLength: on chat, the server's Llama-3 template
// wraps every prompt in a dozen tokens of its own, a tenth of a 100-token
// prompt. The exporter measures it before the first request (llama.cpp's
// /apply-template, then /tokenize as the chat route tokenizes) and leaves
// it room: over 30 short prompts (100 to 390 tokens, sent one at a time)
// the server counts the trace's tokens within 1 %.
func TestRealEngineChatPromptLength(t *testing.T) {
	t.Parallel() // see llamaParallel
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
		t.Fatalf("%.0f of %d requests succeeded", ok, rows)
	}
	if r := prompt / trc; r < 0.99 || r > 1.01 {
		t.Errorf("chat prompt / trace tokens %.4f, want within [0.99, 1.01]", r)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "exporter.log"))
	if !strings.Contains(string(b), "chat template overhead read from the target's tokenize endpoint") {
		t.Errorf("the exporter did not log the template it measured:\n%s", tail(filepath.Join(dir, "exporter.log"), 20))
	}
}

// TestRealEngineLlamaCppExample runs examples/llamacpp.yml as it is, but
// for the server's address and model name, against llama-server started
// with the context and slots its comment gives, and --metrics: every request must
// succeed and report its cached tokens, the server's tokenizer must count
// the exporter's prompts as built, and the exporter's counters must equal
// the server's.
func TestRealEngineLlamaCppExample(t *testing.T) {
	t.Parallel() // see llamaParallel
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
		t.Fatalf("examples/llamacpp.yml no longer has url: %s and model: %s; update this test", exampleURL, exampleModel)
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
			t.Fatalf("fewer than %d requests finished in 5 minutes:\n%s", want, tail(filepath.Join(dir, "exporter.log"), 20))
		}
		select {
		case <-exp.done:
			t.Fatalf("exporter exited: %v", exp.err)
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
		t.Errorf("%.0f of %.0f requests succeeded, %.0f without a cached-token count: want all, all reporting", ok, total, unreported)
	}
	if r := sumLabel(e, "kvload_target_tokenize_ratio", "target", "llamacpp"); r != 1 {
		t.Errorf("kvload_target_tokenize_ratio %v, want 1", r)
	}
}
