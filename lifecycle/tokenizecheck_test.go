package lifecycle

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestTokenizeCheck: when a target is configured, its tokenize endpoint
// counts a prompt built as every prompt is; the ratio is exported and
// logged, with a warning beyond 2 % or, with token-id prompts, when the
// configured tokenizer's ids are not the server's. The emulator's
// tokenizer (o200k_base) is a real one the check's code does not share.
func TestTokenizeCheck(t *testing.T) {
	t.Parallel()
	// A server whose tokenizer splits every word in two, and one without
	// a tokenize endpoint.
	doubling := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
		}
		if (r.URL.Path != "/tokenize" && r.URL.Path != "/v1/tokenize") || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.NotFound(w, r)
			return
		}
		n := 2 * len(strings.Fields(req.Prompt))
		fmt.Fprintf(w, `{"count": %d, "tokens": [%s]}`, n, strings.TrimSuffix(strings.Repeat("7,", n), ","))
	}))
	t.Cleanup(doubling.Close)
	// A server that answers 2M ids for the 512-token prompt: once read
	// whole, 250 MB a target, and exported as a ratio of 3906.
	absurdAnswer := []byte(`{"tokens": [` + strings.TrimSuffix(strings.Repeat("7,", 2_000_000), ",") + `]}`)
	absurd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(absurdAnswer)
	}))
	t.Cleanup(absurd.Close)

	const (
		checked    = "prompt length checked against the target's tokenizer"
		lengthOff  = "counts the exporter's prompts more than 2 % off"
		idsOff     = "does not match the target's"
		noAnswer   = "tokenize endpoint did not answer"
		noEndpoint = "the engine has no tokenize endpoint"
		tooMany    = "level=warn target=tgt msg=\"prompt length not checked: the target's tokenize endpoint counts more tokens than the prompt has bytes"
		// The chat template, measured or not.
		tplRead = "chat template overhead read from the target's tokenize endpoint; chat prompts leave it room\" tokens=22"
		tplNot  = "chat template not measured through the tokenize endpoint"
	)
	// emu is an emulated target, changed by change.
	emu := func(change func(*config.Target)) config.Target {
		t := config.Target{Name: "tgt", Model: "m", Emulate: &config.Emulate{InterToken: time.Millisecond}}
		if change != nil {
			change(&t)
		}
		return t
	}
	// doublingAs is the doubling server as a target, changed by change (its
	// dialect).
	doublingAs := func(change func(*config.Target)) config.Target {
		t := config.Target{Name: "tgt", Model: "m", URL: doubling.URL}
		change(&t)
		return t
	}
	tests := []struct {
		name   string
		target config.Target
		ratio  float64 // 0: no series
		log    string
		quiet  []string // must not be logged
		// On chat, the template line logged ("": neither).
		template string
	}{
		// The emulator's template (chat is the default api) is 22 tokens.
		{"emulator", emu(nil), 1, checked, []string{lengthOff, idsOff, tplNot}, tplRead},
		// A BOS is the engine's: the check asks for the text alone.
		// and the BOS is the template's on chat: 23.
		{"emulator with a BOS", emu(func(t *config.Target) { t.Emulate.BOS = true }), 1, checked, []string{lengthOff, tplNot}, strings.Replace(tplRead, "=22", "=23", 1)},
		{"emulator on completions", emu(func(t *config.Target) { t.API = "completions" }), 1, checked, []string{tplRead, tplNot}, ""},
		{"token ids, the server's tokenizer", emu(func(t *config.Target) {
			t.PromptFormat, t.API, t.Tokenizer = "token_ids", "completions", "o200k_base"
		}), 1, checked, []string{idsOff, tplRead, tplNot}, ""},
		{"token ids, another tokenizer", emu(func(t *config.Target) {
			t.PromptFormat, t.API, t.Tokenizer = "token_ids", "completions", "cl100k_base"
		}), 1, idsOff, []string{checked}, ""},
		// Its chat form (no prompt) counts nothing: not a template.
		{"twice as many tokens", doublingAs(func(t *config.Target) { t.Dialect = "vllm" }), 2, lengthOff, []string{checked, tplRead}, tplNot},
		{"llama.cpp route missing", doublingAs(func(t *config.Target) { t.Dialect = "llamacpp" }), 0, noAnswer, []string{checked, lengthOff, tplRead, tplNot}, ""},
		{"no endpoint", doublingAs(func(t *config.Target) { t.Dialect = "openai" }), 0, "", []string{checked, lengthOff, noAnswer, tplRead, tplNot}, ""},
		{"absurd count", config.Target{Name: "tgt", Model: "m", URL: absurd.URL, Dialect: "vllm"}, 0, tooMany, []string{checked, lengthOff, noAnswer}, ""},
		// SGLang's tokenize takes a prompt only: its length is checked,
		// and its template is not asked for (then learnt from answers).
		{"sglang", doublingAs(func(t *config.Target) { t.Dialect = "sglang" }), 2, lengthOff, []string{checked, tplRead, tplNot}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "kvload.yml")
			w := daemontest.Workload("w", fixture(t, "tiny.jsonl"), "tgt")
			w.Loop = "" // the default
			daemontest.WriteConfig(t, path, config.Config{Targets: []config.Target{tt.target}, Workloads: []config.Workload{w}})
			var logs testutil.Buffer
			// Start returns once targets are settled: the check is done.
			s, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) })
			if err != nil {
				t.Fatal(err)
			}
			got, n := testutil.Gather(t, s.reg).Value("kvload_target_tokenize_ratio", "target", "tgt")
			if (n > 0) != (tt.ratio > 0) || got != tt.ratio {
				t.Errorf("kvload_target_tokenize_ratio %v (%d series), want %v", got, n, tt.ratio)
			}
			if tt.template != "" && !strings.Contains(logs.String(), tt.template) {
				t.Errorf("%q not logged:\n%s", tt.template, logs.String())
			}
			if tt.log != "" && !strings.Contains(logs.String(), tt.log) {
				t.Errorf("%q not logged:\n%s", tt.log, logs.String())
			}
			for _, q := range tt.quiet {
				if strings.Contains(logs.String(), q) {
					t.Errorf("%q logged:\n%s", q, logs.String())
				}
			}
		})
	}
}
