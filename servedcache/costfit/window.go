package costfit

import (
	"slices"
	"sync"
	"time"
)

// Timing names the time a fit was made on.
type Timing string

// The timings a fit uses.
const (
	// TimingPrefill is the engine's own prefill time, which excludes its
	// queue (llama.cpp's timings.prompt_ms, vLLM's per-request metrics).
	TimingPrefill Timing = "prefill"
	// TimingTTFT is the time to first token the exporter measured, queue
	// included.
	TimingTTFT Timing = "ttft"
)

// Observation is one successful request as the window keeps it.
type Observation struct {
	Sent             time.Time // the fit takes requests in send order
	At               time.Time // when it finished: when it leaves the window
	Uncached, Cached int       // theoretical prompt tokens
	TTFT             time.Duration
	// Prefill is the engine's prefill time, where PrefillKnown.
	Prefill      time.Duration
	PrefillKnown bool
}

// Result is a window's estimate and the timing it rests on.
type Result struct {
	Estimate
	Timing Timing
}

// Window keeps the observations of one (workload, target) of the last
// span, at most limit of them, and fits them on demand. It is safe for
// concurrent use: Add is cheap (the request path), Estimate does the work
// (a scrape) and reuses its last answer while nothing changed.
type Window struct {
	span  time.Duration
	limit int
	lim   Limits

	mu   sync.Mutex
	ring []Observation // oldest first from head, len ≤ limit
	head int
	// added counts Add calls: with the oldest observation's expiry it says
	// whether the cached result still holds.
	added      uint64
	cached     Result
	cachedAt   uint64
	cachedTill time.Time
	hasCached  bool
}

// NewWindow keeps the observations of the last span, at most limit, and
// fits them under lim.
func NewWindow(span time.Duration, limit int, lim Limits) *Window {
	return &Window{span: span, limit: max(limit, 1), lim: lim}
}

// Add records an observation. Observations are expected in the order they
// finish; one older than the window's span is still kept until it ages out.
func (w *Window) Add(o Observation) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.added++
	if len(w.ring) < w.limit {
		w.ring = append(w.ring, o)
		return
	}
	w.ring[w.head] = o
	w.head = (w.head + 1) % w.limit
}

// Estimate fits the observations that finished within the span before
// now. The engine's prefill time is used where at least MinRequests of
// them carry one (only those are fitted); otherwise every observation's
// TTFT.
func (w *Window) Estimate(now time.Time) Result {
	w.mu.Lock()
	if w.hasCached && w.cachedAt == w.added && now.Before(w.cachedTill) {
		r := w.cached
		w.mu.Unlock()
		return r
	}
	from := now.Add(-w.span)
	obs := make([]Observation, 0, len(w.ring))
	oldest := now
	for i := range w.ring {
		o := w.ring[(w.head+i)%len(w.ring)]
		if o.At.After(from) {
			obs = append(obs, o)
			oldest = minTime(oldest, o.At)
		}
	}
	added := w.added
	w.mu.Unlock()

	r := fitObservations(obs, w.lim)

	w.mu.Lock()
	defer w.mu.Unlock()
	if w.added == added {
		// Valid until the oldest observation leaves the span.
		w.cached, w.cachedAt, w.cachedTill, w.hasCached = r, added, oldest.Add(w.span), true
	}
	return r
}

func fitObservations(obs []Observation, lim Limits) Result {
	slices.SortStableFunc(obs, func(a, b Observation) int { return a.Sent.Compare(b.Sent) })
	timed := 0
	for _, o := range obs {
		if o.PrefillKnown {
			timed++
		}
	}
	timing := TimingTTFT
	if timed >= lim.MinRequests && timed > 0 {
		timing = TimingPrefill
	}
	samples := make([]Sample, 0, len(obs))
	for _, o := range obs {
		d := o.TTFT
		if timing == TimingPrefill {
			if !o.PrefillKnown {
				continue
			}
			d = o.Prefill
		}
		samples = append(samples, Sample{Uncached: float64(o.Uncached), Cached: float64(o.Cached), Seconds: d.Seconds()})
	}
	return Result{Estimate: Fit(samples, lim), Timing: timing}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
