// Package engine holds what the exporter knows about each inference engine
// it loads, one file per engine: the fields its request body takes, how it
// reports cached tokens, its KV block size and hit granularity, the names
// of its own metrics, its tokenize endpoints, how to read its KV cache
// size, and what to tell a user whose engine reports no cached tokens.
//
// Callers ask For(dialect) and never switch on the dialect themselves, so
// that adding or fixing an engine touches one file. The emulator keeps its
// own engine personalities on purpose: they are the independent truth the
// tests check this package against.
package engine

import (
	"fmt"
	"slices"

	dto "github.com/prometheus/client_model/go"
)

// Dialect names the server flavour a target speaks (target.dialect). All
// of them take the OpenAI request shape; they differ in how an exact
// output length is asked for, which extra fields they accept, and how they
// report cached tokens.
type Dialect string

// The dialects of the config's target.dialect.
const (
	DialectVLLM     Dialect = "vllm"
	DialectSGLang   Dialect = "sglang"
	DialectTRTLLM   Dialect = "trtllm"
	DialectDynamo   Dialect = "dynamo"
	DialectLlamaCpp Dialect = "llamacpp"
	DialectOpenAI   Dialect = "openai"
	DialectOllama   Dialect = "ollama"
)

// Dialects lists every dialect, in the order messages name them.
var Dialects = [...]Dialect{DialectVLLM, DialectSGLang, DialectTRTLLM, DialectDynamo, DialectLlamaCpp, DialectOllama, DialectOpenAI}

// Granularity is how an engine rounds the prefix it serves from cache.
type Granularity int

const (
	// GranularityBlock serves whole server blocks only and recomputes the
	// last prompt token (vLLM, Dynamo, TensorRT-LLM, which stores full
	// blocks only).
	GranularityBlock Granularity = iota
	// GranularityToken serves any number of tokens up to the prompt's
	// length minus one (SGLang's radix cache with pages of one token,
	// llama.cpp's slot prefix).
	GranularityToken
)

// RequestFields are the body fields a dialect takes beside the OpenAI
// shape.
type RequestFields struct {
	// ChatMaxTokens is the output-length field on /v1/chat/completions.
	// OpenAI and vLLM deprecated max_tokens there in favour of
	// max_completion_tokens; the others document max_tokens.
	// /v1/completions always takes max_tokens.
	ChatMaxTokens string
	// NPredict also sends llama.cpp's native n_predict, which its OpenAI
	// routes accept beside max_tokens.
	NPredict bool
	// IgnoreEOS and MinTokens pin the output length: without them a model
	// that emits EOS early produces fewer tokens than the trace asked for.
	IgnoreEOS bool
	MinTokens bool
	// ChatCacheSalt and CompletionsCacheSalt name the top-level body field
	// that confines prefix-cache sharing to the requests carrying the same
	// value, on /v1/chat/completions and /v1/completions; "" where the
	// engine takes none on that route. A route that refuses unknown
	// fields must say "" (TensorRT-LLM's completions).
	ChatCacheSalt, CompletionsCacheSalt string
}

// Metrics names an engine's own counters on its /metrics. Of each list,
// the first counter present in a scrape is read; a histogram counts by its
// sum.
type Metrics struct {
	// CachedTokens counts prompt tokens served from the prefix cache, the
	// cleanest count first: where an engine has several, the later ones
	// are for its releases that lack the earlier.
	CachedTokens []Series
	// PromptTokens counts the prompt tokens the engine processed, for this
	// replica's share of the cached tokens.
	PromptTokens []Series
	// PromptExcludesCached: the prompt counter leaves the cached tokens
	// out, and the cached-token counter adds them back.
	PromptExcludesCached bool
	// RecomputedTokens counts tokens the engine found in its cache and
	// computed again (vLLM's full hit, whose last token it must compute).
	RecomputedTokens []Series
}

// Series picks the series of one counter on an engine's /metrics: a
// family, by the name the text format exposes it under (with _total), and
// where the family splits its count by a label, the one value of that
// label to read; Label empty reads every series of the family.
type Series struct {
	Family       string
	Label, Value string
	// CountsRecomputed: the count includes the tokens RecomputedTokens
	// counts, which a read takes out where the engine exports them.
	CountsRecomputed bool
	// PromptTokens, for a cached-token counter, are the prompt-token
	// counters counted at the same moment, read with it instead of
	// Metrics.PromptTokens; nil: Metrics.PromptTokens.
	PromptTokens []Series
}

// families is a Series for each family named, read whole.
func families(names ...string) []Series {
	out := make([]Series, len(names))
	for i, name := range names {
		out[i] = Series{Family: name}
	}
	return out
}

// String writes the series as PromQL selects them.
func (s Series) String() string {
	if s.Label == "" {
		return s.Family
	}
	return fmt.Sprintf("%s{%s=%q}", s.Family, s.Label, s.Value)
}

// matches tells whether m is one of the series s reads.
func (s Series) matches(m *dto.Metric) bool {
	if s.Label == "" {
		return true
	}
	for _, l := range m.GetLabel() {
		if l.GetName() == s.Label {
			return l.GetValue() == s.Value
		}
	}
	return false
}

// Spec is everything the exporter knows about one engine.
type Spec struct {
	Dialect Dialect
	Request RequestFields
	// AbsentCachedIsZero: the engine omits prompt_tokens_details when the
	// count is zero (SGLang's --enable-cache-report, Dynamo passthrough).
	// An absence then means zero only once the target has been seen to
	// report cached tokens at all.
	AbsentCachedIsZero bool
	// BlockSize is the engine's default KV block (page) size, used when
	// cache.block_size is auto and the target does not say.
	BlockSize   int
	Granularity Granularity
	Metrics     Metrics
	// UnreportedAdvice says what makes the engine report cached tokens.
	UnreportedAdvice string

	tokenize     *tokenizeRoute
	tokenizeChat chatTokenizer
	promptTokens promptTokenizer
	readLayout   layoutReader
}

// cacheSalt is the body field of the engines that take a cache salt.
const cacheSalt = "cache_salt"

// registry holds every engine's Spec; each file adds its own.
var registry = map[Dialect]*Spec{}

func register(s *Spec) *Spec {
	registry[s.Dialect] = s
	return s
}

// Known tells whether d names an engine.
func Known(d Dialect) bool {
	_, ok := registry[d]
	return ok
}

// For is the Spec of d. An empty dialect is OpenAI's; so is an unknown
// one, which configuration validation refuses before it gets here.
func For(d Dialect) *Spec {
	if s, ok := registry[d]; ok {
		return s
	}
	return registry[DialectOpenAI]
}

// CountsCachedTokens tells whether the engine exports a cached-token
// counter that observed: server_metrics can read.
func (s *Spec) CountsCachedTokens() bool { return len(s.Metrics.CachedTokens) > 0 }

// CacheSaltField is the body field that carries a cache salt on chat
// (/v1/chat/completions) or completions, "" when the route takes none.
func (s *Spec) CacheSaltField(chat bool) string {
	if chat {
		return s.Request.ChatCacheSalt
	}
	return s.Request.CompletionsCacheSalt
}

// TakingCacheSalt lists the dialects whose engines take a cache salt on
// chat or completions, in Dialects' order.
func TakingCacheSalt(chat bool) []Dialect {
	return slices.DeleteFunc(slices.Clone(Dialects[:]), func(d Dialect) bool { return For(d).CacheSaltField(chat) == "" })
}

// CountsPromptTokens tells whether the engine also counts the prompt
// tokens it looked up in its cache, cached or not: the denominator of its
// own hit rate, and what tells how much of its traffic a client sent.
func (s *Spec) CountsPromptTokens() bool {
	return s.CountsCachedTokens() && len(s.Metrics.PromptTokens) > 0
}

// CountingPromptTokens lists the dialects whose engines export both
// counters, in Dialects' order.
func CountingPromptTokens() []Dialect {
	return slices.DeleteFunc(slices.Clone(Dialects[:]), func(d Dialect) bool { return !For(d).CountsPromptTokens() })
}

// CountingCachedTokens lists the dialects whose engines export a
// cached-token counter, in Dialects' order.
func CountingCachedTokens() []Dialect {
	return slices.DeleteFunc(slices.Clone(Dialects[:]), func(d Dialect) bool { return !For(d).CountsCachedTokens() })
}
