package engine

// Dynamo's frontend: max_tokens, ignore_eos and min_tokens at the root;
// cached tokens passed through from its workers (omitted when zero) and a
// histogram of them on /metrics; 16-token blocks. It has no prompt-token
// counter, so this replica's share of the hits cannot be known, and its
// cache size is not exposed.
var _ = register(&Spec{
	Dialect:            DialectDynamo,
	Request:            RequestFields{ChatMaxTokens: "max_tokens", IgnoreEOS: true, MinTokens: true},
	AbsentCachedIsZero: true,
	BlockSize:          16,
	Granularity:        GranularityBlock,
	Metrics:            Metrics{CachedTokens: []string{"dynamo_frontend_cached_tokens"}},
	UnreportedAdvice:   serverMetricsAdvice,
	tokenize:           &tokenizeRoute{path: "/tokenize", body: openAITokenizeBody},
})
