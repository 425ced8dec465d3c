// Package kvcapacity reads a target's KV cache layout (block size and
// number of blocks) from what its engine exposes, so that the theoretical
// cache model can be as large as the server's real cache.
//
// What each engine exposes:
//   - vLLM: the gauge vllm:cache_config_info on /metrics, with the labels
//     num_gpu_blocks and block_size.
//   - SGLang: GET /get_server_info, with max_total_num_tokens and page_size.
//   - TensorRT-LLM, Dynamo, llama.cpp and plain OpenAI servers: nothing
//     this package reads; set cache.capacity_blocks and cache.block_size.
package kvcapacity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// Layout is a server's KV cache: Blocks of BlockSize tokens. Blocks 0 means
// unbounded (only an emulated engine says so).
type Layout struct {
	BlockSize int
	Blocks    int
	Source    string // where it was read, for logs
}

// ErrNotExposed means the dialect's engine does not expose its layout.
var ErrNotExposed = errors.New("the engine does not expose its KV cache size")

// maxBody bounds what is read of one answer.
const maxBody = 32 << 20

// Exposed tells whether Discover can read a dialect's layout.
func Exposed(dialect replay.Dialect) bool {
	return dialect == replay.DialectVLLM || dialect == replay.DialectSGLang
}

// Discover asks the server at baseURL (without /v1) for its layout.
func Discover(ctx context.Context, c *http.Client, baseURL string, dialect replay.Dialect) (Layout, error) {
	base := strings.TrimSuffix(baseURL, "/")
	switch dialect {
	case replay.DialectVLLM:
		return fromVLLM(ctx, c, base+"/metrics")
	case replay.DialectSGLang:
		return fromSGLang(ctx, c, base+"/get_server_info")
	}
	return Layout{}, ErrNotExposed
}

func get(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return replay.ReadAnswer(c, req, maxBody)
}

func fromVLLM(ctx context.Context, c *http.Client, url string) (Layout, error) {
	body, err := get(ctx, c, url)
	if err != nil {
		return Layout{}, err
	}
	return parseVLLM(body)
}

// parseVLLM reads the layout from a vLLM /metrics page.
func parseVLLM(body []byte) (Layout, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return Layout{}, fmt.Errorf("vllm metrics: %w", err)
	}
	mf := mfs["vllm:cache_config_info"]
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

func fromSGLang(ctx context.Context, c *http.Client, url string) (Layout, error) {
	body, err := get(ctx, c, url)
	if err != nil {
		return Layout{}, err
	}
	return parseSGLang(body)
}

// parseSGLang reads the layout from SGLang's /get_server_info answer.
func parseSGLang(body []byte) (Layout, error) {
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
	return Layout{BlockSize: page, Blocks: *info.MaxTotalNumTokens / page, Source: "/get_server_info"}, nil
}
