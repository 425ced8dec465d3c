package lifecycle

import (
	"sync"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/collector"
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
//
// A size measured through the target's tokenize endpoint is used from the
// first request on, and checked the same way against the answers: an
// endpoint that renders the template unlike the chat route (claiming
// 1,000 tokens where the route adds 5) would otherwise cut every prompt
// short for good. When the answers agree on another size, theirs replaces
// it, once, logged with both figures and counted.
type templateOverhead struct {
	logger  log.Logger
	publish templatePublisher // nil: nothing exported

	mu       sync.Mutex
	tokens   int  // the size in use
	measured bool // tokens came from the tokenize endpoint
	settled  bool // the answers confirmed or replaced it: nothing more to learn
	// The last answer's sample and its prompt's built length.
	sample, built int
}

// templatePublisher exports a template's size as it is settled: the size
// in use and where it came from, and whether it replaced a measured one.
type templatePublisher func(tokens int, source collector.TemplateSource, corrected bool)

// newTemplateOverhead starts learning, or, when the target's tokenize
// endpoint measured the template (known), starts from that size.
func newTemplateOverhead(logger log.Logger, tokens int, known bool, publish templatePublisher) *templateOverhead {
	o := &templateOverhead{logger: logger, publish: publish}
	if known {
		o.tokens, o.measured = tokens, true
	}
	return o
}

// start exports the measured size, if any, as its unit starts.
func (o *templateOverhead) start() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.measured && !o.settled && o.publish != nil {
		o.publish(o.tokens, collector.TemplateFromTokenize, false)
	}
}

// get returns the size in use (0 until known).
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
	// What the server counted beyond the prompt built, whatever room the
	// prompt left: the template's real size.
	sample := r.PromptTokens - r.PromptBuiltTokens
	if sample < 0 || sample > maxTemplateTokens {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.settled {
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
	o.settle(sample)
}

// settle takes the size two answers agreed on, o.mu held.
func (o *templateOverhead) settle(answered int) {
	o.settled = true
	switch {
	case o.measured && abs(answered-o.tokens) <= 1:
		return // confirmed
	case o.measured:
		if o.logger != nil {
			level.Warn(o.logger).Log("msg", "the chat template size measured through the target's tokenize endpoint disagrees with what its answers' prompt_tokens show; chat prompts leave the answers' room from now on",
				"measured_tokens", o.tokens, "answered_tokens", answered)
		}
	default:
		if o.logger != nil {
			level.Info(o.logger).Log("msg", "chat template overhead learnt from the server's prompt_tokens; chat prompts leave it room",
				"tokens", answered)
		}
	}
	if o.publish != nil {
		o.publish(answered, collector.TemplateFromAnswers, o.measured)
	}
	o.tokens = answered
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
