package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// SGLang: max_tokens, ignore_eos and min_tokens; cached tokens in usage
// with --enable-cache-report (omitted when zero) and on /metrics; its
// radix tree serves any number of tokens, in pages of one token by
// default; its cache size on /get_server_info. It takes cache_salt on
// both routes since PR 10718 (September 2025), but the salt reaches the
// radix cache only since PR 23300 (April 2026); before, and on servers
// without the field, it is ignored.
var _ = register(&Spec{
	Dialect: DialectSGLang,
	Request: RequestFields{ChatMaxTokens: "max_tokens", IgnoreEOS: true, MinTokens: true,
		ChatCacheSalt: cacheSalt, CompletionsCacheSalt: cacheSalt},
	AbsentCachedIsZero: true,
	BlockSize:          1,
	Granularity:        GranularityToken,
	Metrics: Metrics{
		CachedTokens: families("sglang:cached_tokens_total", "sglang:cached_tokens"),
		PromptTokens: families("sglang:prompt_tokens_total"),
	},
	UnreportedAdvice: "start SGLang with --enable-cache-report, or set cache.observed: server_metrics",
	tokenize:         &tokenizeRoute{path: "/v1/tokenize", body: openAITokenizeBody},
	readLayout: func(ctx context.Context, c *http.Client, base string) (Layout, error) {
		body, err := get(ctx, c, base+"/get_server_info")
		if err != nil {
			return Layout{}, err
		}
		return parseSGLangLayout(body)
	},
})

// parseSGLangLayout reads the layout from SGLang's /get_server_info
// answer: max_total_num_tokens in pages of page_size.
func parseSGLangLayout(body []byte) (Layout, error) {
	var info struct {
		MaxTotalNumTokens *int `json:"max_total_num_tokens"`
		PageSize          *int `json:"page_size"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return Layout{}, fmt.Errorf("sglang server info: %w", err)
	}
	if info.MaxTotalNumTokens == nil || *info.MaxTotalNumTokens < 1 {
		return Layout{}, errors.New("sglang server info has no max_total_num_tokens")
	}
	page := 1
	if info.PageSize != nil && *info.PageSize > 0 {
		page = *info.PageSize
	}
	if page > *info.MaxTotalNumTokens {
		// Not one page: a count of 0 blocks would read as unbounded.
		return Layout{}, fmt.Errorf("sglang server info: page_size %d is above max_total_num_tokens %d: %w", page, *info.MaxTotalNumTokens, ErrImplausibleLayout)
	}
	return Layout{BlockSize: page, Blocks: *info.MaxTotalNumTokens / page, Source: "/get_server_info"}, nil
}
