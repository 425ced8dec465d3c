package openai

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

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
