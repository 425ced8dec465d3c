package engine

import (
	"slices"
	"testing"
)

// TestCacheSaltFields pins which route of which engine takes a cache salt
// (docs/engines.md, "Cache salt"): a salt sent where the engine ignores it
// isolates nothing, and one sent where it refuses unknown fields fails
// every request.
func TestCacheSaltFields(t *testing.T) {
	tests := []struct {
		d                 Dialect
		chat, completions string
	}{
		{DialectVLLM, "cache_salt", "cache_salt"},
		{DialectSGLang, "cache_salt", "cache_salt"},
		{DialectTRTLLM, "cache_salt", ""},
		{DialectDynamo, "cache_salt", "cache_salt"},
		{DialectLlamaCpp, "", ""},
		{DialectOllama, "", ""},
		{DialectOpenAI, "", ""},
	}
	if len(tests) != len(Dialects) {
		t.Fatalf("%d dialects pinned, %d exist", len(tests), len(Dialects))
	}
	for _, tt := range tests {
		s := For(tt.d)
		if got := s.CacheSaltField(true); got != tt.chat {
			t.Errorf("%s on chat: salt field %q, want %q", tt.d, got, tt.chat)
		}
		if got := s.CacheSaltField(false); got != tt.completions {
			t.Errorf("%s on completions: salt field %q, want %q", tt.d, got, tt.completions)
		}
	}
	if got, want := TakingCacheSalt(true), []Dialect{DialectVLLM, DialectSGLang, DialectTRTLLM, DialectDynamo}; !slices.Equal(got, want) {
		t.Errorf("TakingCacheSalt(chat) = %v, want %v", got, want)
	}
	if got, want := TakingCacheSalt(false), []Dialect{DialectVLLM, DialectSGLang, DialectDynamo}; !slices.Equal(got, want) {
		t.Errorf("TakingCacheSalt(completions) = %v, want %v", got, want)
	}
}
