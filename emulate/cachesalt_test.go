package emulate

import (
	"net/http"
	"strings"
	"testing"
)

// TestCacheSaltPersonalities: each personality treats cache_salt as its
// engine does (docs/engines.md, "Cache salt"). Where the salt is kept, the
// same prompt under another salt hits nothing and under the same salt hits
// again; where it is ignored, another salt hits as the same one does;
// TensorRT-LLM's completions route refuses the field.
func TestCacheSaltPersonalities(t *testing.T) {
	tests := []struct {
		p                 Personality
		chat, completions saltUse
	}{
		{PersonalityVLLM, saltKept, saltKept},
		{PersonalitySGLang, saltKept, saltKept},
		{PersonalityTRTLLM, saltKept, saltRefused},
		{PersonalityLlamaCpp, saltIgnored, saltIgnored},
	}
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 30)
	for _, tt := range tests {
		for _, chat := range []bool{true, false} {
			route, want := "completions", tt.completions
			if chat {
				route, want = "chat", tt.chat
			}
			t.Run(tt.p.String()+" "+route, func(t *testing.T) {
				if got := tt.p.cacheSalt(chat); got != want {
					t.Fatalf("cacheSalt(%v) = %v, want %v", chat, got, want)
				}
				_, srv := newTestServer(t, Config{Engine: tt.p})
				send := func(salt string, status int) int {
					t.Helper()
					path, body := "/v1/completions", map[string]any{"prompt": text, "max_tokens": 2, "cache_salt": salt}
					if chat {
						path, body = "/v1/chat/completions", map[string]any{
							"messages": []map[string]string{{"role": "user", "content": text}}, "max_tokens": 2, "cache_salt": salt}
					}
					var c wireChunk
					postDecode(t, srv.URL+path, body, status, &c)
					if status != http.StatusOK {
						return 0
					}
					return c.Usage.cached(t)
				}
				if want == saltRefused {
					send("a", http.StatusBadRequest)
					return
				}
				send("a", http.StatusOK)
				same, other := send("a", http.StatusOK), send("b", http.StatusOK)
				t.Logf("cached: %d under the same salt, %d under another", same, other)
				if same == 0 {
					t.Fatalf("the same prompt under the same salt hit nothing")
				}
				if kept := other == 0; kept != (want == saltKept) {
					t.Errorf("another salt hit %d tokens (the same salt %d): want the salts kept apart %v", other, same, want == saltKept)
				}
			})
		}
	}
}
