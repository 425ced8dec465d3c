package engine

// Dynamo's frontend: max_tokens, ignore_eos and min_tokens at the root;
// cached tokens passed through from its workers (omitted when zero) and a
// histogram of them on /metrics; 16-token blocks. It has no prompt-token
// counter, so this replica's share of the hits cannot be known, and its
// cache size is not exposed. Its frontend takes a top-level cache_salt
// (beside nvext.cache_salt and the x-tenant-id header, which win) and
// hands it to vLLM and TensorRT-LLM workers and its KV router since PR
// 8197 (April 2026), to SGLang workers since PR 14803 (September 2026).
var _ = register(&Spec{
	Dialect: DialectDynamo,
	Request: RequestFields{ChatMaxTokens: "max_tokens", IgnoreEOS: true, MinTokens: true,
		ChatCacheSalt: cacheSalt, CompletionsCacheSalt: cacheSalt},
	AbsentCachedIsZero: true,
	BlockSize:          16,
	Granularity:        GranularityBlock,
	Metrics:            Metrics{CachedTokens: families("dynamo_frontend_cached_tokens")},
	UnreportedAdvice:   serverMetricsAdvice,
	tokenize:           &tokenizeRoute{path: "/tokenize", body: openAITokenizeBody},
})
