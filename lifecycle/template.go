package lifecycle

import (
	"sync"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// maxTemplateTokens bounds a believable chat template: a larger difference
// between the server's prompt_tokens and the prompt built is a tokenizer
// that does not match the server's, not a template.
const maxTemplateTokens = 1024

// templateOverhead learns, per (workload, target), how many tokens the
// server's chat template adds to a prompt of one user message, from the
// usage of answered requests, so that later prompts leave that room and
// the server counts the trace's input_length. The sample of the shortest
// prompt seen is kept: a tokenizer that differs slightly from the server's
// adds an error that grows with length, the template does not.
type templateOverhead struct {
	logger log.Logger

	mu       sync.Mutex
	tokens   int // learnt overhead
	shortest int // built length of the prompt it was learnt from; 0 before any
}

// get returns the overhead learnt so far (0 before the first answer).
func (o *templateOverhead) get() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.tokens
}

// observe learns from a finished request.
func (o *templateOverhead) observe(r *replay.Result) {
	if r.Outcome != replay.OutcomeSuccess || !r.PromptKnown || r.PromptBuiltTokens <= 0 {
		return
	}
	sample := r.PromptTokens - r.PromptBuiltTokens
	if sample < 0 || sample > maxTemplateTokens {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.shortest != 0 && r.PromptBuiltTokens > o.shortest {
		return
	}
	changed := sample != o.tokens || o.shortest == 0
	o.tokens, o.shortest = sample, r.PromptBuiltTokens
	if changed && o.logger != nil {
		level.Info(o.logger).Log("msg", "chat template overhead learnt from the server's prompt_tokens; chat prompts leave it room",
			"tokens", sample, "from_prompt_tokens", r.PromptBuiltTokens)
	}
}
