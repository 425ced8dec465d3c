package lifecycle

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// TestTemplateOverhead: the chat template's size is learnt from the
// shortest answered prompt; failures, unknown usage, rows the exporter did
// not build and absurd differences teach nothing.
func TestTemplateOverhead(t *testing.T) {
	ok := func(built, prompt int) *replay.Result {
		return &replay.Result{Outcome: replay.OutcomeSuccess, PromptKnown: true, PromptTokens: prompt, PromptBuiltTokens: built}
	}
	failed := ok(100, 120)
	failed.Outcome = replay.OutcomeHTTPError
	unknown := ok(100, 0)
	unknown.PromptKnown = false
	for _, tt := range []struct {
		name    string
		results []*replay.Result
		want    int
	}{
		{"nothing yet", nil, 0},
		{"one answer", []*replay.Result{ok(1000, 1012)}, 12},
		{"the shortest prompt wins", []*replay.Result{ok(1000, 1020), ok(100, 112), ok(5000, 5090)}, 12},
		{"a later shorter one replaces it", []*replay.Result{ok(1000, 1020), ok(50, 62)}, 12},
		{"equal lengths: the latest", []*replay.Result{ok(100, 113), ok(100, 112)}, 12},
		{"failed", []*replay.Result{failed}, 0},
		{"no usage", []*replay.Result{unknown}, 0},
		{"not built by the exporter", []*replay.Result{ok(0, 500)}, 0},
		{"server counted fewer", []*replay.Result{ok(100, 90)}, 0},
		{"absurd", []*replay.Result{ok(100, 100+maxTemplateTokens+1)}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var o templateOverhead
			for _, r := range tt.results {
				o.observe(r)
			}
			if got := o.get(); got != tt.want {
				t.Errorf("overhead %d, want %d", got, tt.want)
			}
		})
	}
}

// TestChatTemplateLearnt: against a chat server whose template adds 7
// tokens, the first answer teaches the exporter the template's size, and
// every later prompt is counted by the server at exactly the trace's
// input_length.
func TestChatTemplateLearnt(t *testing.T) {
	t.Parallel()
	const template = 7
	var mu sync.Mutex
	var counted []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) != 1 {
			http.Error(w, "want one message", http.StatusBadRequest)
			return
		}
		n := len(strings.Fields(req.Messages[0].Content)) + template // a word is a token
		mu.Lock()
		counted = append(counted, n)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":1,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", n, n+1)
	}))
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	var trace strings.Builder
	const rows, isl = 6, 40
	for i := range rows {
		// 100 ms apart, so that each answer is back before the next row.
		fmt.Fprintf(&trace, `{"timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": [%d, %d, %d]}`+"\n", 100*i, isl, 3*i, 3*i+1, 3*i+2)
	}
	writeConfig(t, filepath.Join(dir, "trace.jsonl"), trace.String())
	path := filepath.Join(dir, "kvload.yml")
	writeConfig(t, path, fmt.Sprintf(`targets:
  - {name: t, url: %s, model: m, dialect: vllm, api: chat}
workloads:
  - {name: w, trace: trace.jsonl, targets: [t], block_size: 16, loop: once}
`, srv.URL))
	var logs logBuffer
	if _, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) }); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every row answered", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(counted) == rows, fmt.Sprint(counted)
	})
	mu.Lock()
	defer mu.Unlock()
	if counted[0] != isl+template {
		t.Errorf("the first prompt counted %d tokens, want %d: nothing is known before the first answer", counted[0], isl+template)
	}
	for i, n := range counted[1:] {
		if n != isl {
			t.Errorf("prompt %d counted %d tokens, want the trace's %d (all: %v)", i+2, n, isl, counted)
		}
	}
	if !strings.Contains(logs.String(), "chat template overhead learnt") || !strings.Contains(logs.String(), fmt.Sprintf("tokens=%d", template)) {
		t.Errorf("the log does not say the template was learnt:\n%s", logs.String())
	}
}
