package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

// ErrImplausibleLayout is wrapped by the error of a layout read from a
// target that no server could have: it is refused, the capacity is then
// unknown, rather than modelled.
var ErrImplausibleLayout = errors.New("no server has such a KV cache")

// Plausible bounds of a KV cache. Block (page) sizes in use are 1 to a few
// hundred tokens. A cache of 2^32 tokens is some 100 times the largest a
// server holds (eight 141 GB GPUs at 32 KiB a token hold 34M), and keeps
// every product of blocks and block size, and the model's per-block
// counts, far inside an int64.
const (
	MaxBlockSize      = 1 << 16
	MaxCapacityTokens = 1 << 32
)

// CheckLayout refuses a layout outside the plausible bounds, naming the
// values and where they were read. Blocks 0 (unbounded) passes: only an
// emulated engine says so.
func CheckLayout(l Layout) error {
	switch {
	case l.BlockSize < 1 || l.BlockSize > MaxBlockSize:
		return fmt.Errorf("%s: block size %d is not from 1 to %d tokens: %w", l.Source, l.BlockSize, MaxBlockSize, ErrImplausibleLayout)
	case l.Blocks < 0 || l.Blocks > MaxCapacityTokens/l.BlockSize:
		return fmt.Errorf("%s: %d blocks of %d tokens is not from 0 to %d tokens: %w", l.Source, l.Blocks, l.BlockSize, MaxCapacityTokens, ErrImplausibleLayout)
	}
	return nil
}

// LayoutFailure is why a read of a target's layout failed: the reason
// label of kvload_target_cache_discovery_failures_total.
type LayoutFailure string

// The reasons a layout read fails.
const (
	// LayoutUnreachable: no connection to the target, or it broke.
	LayoutUnreachable LayoutFailure = "unreachable"
	// LayoutTimeout: no whole answer within the read's bound.
	LayoutTimeout LayoutFailure = "timeout"
	// LayoutBadAnswer: the target answered, but with an error status, a
	// redirect, or no usable layout.
	LayoutBadAnswer LayoutFailure = "bad_answer"
)

// LayoutFailures lists every LayoutFailure, for initialising series.
var LayoutFailures = [...]LayoutFailure{LayoutUnreachable, LayoutTimeout, LayoutBadAnswer}

// LayoutFailureOf classifies an error of ReadLayout. The first two
// reasons say the target is down (or not yet up); the third that it is
// up and says nothing usable.
func LayoutFailureOf(err error) LayoutFailure {
	// *url.Error, *net.OpError and context.DeadlineExceeded are all
	// net.Errors.
	if ne := net.Error(nil); errors.As(err, &ne) {
		if ne.Timeout() {
			return LayoutTimeout
		}
		return LayoutUnreachable
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return LayoutUnreachable
	}
	return LayoutBadAnswer
}

// maxLayoutBody bounds what is read of one answer, read whole: SGLang's
// server info is a few KiB.
const maxLayoutBody = 1 << 20

// layoutReader reads an engine's layout from the server at base (no
// trailing slash, no /v1).
type layoutReader func(ctx context.Context, c *http.Client, base string) (Layout, error)

// ExposesLayout tells whether ReadLayout can read the engine's layout:
// vLLM's cache_config_info gauge, SGLang's /get_server_info. TensorRT-LLM,
// Dynamo, llama.cpp and plain OpenAI servers say nothing that is read;
// set cache.capacity_blocks and cache.block_size for them.
func (s *Spec) ExposesLayout() bool { return s.readLayout != nil }

// ReadLayout asks the server at baseURL (without /v1) for its KV cache
// layout. Its error wraps ErrNotExposed for an engine that does not say,
// and ErrImplausibleLayout for a layout CheckLayout refuses.
func (s *Spec) ReadLayout(ctx context.Context, c *http.Client, baseURL string) (Layout, error) {
	if s.readLayout == nil {
		return Layout{}, ErrNotExposed
	}
	l, err := s.readLayout(ctx, c, strings.TrimSuffix(baseURL, "/"))
	if err == nil {
		err = CheckLayout(l)
	}
	if err != nil {
		return Layout{}, err
	}
	return l, nil
}

func get(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return ReadAnswer(c, req, maxLayoutBody)
}
