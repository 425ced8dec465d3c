package engine

import (
	"slices"
	"testing"
)

// TestRegistry: every dialect has its own Spec, and the empty or an
// unknown dialect falls back to plain OpenAI's.
func TestRegistry(t *testing.T) {
	if len(registry) != len(Dialects) {
		t.Errorf("%d engines registered, %d dialects", len(registry), len(Dialects))
	}
	for _, d := range Dialects {
		s := For(d)
		if !Known(d) || s.Dialect != d {
			t.Errorf("For(%s) is %s's spec (known %v)", d, s.Dialect, Known(d))
		}
		if s.BlockSize < 1 || s.Request.ChatMaxTokens == "" || s.UnreportedAdvice == "" {
			t.Errorf("%s: incomplete spec %+v", d, s)
		}
	}
	for _, d := range []Dialect{"", "tgi"} {
		if For(d).Dialect != DialectOpenAI {
			t.Errorf("For(%q) is %s's spec, want openai's", d, For(d).Dialect)
		}
	}
	if Known("tgi") || Known("") {
		t.Error("an unknown dialect is known")
	}
}

// TestEngineFacts pins the facts that differ between engines, as their
// documentation (../shared/docs/engines-and-conventions.md) gives them.
func TestEngineFacts(t *testing.T) {
	tests := []struct {
		d                       Dialect
		block                   int
		gran                    Granularity
		layout, tok, chat, zero bool
	}{
		{DialectVLLM, 16, GranularityBlock, true, true, true, false},
		{DialectSGLang, 1, GranularityToken, true, true, false, true},
		{DialectTRTLLM, 32, GranularityBlock, false, true, false, false},
		{DialectDynamo, 16, GranularityBlock, false, true, false, true},
		{DialectLlamaCpp, 1, GranularityToken, false, true, true, false},
		{DialectOllama, 1, GranularityToken, false, false, false, false},
		{DialectOpenAI, 16, GranularityBlock, false, false, false, false},
	}
	for _, tt := range tests {
		s := For(tt.d)
		got := []any{s.BlockSize, s.Granularity, s.ExposesLayout(), s.CanTokenize(), s.CanTokenizeChat(), s.AbsentCachedIsZero}
		want := []any{tt.block, tt.gran, tt.layout, tt.tok, tt.chat, tt.zero}
		if !slices.Equal(got, want) {
			t.Errorf("%s: block, granularity, layout, tokenize, chat, absent-is-zero = %v, want %v", tt.d, got, want)
		}
	}
	want := []Dialect{DialectVLLM, DialectSGLang, DialectTRTLLM, DialectDynamo, DialectLlamaCpp}
	if got := CountingCachedTokens(); !slices.Equal(got, want) {
		t.Errorf("CountingCachedTokens() = %v, want %v", got, want)
	}
}

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
