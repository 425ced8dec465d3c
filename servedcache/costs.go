package servedcache

import (
	"sync"
	"time"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/servedcache/costfit"
)

// The cost of a cached prompt token is fitted per (workload, target) over
// the successful requests of its target's estimate window (DefaultWindow
// unless SetWindow said otherwise), at most costRequests of them.
const costRequests = 512

// DefaultWindow is the estimates' window of a target not given one: the
// cost fit's and the effective capacity's.
const DefaultWindow = 5 * time.Minute

// CostWindows holds each (workload, target)'s window of requests for the
// cached-token cost fit (package costfit). The fit itself is made by
// Estimates, off the request path.
type CostWindows struct {
	mu    sync.Mutex
	pairs map[Pair]*costfit.Window
	// windows: each target's span, where set.
	windows map[string]time.Duration
}

// NewCostWindows holds no pair yet.
func NewCostWindows() *CostWindows {
	return &CostWindows{pairs: map[Pair]*costfit.Window{}, windows: map[string]time.Duration{}}
}

// Start lists a pair from now on, its fit undecided until requests come.
func (c *CostWindows) Start(workload, target string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := (Pair{workload, target}); c.pairs[k] == nil {
		c.pairs[k] = c.newWindowLocked(target)
	}
}

// Forget drops a pair.
func (c *CostWindows) Forget(workload, target string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pairs, Pair{workload, target})
}

// ForgetTarget drops a removed target's span.
func (c *CostWindows) ForgetTarget(target string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.windows, target)
}

// SetWindow sets how far back target's fits look; a changed span starts
// its pairs over.
func (c *CostWindows) SetWindow(target string, span time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.windows[target] == span {
		return
	}
	c.windows[target] = span
	for k := range c.pairs {
		if k.Target == target {
			c.pairs[k] = c.newWindowLocked(target)
		}
	}
}

// Add gives a request finished at at to its pair's window.
func (c *CostWindows) Add(r *replay.Result, at time.Time) {
	o, ok := costObservation(r, at)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := Pair{r.Workload, r.Target}
	w := c.pairs[k]
	if w == nil {
		w = c.newWindowLocked(r.Target)
		c.pairs[k] = w
	}
	w.Add(o)
}

// Estimates fits every pair's window ending at now, outside the lock: a
// window reuses its last fit while no request came and none aged out.
func (c *CostWindows) Estimates(now time.Time) map[Pair]costfit.Result {
	c.mu.Lock()
	windows := make(map[Pair]*costfit.Window, len(c.pairs))
	for k, w := range c.pairs {
		windows[k] = w
	}
	c.mu.Unlock()
	out := make(map[Pair]costfit.Result, len(windows))
	for k, w := range windows {
		out[k] = w.Estimate(now)
	}
	return out
}

// newWindowLocked is a fit window of target's span; c.mu is held.
func (c *CostWindows) newWindowLocked(target string) *costfit.Window {
	span := c.windows[target]
	if span <= 0 {
		span = DefaultWindow
	}
	return costfit.NewWindow(span, costRequests, costfit.DefaultLimits)
}

// costObservation is what the cost fit keeps of a finished request; ok is
// false for one it cannot use: failed, without a theoretical side, or
// without a first token.
func costObservation(r *replay.Result, at time.Time) (costfit.Observation, bool) {
	if r.Outcome != openai.OutcomeSuccess || !r.TheoreticalKnown {
		return costfit.Observation{}, false
	}
	ttft, ok := r.TTFT()
	if !ok {
		return costfit.Observation{}, false
	}
	return costfit.Observation{
		Sent:     r.Sent,
		At:       at,
		Uncached: max(r.TraceInputLength-r.TheoreticalCachedTokens, 0),
		Cached:   r.TheoreticalCachedTokens,
		TTFT:     ttft,
		Prefill:  r.PrefillTime, PrefillKnown: r.PrefillKnown,
	}, true
}
