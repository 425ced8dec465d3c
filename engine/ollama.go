package engine

// Ollama: its OpenAI routes read max_tokens only (given
// max_completion_tokens alone, a model that never emits EOS generates until
// the request times out, seen with v0.17.4), and it exposes no metrics,
// tokenize route, cache size or cache salt (none in v0.17.4's OpenAI
// layer, which ignores unknown fields).
var _ = register(&Spec{
	Dialect:          DialectOllama,
	Request:          RequestFields{ChatMaxTokens: "max_tokens"},
	BlockSize:        16,
	Granularity:      GranularityBlock,
	UnreportedAdvice: noCounterAdvice,
})
