package engine

// TensorRT-LLM: max_tokens, ignore_eos and min_tokens (it rejects unknown
// fields); 32-token blocks. It reuses partial blocks, but stores only the
// full blocks of a prompt's first ISL-1 tokens: a hit can end inside a
// block only where a new prompt is shorter than a cached one, so whole
// blocks are the closer model. Its cache size is not exposed. Its chat
// request takes cache_salt (PR 7106, August 2025); its completions request
// has no such field and, refusing unknown fields, would answer 400.
var _ = register(&Spec{
	Dialect:     DialectTRTLLM,
	Request:     RequestFields{ChatMaxTokens: "max_tokens", IgnoreEOS: true, MinTokens: true, ChatCacheSalt: cacheSalt},
	BlockSize:   32,
	Granularity: GranularityBlock,
	Metrics: Metrics{
		CachedTokens: families("trtllm_prompt_cached_tokens_total", "trtllm_prompt_cache_hit_tokens_total"),
	},
	UnreportedAdvice: serverMetricsAdvice,
	// No flag for special tokens: a BOS may be counted.
	tokenize: &tokenizeRoute{path: "/_internal/tokenize", body: func(model, text string) any {
		return trtllmTokenizeBody{Model: model, Prompt: text}
	}},
})

// serverMetricsAdvice is for engines whose usage never carries cached
// tokens but whose /metrics counts them.
const serverMetricsAdvice = "set cache.observed: server_metrics to read the engine's own counter"

type trtllmTokenizeBody struct {
	Model  string `json:"model,omitempty"`
	Prompt string `json:"prompt"`
}
