package lifecycle

import (
	"sync"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// maxTemplateTokens bounds a believable chat template: a larger difference
// between the server's prompt_tokens and the prompt built is a tokenizer
// that does not match the server's, not a template.
const maxTemplateTokens = engine.MaxChatTemplateTokens

// templateOverhead learns, per (workload, target), how many tokens the
// server's chat template adds to a prompt of one user message, from the
// usage of answered requests, so that later prompts leave that room and
// the server counts the trace's input_length. A template adds the same
// count to every prompt, so two answers for prompts of different lengths
// must agree (within a token, where the words meet the template) before
// the size is used: a server whose prompt_tokens is not the prompt's
// length plus a constant (a tokenizer unlike the builder's, a stub that
// reports a fixed figure) teaches nothing, and prompts stay as built.
type templateOverhead struct {
	logger log.Logger

	mu     sync.Mutex
	tokens int  // the size in use
	known  bool // tokens is confirmed
	// The last answer's sample and its prompt's built length.
	sample, built int
}

// newTemplateOverhead starts learning, or, when the target's tokenize
// endpoint measured the template (known), starts from that size.
func newTemplateOverhead(logger log.Logger, tokens int, known bool) *templateOverhead {
	o := &templateOverhead{logger: logger}
	if known {
		o.tokens, o.known = tokens, true
	}
	return o
}

// get returns the size in use (0 until two answers agree).
func (o *templateOverhead) get() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.tokens
}

// observe learns from a finished request.
func (o *templateOverhead) observe(r *replay.Result) {
	if r.Outcome != openai.OutcomeSuccess || !r.PromptKnown || r.PromptBuiltTokens <= 0 {
		return
	}
	sample := r.PromptTokens - r.PromptBuiltTokens
	if sample < 0 || sample > maxTemplateTokens {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.known {
		return
	}
	prev, prevBuilt := o.sample, o.built
	o.sample, o.built = sample, r.PromptBuiltTokens
	if prevBuilt == 0 || prevBuilt == r.PromptBuiltTokens || abs(sample-prev) > 1 {
		return
	}
	// The shorter prompt's sample: any tokenizer error grows with length.
	if prevBuilt < r.PromptBuiltTokens {
		sample = prev
	}
	o.tokens, o.known = sample, true
	if o.logger != nil {
		level.Info(o.logger).Log("msg", "chat template overhead learnt from the server's prompt_tokens; chat prompts leave it room",
			"tokens", sample)
	}
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
