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
		CachedTokens: []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total"},
		PromptTokens: []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:prompt_tokens_total"},
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
