package engine

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/emulate"
)

// TestTokenizePrompt: the ids vLLM's routes make of a prompt, read from
// the emulated engine (an independent implementation of those routes),
// number what the engine counts for the same prompt: the BOS of
// completions and the chat template included.
func TestTokenizePrompt(t *testing.T) {
	eng, err := emulate.New(emulate.Config{BOS: true})
	if err != nil {
		t.Fatal(err)
	}
	base, wait, err := eng.Start(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wait() })
	const text = "the prefix cache keys blocks by these ids"
	for _, chat := range []bool{false, true} {
		var ids []int
		n, err := For(DialectVLLM).TokenizePrompt(t.Context(), http.DefaultClient, base, "", text, chat, func(id int) { ids = append(ids, id) })
		if err != nil {
			t.Fatal(err)
		}
		route, body := "/v1/completions", `{"prompt": "`+text+`", "max_tokens": 1}`
		if chat {
			route, body = "/v1/chat/completions", `{"messages": [{"role": "user", "content": "`+text+`"}], "max_tokens": 1}`
		}
		resp, err := http.Post(base+route, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var answer struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if n != len(ids) || n != answer.Usage.PromptTokens {
			t.Errorf("chat %v: %d ids (%d handed), the engine counts %d", chat, n, len(ids), answer.Usage.PromptTokens)
		}
	}
	for _, d := range []Dialect{DialectSGLang, DialectOpenAI} {
		if For(d).CanTokenizePrompts() {
			t.Errorf("%s: CanTokenizePrompts, want false", d)
		}
		if _, err := For(d).TokenizePrompt(t.Context(), http.DefaultClient, base, "", text, false, nil); !errors.Is(err, ErrNoEndpoint) {
			t.Errorf("%s: %v, want ErrNoEndpoint", d, err)
		}
	}
}
