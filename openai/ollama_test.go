package openai

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// TestClientOllamaAnswers: answers recorded from real Ollama servers
// (scripts/engines/build-ollama.sh, the tiny model, the same prompt sent
// twice). v0.34.4 reports the cached tokens in usage, 0 included; v0.17.4
// reports none, on chat or on completions, whose every chunk carries a
// usage of zeros before the last one.
func TestClientOllamaAnswers(t *testing.T) {
	tests := []struct {
		fixture string
		api     API
		want    want
	}{
		{"ollama_0.34.4_chat_uncached.sse", APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true, cached: 0, cachedOK: true}},
		{"ollama_0.34.4_chat.sse", APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true, cached: 117, cachedOK: true}},
		{"ollama_0.34.4_completions.sse", APICompletions, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true, cached: 117, cachedOK: true}},
		{"ollama_0.17.4_chat.sse", APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true}},
		{"ollama_0.17.4_completions.sse", APICompletions, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true}},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			srv := newServer(t, replayHandler(t, tt.fixture))
			c := mustClient(t, TargetConfig{URL: srv.URL, Model: "tiny", API: tt.api, Dialect: engine.DialectOllama, RequestTimeout: time.Minute})
			var res Response
			c.Do(context.Background(), Request{Prompt: "hi", MaxTokens: 4}, &res)
			checkResult(t, &res, tt.want)
		})
	}
}

// TestClientOllamaUpgrade: an answer without a count stays unknown even
// after the target has reported counts (a fleet being upgraded answers
// both ways); it is never read as 0.
func TestClientOllamaUpgrade(t *testing.T) {
	fixtures := []string{"ollama_0.17.4_chat.sse", "ollama_0.34.4_chat.sse", "ollama_0.17.4_chat.sse", "ollama_0.34.4_chat_uncached.sse"}
	want := []string{"?", "117", "?", "0"}
	handlers := map[string]http.HandlerFunc{}
	for _, f := range fixtures {
		handlers[f] = replayHandler(t, f)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/{fixture}/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		handlers[r.PathValue("fixture")](w, r)
	})
	srv := newServer(t, mux)
	c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectOllama})
	for i, f := range fixtures {
		c.endpoint = srv.URL + "/" + f + "/v1/chat/completions"
		var res Response
		c.Do(context.Background(), Request{Prompt: "x"}, &res)
		got := "?"
		if res.CachedKnown {
			got = fmt.Sprint(res.CachedTokens)
		}
		if res.Outcome != OutcomeSuccess || got != want[i] {
			t.Errorf("answer %d (%s): %s, cached %s, want success, cached %s", i, f, res.Outcome, got, want[i])
		}
	}
}
