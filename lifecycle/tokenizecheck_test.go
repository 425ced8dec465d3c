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
		if r.URL.Path != "/tokenize" || json.NewDecoder(r.Body).Decode(&req) != nil {
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
	)
	tests := []struct {
		name   string
		target string
		ratio  float64 // 0: no series
		log    string
		quiet  []string // must not be logged
	}{
		{"emulator", "emulate: {inter_token: 1ms}", 1, checked, []string{lengthOff, idsOff}},
		// A BOS is the engine's: the check asks for the text alone.
		{"emulator with a BOS", "emulate: {inter_token: 1ms, bos: true}", 1, checked, []string{lengthOff}},
		{"token ids, the server's tokenizer", "emulate: {inter_token: 1ms}\n    prompt_format: token_ids\n    api: completions\n    tokenizer: o200k_base", 1, checked, []string{idsOff}},
		{"token ids, another tokenizer", "emulate: {inter_token: 1ms}\n    prompt_format: token_ids\n    api: completions\n    tokenizer: cl100k_base", 1, idsOff, []string{checked}},
		{"twice as many tokens", "url: " + doubling.URL + "\n    dialect: vllm", 2, lengthOff, []string{checked}},
		{"llama.cpp route missing", "url: " + doubling.URL + "\n    dialect: llamacpp", 0, noAnswer, []string{checked, lengthOff}},
		{"no endpoint", "url: " + doubling.URL + "\n    dialect: openai", 0, "", []string{checked, lengthOff, noAnswer}},
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
