package lifecycle

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-kit/log"
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

	const (
		checked    = "prompt length checked against the target's tokenizer"
		lengthOff  = "counts the exporter's prompts more than 2 % off"
		idsOff     = "does not match the target's"
		noAnswer   = "tokenize endpoint did not answer"
		noEndpoint = "the engine has no tokenize endpoint"
		// The chat template, measured or not.
		tplRead = "chat template overhead read from the target's tokenize endpoint; chat prompts leave it room\" tokens=22"
		tplNot  = "chat template not measured through the tokenize endpoint"
	)
	tests := []struct {
		name   string
		target string
		ratio  float64 // 0: no series
		log    string
		quiet  []string // must not be logged
		// On chat, the template line logged ("": neither).
		template string
	}{
		// The emulator's template (chat is the default api) is 22 tokens.
		{"emulator", "emulate: {inter_token: 1ms}", 1, checked, []string{lengthOff, idsOff, tplNot}, tplRead},
		// A BOS is the engine's: the check asks for the text alone.
		// and the BOS is the template's on chat: 23.
		{"emulator with a BOS", "emulate: {inter_token: 1ms, bos: true}", 1, checked, []string{lengthOff, tplNot}, strings.Replace(tplRead, "=22", "=23", 1)},
		{"emulator on completions", "emulate: {inter_token: 1ms}\n    api: completions", 1, checked, []string{tplRead, tplNot}, ""},
		{"token ids, the server's tokenizer", "emulate: {inter_token: 1ms}\n    prompt_format: token_ids\n    api: completions\n    tokenizer: o200k_base", 1, checked, []string{idsOff, tplRead, tplNot}, ""},
		{"token ids, another tokenizer", "emulate: {inter_token: 1ms}\n    prompt_format: token_ids\n    api: completions\n    tokenizer: cl100k_base", 1, idsOff, []string{checked}, ""},
		// Its chat form (no prompt) counts nothing: not a template.
		{"twice as many tokens", "url: " + doubling.URL + "\n    dialect: vllm", 2, lengthOff, []string{checked, tplRead}, tplNot},
		{"llama.cpp route missing", "url: " + doubling.URL + "\n    dialect: llamacpp", 0, noAnswer, []string{checked, lengthOff, tplRead, tplNot}, ""},
		{"no endpoint", "url: " + doubling.URL + "\n    dialect: openai", 0, "", []string{checked, lengthOff, noAnswer, tplRead, tplNot}, ""},
		// SGLang's tokenize takes a prompt only: its length is checked,
		// and its template is not asked for (then learnt from answers).
		{"sglang", "url: " + doubling.URL + "\n    dialect: sglang", 2, lengthOff, []string{checked, tplRead, tplNot}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "kvload.yml")
			writeConfig(t, path, fmt.Sprintf(`targets:
  - name: tgt
    model: m
    %s
workloads:
  - name: w
    trace: %s
    targets: [tgt]
    block_size: 16
`, tt.target, fixture(t, "tiny.jsonl")))
			var logs logBuffer
			// Start returns once targets are settled: the check is done.
			s, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) })
			if err != nil {
				t.Fatal(err)
			}
			got, n := gatherFamilies(t, s.reg).value("kvload_target_tokenize_ratio", "target", "tgt")
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
