// Package replay sends trace rows to inference servers on the trace's own
// schedule, through a Sender (the openai client), and models the cache an
// ideal server would have. It knows nothing of Prometheus: what it
// measures goes to an Observer.
package replay

import (
	"time"

	"github.com/kvload-exporter/kvload-exporter/openai"
)

// DropReason is why a scheduled request was never sent: the reason label
// of kvload_requests_dropped_total.
type DropReason string

// Drop reasons.
const (
	DropMaxInFlight DropReason = "max_in_flight"
	DropShutdown    DropReason = "shutdown"
	// DropBuildError: the row's request could not be built (for example
	// input_length inconsistent with hash_ids), so nothing was sent.
	DropBuildError DropReason = "build_error"
	// DropMaxLag: under on_saturation queue, the row waited for a slot
	// longer than the queue's lag bound behind its schedule.
	DropMaxLag DropReason = "max_lag"
)

// DefaultMaxQueueLag bounds how late a queued row may still be sent.
const DefaultMaxQueueLag = time.Minute

// Result is the measurement of one finished request: the client's
// Response, and what the replay knows of the row it came from.
type Result struct {
	Workload  string
	Target    string
	Scheduled time.Time // when the trace said to send it

	openai.Response
	// Request is what was sent: the KV event classifier reads its prompt
	// (package kvevents).
	Request openai.Request

	TraceInputLength int // the row's input_length (the trace's prompt tokens)
	// PromptBuiltTokens is Request.BuiltTokens: what the exporter built,
	// which the server's prompt_tokens exceeds by its template.
	PromptBuiltTokens int
	TraceHashIDs      []int64 // the row's hash ids, within TraceNamespace
	TraceNamespace    uint64  // hash-id namespace of the pass (loop: fresh changes it)

	// TheoreticalCachedTokens is what an ideal cache would have served for
	// this request (see CacheModel); TheoreticalKnown is false without a
	// model, or when the model could not tell.
	TheoreticalCachedTokens int
	TheoreticalKnown        bool
	// TheoreticalByCapacity is the same at every LRU capacity up to the
	// model's ceiling, for the effective capacity; its Known is false
	// without a model or when the model could not tell.
	TheoreticalByCapacity CapacityProfile

	// Counted says how the collector counts the request's cached tokens:
	// the cache-truth step (servedcache.Truth) fills it before the
	// collector sees the result.
	Counted Counted
}

// Counted is how a finished request's cached tokens are counted, decided
// from its target's source of observed cached tokens and what was learned
// of the target's answers.
type Counted struct {
	// UsageCached: the response's cached tokens are the target's observed
	// ones (observed: usage, and the response carried a count).
	UsageCached bool
	// Reported: the request counts on both sides of the cache efficiency,
	// its observed and its theoretical cached tokens being known.
	Reported bool
	// Unreported: the request succeeded but its observed cached tokens
	// are unknown.
	Unreported bool
	// LeftOut is the hit of the target's always-cached preamble, on
	// neither side of the cache efficiency: at most the request's cached
	// and prompt tokens.
	LeftOut int
}

// ScheduleLag is the actual send time minus the scheduled time.
func (r *Result) ScheduleLag() time.Duration { return r.Sent.Sub(r.Scheduled) }

// Observer receives what the replayer measures. Implementations must be
// safe for concurrent use and must not block for long.
type Observer interface {
	// Sent is called when a request goes out (for in-flight gauges and lag).
	Sent(workload, target string, scheduled, sent time.Time)
	// Finished is called once per sent request with its measurement.
	Finished(r *Result)
	// Dropped is called for a scheduled request that was never sent.
	Dropped(workload, target string, reason DropReason, scheduled time.Time)
	// PassCompleted is called when a workload finishes a pass over its trace.
	PassCompleted(workload, target string, pass int)
}
