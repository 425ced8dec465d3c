// Package servedcachetest builds the finished requests that the tests of
// servedcache and of the collector's series over it feed in, so that both
// describe a request the same way.
package servedcachetest

import (
	"time"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// Request is one finished request of a reconciliation test.
type Request struct {
	Prompt, Cached int
	CachedKnown    bool // usage carried a cached-token count
	Theoretical    int  // -1: unknown
	Failed         bool
	SentAgo        time.Duration // sent this long before it finished
}

// Result is the request's result for workload "w" and target, finished at
// now.
func (q Request) Result(target string, now time.Time) *replay.Result {
	r := &replay.Result{Response: openai.Response{Outcome: openai.OutcomeSuccess, PromptTokens: q.Prompt, PromptKnown: true,
		CachedTokens: q.Cached, CachedKnown: q.CachedKnown, Sent: now.Add(-q.SentAgo)}, Workload: "w", Target: target, TraceInputLength: q.Prompt}
	if q.Failed {
		r.Outcome = openai.OutcomeStreamError
	}
	if q.Theoretical >= 0 {
		r.TheoreticalCachedTokens, r.TheoreticalKnown = q.Theoretical, true
	}
	return r
}

// Counted is a successful request of workload "w" and target "t" counted
// on both sides of the cache efficiency with its usage: trace and server
// prompt tokens, its observed cached tokens and its capacity profile.
func Counted(trace, prompt, cached int, steps ...replay.CapacityStep) *replay.Result {
	model := 0 // an unbounded model: the hit at its ceiling
	if len(steps) > 0 {
		model = steps[len(steps)-1].Tokens
	}
	return &replay.Result{
		TheoreticalCachedTokens: model,
		Workload:                "w", Target: "t",
		Response:         openai.Response{Outcome: openai.OutcomeSuccess, PromptTokens: prompt, PromptKnown: true, CachedTokens: cached, CachedKnown: true},
		TraceInputLength: trace, TheoreticalKnown: true,
		TheoreticalByCapacity: replay.CapacityProfile{Steps: steps, Known: true},
		Counted:               replay.Counted{UsageCached: true, Reported: true},
	}
}
