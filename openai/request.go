// Package openai streams completions from an OpenAI-compatible inference
// server and measures each request: when it was sent, its first and last
// content, its outcome and the token counts of its usage. The body fields
// and usage conventions of each engine come from package engine.
package openai

import (
	"encoding/json"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Outcome classifies how a request ended. Every request ends in exactly one.
type Outcome string

// The outcomes of the contract (label values of kvload_requests_total).
const (
	OutcomeSuccess         Outcome = "success"
	OutcomeHTTPError       Outcome = "http_error"
	OutcomeStreamError     Outcome = "stream_error"
	OutcomeTimeout         Outcome = "timeout"
	OutcomeConnectionError Outcome = "connection_error"
	OutcomeCanceled        Outcome = "canceled"
	// OutcomeAbandoned: the exporter closed the stream on purpose, as a
	// user pressing stop does (Request.Abandon); neither a success nor an
	// error.
	OutcomeAbandoned Outcome = "abandoned"
)

// ServerNeverGotIt tells whether a request with this outcome certainly did
// not reach the server's engine: it was refused before any answer, or
// answered with an error status before any chunk. Its prompt was not
// prefilled, so it warms no cache.
func (o Outcome) ServerNeverGotIt() bool {
	return o == OutcomeConnectionError || o == OutcomeHTTPError
}

// IsError tells whether the outcome is a failure of the target or of the
// way to it: neither a success nor a request the exporter ended itself
// (canceled, abandoned).
func (o Outcome) IsError() bool {
	switch o {
	case OutcomeHTTPError, OutcomeStreamError, OutcomeTimeout, OutcomeConnectionError:
		return true
	}
	return false
}

// Outcomes lists every outcome, for initialising metrics.
var Outcomes = [...]Outcome{OutcomeSuccess, OutcomeHTTPError, OutcomeStreamError, OutcomeTimeout, OutcomeConnectionError, OutcomeCanceled, OutcomeAbandoned}

// API is the OpenAI endpoint a target is driven through.
type API string

// The APIs of target.api.
const (
	APIChat        API = "chat"        // POST /v1/chat/completions
	APICompletions API = "completions" // POST /v1/completions
)

// APIs lists every API.
var APIs = [...]API{APIChat, APICompletions}

// Request is what the client sends for one trace row. Exactly one of
// Prompt, PromptTokenIDs, Messages and Payload is set.
type Request struct {
	Prompt         string            // text prompt: the user message (chat) or prompt (completions)
	PromptTokenIDs []int             // token-id prompt (completions only)
	Messages       []json.RawMessage // chat messages sent verbatim
	Tools          []json.RawMessage // with Messages
	Payload        json.RawMessage   // a whole request body sent verbatim
	Extra          json.RawMessage   // the row's extra: merged into the body last
	MaxTokens      int               // exact output length wanted; 0 = none given
	// BuiltTokens is the length, in the builder's tokens, of a prompt the
	// exporter built (Prompt or PromptTokenIDs); 0 when the row carried
	// its own (Messages, Payload, text input).
	BuiltTokens int
	// Session identifies the request's conversation in the target's
	// session header (TargetConfig.SessionHeader), when it has one.
	Session string
	// Abandon, when set, closes the stream early on purpose.
	Abandon Abandon
}

// Abandon says when the client closes a request's stream before its end,
// as a user pressing stop or a client timing out does: once AfterTokens
// content chunks arrived, or After past the send. The zero value never
// abandons. A request that ends first is not abandoned.
type Abandon struct {
	AfterTokens int
	After       time.Duration
}

// Set tells whether a abandons at all.
func (a Abandon) Set() bool { return a.AfterTokens > 0 || a.After > 0 }

// Response is what the client measures of one request.
type Response struct {
	Sent       time.Time // just before the request was written
	FirstToken time.Time // first chunk carrying content, reasoning or tool-call text; zero if none
	LastToken  time.Time // last such chunk; zero if none

	Outcome    Outcome
	HTTPStatus int    // 0 when no response was received
	Error      string // short reason for logs (never a label, never a secret)

	OutputTokens    int  // server usage completion_tokens, else counted content chunks
	OutputFromUsage bool // OutputTokens came from the server's usage
	PromptTokens    int  // server usage prompt_tokens; 0 with PromptKnown false when absent
	PromptKnown     bool
	CachedTokens    int  // cached prompt tokens the server reported
	CachedKnown     bool // false when the server said nothing (absent is not zero)

	// PrefillTime is the engine's own time for the request's prefill, its
	// queue left out, where it reports one (PrefillKnown): llama.cpp's
	// timings.prompt_ms, vLLM's metrics.time_to_first_token_ms with
	// --enable-per-request-metrics.
	PrefillTime  time.Duration
	PrefillKnown bool

	// Trace is the request's trace context, as its traceparent header
	// carried it; sampled where the tracing's sample_ratio drew it.
	Trace trace.SpanContext
	// Phases are the HTTP phases of the request's last attempt.
	Phases HTTPPhases
}

// TTFT is the time from send to the first content chunk; ok is false when
// no content arrived.
func (r *Response) TTFT() (time.Duration, bool) {
	if r.FirstToken.IsZero() {
		return 0, false
	}
	return r.FirstToken.Sub(r.Sent), true
}

// Latency is the time from send to the last content chunk.
func (r *Response) Latency() (time.Duration, bool) {
	if r.LastToken.IsZero() {
		return 0, false
	}
	return r.LastToken.Sub(r.Sent), true
}

// ITL is AIPerf's inter-token latency, (latency − TTFT) / (output tokens − 1),
// defined only with at least two output tokens.
func (r *Response) ITL() (time.Duration, bool) {
	ttft, ok1 := r.TTFT()
	lat, ok2 := r.Latency()
	if !ok1 || !ok2 || r.OutputTokens < 2 {
		return 0, false
	}
	return (lat - ttft) / time.Duration(r.OutputTokens-1), true
}
