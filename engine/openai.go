package engine

// noCounterAdvice is for engines that report cached tokens nowhere.
const noCounterAdvice = "the server reports no cached tokens; cache efficiency is not computed for it (the cache-class TTFT signal still works)"

// A plain OpenAI-compatible server: max_completion_tokens on chat, no way
// to pin the output length, no cached-token counter, tokenize route or
// cache size to read, and no cache salt known to be taken.
var _ = register(&Spec{
	Dialect:          DialectOpenAI,
	Request:          RequestFields{ChatMaxTokens: "max_completion_tokens"},
	BlockSize:        16,
	Granularity:      GranularityBlock,
	UnreportedAdvice: noCounterAdvice,
})
