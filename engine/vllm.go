package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	dto "github.com/prometheus/client_model/go"
)

// vLLM: max_completion_tokens on chat, ignore_eos and min_tokens; cached
// tokens in usage with --enable-prompt-tokens-details and on /metrics;
// 16-token blocks served whole; its cache size on /metrics. cache_salt
// confines prefix sharing to requests with the same salt: on chat since
// 0.9.0 (PR 17045, V1 engine only), on completions since PR 20981 (July
// 2025); an older server ignores it there with a warning.
var _ = register(&Spec{
	Dialect: DialectVLLM,
	Request: RequestFields{ChatMaxTokens: "max_completion_tokens", IgnoreEOS: true, MinTokens: true,
		ChatCacheSalt: cacheSalt, CompletionsCacheSalt: cacheSalt},
	BlockSize:   16,
	Granularity: GranularityBlock,
	Metrics: Metrics{
		CachedTokens: append([]Series{
			{Family: vllmPromptTokensCached, PromptTokens: vllmPerRequestPrompt},
			{Family: vllmPromptTokensBySource, Label: "source", Value: "local_cache_hit", CountsRecomputed: true, PromptTokens: vllmPerRequestPrompt},
		}, families("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total")...),
		PromptTokens:     families("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:prompt_tokens_total"),
		RecomputedTokens: families(vllmPromptTokensRecomputed),
	},
	UnreportedAdvice: "start vLLM with --enable-prompt-tokens-details, or set cache.observed: server_metrics",
	tokenize:         &tokenizeRoute{path: "/tokenize", body: openAITokenizeBody},
	tokenizeChat:     vllmTokenizeChat,
	promptTokens:     vllmPromptTokens,
	readLayout: func(ctx context.Context, c *http.Client, base string) (Layout, error) {
		mfs, err := metricsRead{client: c, url: base + "/metrics", families: []string{vllmCacheConfig}}.read(ctx)
		if err != nil {
			return Layout{}, fmt.Errorf("vllm metrics: %w", err)
		}
		return vllmLayoutOf(mfs)
	},
})

// vLLM's cached-token counters, cleanest first. prefix_cache_hits counts
// a preempted request's lookup again when it is scheduled anew, and so
// counts tokens it recomputes as hits (vLLM issue 25780, open). Since
// PR 33290 (February 2026) vLLM also counts each request's cached
// prompt tokens once, at its prefill: prompt_tokens_cached (local and
// from a KV connector, the count usage reports) and prompt_tokens_by_source
// with source local_cache_hit (local only). Until PR 38709 (April 2026)
// removed it, prompt_tokens_recomputed counted the last token of a
// prompt found whole in the cache, which the engine computes again;
// local_cache_hit counted it too, and prompt_tokens_cached did not.
//
// Each of those two is read with prompt_tokens, which vLLM counts at the
// same moment, once a request; prefix_cache_queries, like
// prefix_cache_hits, counts each lookup.
const (
	vllmPromptTokensCached     = "vllm:prompt_tokens_cached_total"
	vllmPromptTokensBySource   = "vllm:prompt_tokens_by_source_total"
	vllmPromptTokensRecomputed = "vllm:prompt_tokens_recomputed_total"
)

// vllmPerRequestPrompt is the prompt-token counter read with vLLM's
// per-request cached counts.
var vllmPerRequestPrompt = families("vllm:prompt_tokens_total")

// vllmChatBody is vLLM's chat form of /tokenize: the messages rendered by
// the server's chat template with the assistant's header, special tokens
// as the template writes them (vLLM's chat default), which is what
// /v1/chat/completions counts.
type vllmChatBody struct {
	Model               string        `json:"model,omitempty"`
	Messages            []chatMessage `json:"messages"`
	AddGenerationPrompt bool          `json:"add_generation_prompt"`
}

func vllmTokenizeChat(ctx context.Context, c *http.Client, base, model string, msgs []chatMessage) (int, error) {
	return postTokens(ctx, c, base, "/tokenize", vllmChatBody{Model: model, Messages: msgs, AddGenerationPrompt: true},
		tokenLimit(messagesBytes(msgs), true), nil)
}

// vllmCacheConfig is the gauge of a vLLM /metrics page that holds its
// layout, in the labels num_gpu_blocks and block_size.
const vllmCacheConfig = "vllm:cache_config_info"

// parseVLLMLayout reads the layout from a vLLM /metrics page.
func parseVLLMLayout(body []byte) (Layout, error) {
	mfs, err := parseFamilies(bytes.NewReader(body), []string{vllmCacheConfig})
	if err != nil {
		return Layout{}, fmt.Errorf("vllm metrics: %w", err)
	}
	return vllmLayoutOf(mfs)
}

// vllmLayoutOf is the layout in the families of a vLLM /metrics page.
func vllmLayoutOf(mfs map[string]*dto.MetricFamily) (Layout, error) {
	mf := mfs[vllmCacheConfig]
	if mf == nil || len(mf.GetMetric()) == 0 {
		return Layout{}, errors.New("vllm:cache_config_info not found in /metrics")
	}
	labels := map[string]string{}
	for _, l := range mf.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	bs, err1 := strconv.Atoi(labels["block_size"])
	blocks, err2 := strconv.Atoi(labels["num_gpu_blocks"])
	if err := errors.Join(err1, err2); err != nil || bs < 1 || blocks < 0 {
		return Layout{}, fmt.Errorf("vllm:cache_config_info: block_size %q, num_gpu_blocks %q are not usable", labels["block_size"], labels["num_gpu_blocks"])
	}
	return Layout{BlockSize: bs, Blocks: blocks, Source: "vllm:cache_config_info"}, nil
}
