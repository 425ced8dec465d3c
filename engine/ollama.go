package engine

// Ollama: its OpenAI routes read max_tokens only (given
// max_completion_tokens alone, a model that never emits EOS generates until
// the request times out, seen with v0.17.4), and it exposes no metrics,
// tokenize route, cache size or cache salt (none in v0.34.4's OpenAI
// layer, which ignores unknown fields). Since v0.33.3 its answers carry the
// prompt tokens its llama.cpp served from cache (llama-server's
// timings.cache_n): prompt_eval_cached_count on the native routes,
// usage.prompt_tokens_details.cached_tokens on the OpenAI ones, which this
// dialect speaks; a 0 is sent as 0. Older releases send neither, and
// their requests count as not reported. Both its old runner and
// llama-server reuse any number of tokens of a slot's last prompt.
var _ = register(&Spec{
	Dialect:          DialectOllama,
	Request:          RequestFields{ChatMaxTokens: "max_tokens"},
	BlockSize:        1,
	Granularity:      GranularityToken,
	UnreportedAdvice: ollamaAdvice,
})

// ollamaAdvice is for an Ollama too old to report cached tokens.
const ollamaAdvice = "Ollama reports cached tokens since v0.33.3; an older release reports none, so cache efficiency is not computed for it (the cache-class TTFT signal still works)"
