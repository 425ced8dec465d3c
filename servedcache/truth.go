package servedcache

import (
	"sync"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// Counter is what the cache-truth step feeds: the collector.
type Counter interface {
	replay.Observer
	// AddServerCredit adds cached tokens read from the engine's counter to
	// a workload: all of its share, and the part on the efficiency's
	// observed side (of requests whose theoretical tokens are known).
	AddServerCredit(workload, target string, cached, reportedCached float64)
	ServerMetricsError(target string, reason engine.ServerMetricsErrorReason)
	// SetPreamble publishes a target's always-cached preamble.
	SetPreamble(target string, tokens int)
}

// Truth is the cache-truth step, between the replay and the collector: it
// implements replay.Observer and engine.CountSink, decides how each result
// counts, and forwards to a Counter. Per finished request it fills
// replay.Result.Counted: whether the response's cached tokens are the
// observed ones, whether the request counts on both sides of the cache
// efficiency, and how much of its hit is the target's always-cached
// preamble. With observed: server_metrics it credits this replica's part
// of the engine's cached-token counter to the workloads that sent prompts.
type Truth struct {
	next Counter

	// NotifyUnreported, when set, hears once per target (and again after
	// its configuration changes) that a successful response carried no
	// cached-token count, with the target's dialect, to tell the user
	// what to switch on.
	NotifyUnreported func(target string, dialect engine.Dialect)

	mu      sync.Mutex
	targets map[string]*targetState
}

var (
	_ replay.Observer  = (*Truth)(nil)
	_ engine.CountSink = (*Truth)(nil)
)

// targetState is what the cache-truth step keeps of one target.
type targetState struct {
	dialect  engine.Dialect
	observed engine.Observed
	notified bool // NotifyUnreported was called
	inFlight int
	// pending holds, with observed: server_metrics, the prompt tokens each
	// workload's successful requests had since the last scrape: the share
	// of this replica's part of the server's cached tokens it is credited
	// with. lastShares is the last non-empty set, for hits counted while
	// only requests sent before were in flight; carried holds hits no
	// share could take yet.
	pending    map[string]serverShare
	lastShares map[string]serverShare
	carried    float64
	// window holds, with an engine that also counts its prompt tokens, its
	// last serverShareReads reads: what the engine counted, what this
	// replica finished, and what it was credited.
	window []serverRead
	// preamble: tokens every prompt gets from the cache on this target.
	preamble preamble
}

// New returns the step in front of next.
func New(next Counter) *Truth {
	return &Truth{next: next, targets: map[string]*targetState{}}
}

// SetTarget says where a target's observed cached tokens come from. A new
// or changed target starts over: its scrape shares, its preamble, and the
// advice about unreported cached tokens, which may be given again; its
// requests in flight are still in flight.
func (t *Truth) SetTarget(target string, dialect engine.Dialect, observed engine.Observed) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.targets[target]
	if old != nil && old.dialect == dialect && old.observed == observed {
		return
	}
	st := &targetState{dialect: dialect, observed: observed}
	if old != nil {
		st.inFlight = old.inFlight
	}
	t.targets[target] = st
	// Under the lock, so that a preamble learned meanwhile is not undone.
	t.next.SetPreamble(target, 0)
}

// ForgetTarget drops what was kept of a removed target.
func (t *Truth) ForgetTarget(target string) {
	t.mu.Lock()
	delete(t.targets, target)
	t.mu.Unlock()
}

// Sent implements replay.Observer.
func (t *Truth) Sent(workload, target string, scheduled, sent time.Time) {
	t.mu.Lock()
	if st := t.targets[target]; st != nil {
		st.inFlight++
	}
	t.mu.Unlock()
	t.next.Sent(workload, target, scheduled, sent)
}

// Finished implements replay.Observer: it fills r.Counted and forwards r.
func (t *Truth) Finished(r *replay.Result) {
	notify, dialect := t.judge(r)
	t.next.Finished(r)
	if notify {
		t.NotifyUnreported(r.Target, dialect)
	}
}

// Dropped implements replay.Observer.
func (t *Truth) Dropped(workload, target string, reason replay.DropReason, scheduled time.Time) {
	t.next.Dropped(workload, target, reason, scheduled)
}

// PassCompleted implements replay.Observer.
func (t *Truth) PassCompleted(workload, target string, pass int) {
	t.next.PassCompleted(workload, target, pass)
}

// judge fills r.Counted and keeps what r tells of its target; notify is
// whether NotifyUnreported is to hear of the target now, with its dialect.
func (t *Truth) judge(r *replay.Result) (notify bool, dialect engine.Dialect) {
	success := r.Outcome == openai.OutcomeSuccess
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.targets[r.Target]
	mode := engine.ObservedUsage
	if st != nil {
		mode, dialect = st.observed, st.dialect
		st.inFlight = max(st.inFlight-1, 0)
	}
	usageCached := r.CachedKnown && mode == engine.ObservedUsage
	r.Counted = replay.Counted{
		UsageCached: usageCached,
		// Both sides of the efficiency ratio must be known: the request's
		// cached tokens and its theoretical ones.
		Reported:   success && r.TheoreticalKnown && (usageCached || mode == engine.ObservedServerMetrics),
		Unreported: success && !usageCached && mode != engine.ObservedServerMetrics,
	}
	if st == nil {
		return false, dialect
	}
	if success && !usageCached && mode == engine.ObservedUsage && !st.notified {
		st.notified, notify = true, t.NotifyUnreported != nil
	}
	if r.Counted.Reported && usageCached {
		r.Counted.LeftOut = min(t.learnPreamble(st, r), r.CachedTokens, promptOf(r))
	}
	if success && mode == engine.ObservedServerMetrics {
		st.addPending(r)
	}
	return notify, dialect
}

// learnPreamble learns the target's preamble from r, a request whose
// cached tokens are observed, and returns it; t.mu is held.
func (t *Truth) learnPreamble(st *targetState, r *replay.Result) int {
	before := st.preamble.tokens()
	if r.TheoreticalCachedTokens == 0 {
		st.preamble.observe(r.CachedTokens)
	}
	p := st.preamble.tokens()
	if p != before {
		t.next.SetPreamble(r.Target, p)
	}
	return p
}

// promptOf is r's prompt tokens in the engine's units where the response
// says them, else the trace's.
func promptOf(r *replay.Result) int {
	if r.PromptKnown {
		return r.PromptTokens
	}
	return r.TraceInputLength
}
