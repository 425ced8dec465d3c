package engine

import (
	"context"
	"errors"
	"net/http"
	"strings"
)

// Layout is a server's KV cache: Blocks of BlockSize tokens. Blocks 0
// means unbounded (only an emulated engine says so).
type Layout struct {
	BlockSize int
	Blocks    int
	Source    string // where it was read, for logs
}

// ErrNotExposed means the engine does not expose its layout.
var ErrNotExposed = errors.New("the engine does not expose its KV cache size")

// maxLayoutBody bounds what is read of one answer.
const maxLayoutBody = 32 << 20

// layoutReader reads an engine's layout from the server at base (no
// trailing slash, no /v1).
type layoutReader func(ctx context.Context, c *http.Client, base string) (Layout, error)

// ExposesLayout tells whether ReadLayout can read the engine's layout:
// vLLM's cache_config_info gauge, SGLang's /get_server_info. TensorRT-LLM,
// Dynamo, llama.cpp and plain OpenAI servers say nothing that is read;
// set cache.capacity_blocks and cache.block_size for them.
func (s *Spec) ExposesLayout() bool { return s.readLayout != nil }

// ReadLayout asks the server at baseURL (without /v1) for its KV cache
// layout. Its error wraps ErrNotExposed for an engine that does not say.
func (s *Spec) ReadLayout(ctx context.Context, c *http.Client, baseURL string) (Layout, error) {
	if s.readLayout == nil {
		return Layout{}, ErrNotExposed
	}
	return s.readLayout(ctx, c, strings.TrimSuffix(baseURL, "/"))
}

func get(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return ReadAnswer(c, req, maxLayoutBody)
}
