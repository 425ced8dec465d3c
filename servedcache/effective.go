package servedcache

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// EffectiveCapacityState is what a (workload, target)'s effective capacity
// says: a label value of kvload_cache_effective_capacity_state.
type EffectiveCapacityState string

// Effective capacity states.
const (
	// EffectiveMeasured: an LRU cache of kvload_cache_effective_capacity_tokens
	// would have served what the engine served.
	EffectiveMeasured EffectiveCapacityState = "measured"
	// EffectiveAboveModel: the engine served more than an LRU cache as
	// large as the model's ceiling would have.
	EffectiveAboveModel EffectiveCapacityState = "above_model"
	// EffectiveNothingToShare: even at the ceiling the window's requests
	// share (almost) nothing, so the hits say nothing of the capacity.
	EffectiveNothingToShare EffectiveCapacityState = "nothing_to_share"
	// EffectiveNotReported: no request of the window counts on both sides
	// of the cache efficiency.
	EffectiveNotReported EffectiveCapacityState = "not_reported"
)

// EffectiveCapacityStates lists every state, for the state series.
var EffectiveCapacityStates = [...]EffectiveCapacityState{EffectiveMeasured, EffectiveAboveModel, EffectiveNothingToShare, EffectiveNotReported}

// The effective capacity is taken over a window of effectiveSlices
// sub-windows, a tenth of the target's estimate window each (DefaultWindow,
// 5 minutes, unless SetEstimateWindow said otherwise): a sub-window older
// than the window is reused for the present, so the window moves on in
// steps of a tenth of it and covers 90 to 100 % of it once the pair is that
// old.
const (
	effectiveSlices = 10
	// minSharedShare: below this share of the window's trace tokens even
	// at the ceiling, there is nothing to share.
	minSharedShare = 0.01
	// lowerBoundShare: an engine that served this share or more of what
	// the model's ceiling, or its configured or read capacity, would have
	// served is as good as any larger cache on this window: its figure is
	// the smallest cache that serves as much, a lower bound of its size,
	// not the size. Not 1: a healthy engine reads a few percent under the
	// ideal LRU (templates, chunked prefill, its own eviction order).
	lowerBoundShare = 0.9
)

// capacityGrid is where the theoretical hits are added up: capacities in
// tokens, effectiveGridPerDecade points a decade (7.5 % apart) from 16
// tokens to replay.MaxModelCeilingTokens. A request's hit at a grid
// capacity is exact; between two, the capacity is interpolated.
var capacityGrid = func() []float64 {
	var g []float64
	for i := 0; ; i++ {
		c := 16 * math.Pow(10, float64(i)/effectiveGridPerDecade)
		g = append(g, c)
		if c >= replay.MaxModelCeilingTokens {
			return g
		}
	}
}()

const effectiveGridPerDecade = 32

// gridIndex is the first grid point at or above capacity.
func gridIndex(capacity int64) int {
	return min(sort.SearchFloat64s(capacityGrid, float64(capacity)), len(capacityGrid)-1)
}

// EffectiveCapacity holds, per (workload, target), the sums the effective
// capacity is computed from (Figures). It only adds up what it is handed:
// each request's profile (replay.CapacityProfile) and observed cached
// tokens, decided by the cache-truth step.
type EffectiveCapacity struct {
	now func() time.Time

	mu    sync.Mutex
	pairs map[Pair]*effectiveSums
	// windows: each target's window, where set; DefaultWindow otherwise.
	windows map[string]time.Duration
}

// Pair is a (workload, target): what the per-request accounting is kept by.
type Pair struct{ Workload, Target string }

// effectiveSums is one pair's sub-windows.
type effectiveSums struct {
	slice  time.Duration // a sub-window's length
	since  time.Time     // when the pair started: the window covers no more
	slices [effectiveSlices]effectiveSlot
}

// effectiveSlot is one sub-window's sums over the requests that count on
// both sides of the cache efficiency and whose profile is known.
type effectiveSlot struct {
	epoch int64 // which slice of time it holds
	// hits[i] is theoretical hit tokens that a cache of capacityGrid[i]
	// tokens gains over one of capacityGrid[i-1]: the hit at capacity
	// capacityGrid[j] is the sum up to j.
	hits  []float64
	trace float64 // the trace's input_length of those requests
	// model: the theoretical hit tokens at the model's own capacity (the
	// one configured or read, or unbounded).
	model float64
	// The observed side: cached and prompt tokens, the preamble left out.
	cached, prompt float64
}

// EffectiveFigure is a pair's effective capacity now.
type EffectiveFigure struct {
	Tokens float64
	State  EffectiveCapacityState
	// Window is the time the figure covers.
	Window time.Duration
	// LowerBound: measured, but the engine served what the model's
	// ceiling or its capacity would have (lowerBoundShare), so a larger
	// cache would have served about as much: the engine holds at least
	// Tokens.
	LowerBound bool
}

// NewEffectiveCapacity holds no pair yet; now is the clock.
func NewEffectiveCapacity(now func() time.Time) *EffectiveCapacity {
	return &EffectiveCapacity{now: now, pairs: map[Pair]*effectiveSums{}, windows: map[string]time.Duration{}}
}

// Figures are every pair's effective capacity now.
func (e *EffectiveCapacity) Figures() map[Pair]EffectiveFigure {
	now := e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	figures := make(map[Pair]EffectiveFigure, len(e.pairs))
	for k, p := range e.pairs {
		figures[k] = p.figure(now)
	}
	return figures
}

// Start lists a pair from now on (not reported until a request counts).
func (e *EffectiveCapacity) Start(workload, target string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pairLocked(Pair{workload, target})
}

// Forget drops a pair.
func (e *EffectiveCapacity) Forget(workload, target string) {
	e.mu.Lock()
	delete(e.pairs, Pair{workload, target})
	e.mu.Unlock()
}

func (e *EffectiveCapacity) pairLocked(k Pair) *effectiveSums {
	p := e.pairs[k]
	if p == nil {
		window := e.windows[k.Target]
		if window <= 0 {
			window = DefaultWindow
		}
		p = &effectiveSums{slice: max(window/effectiveSlices, time.Millisecond), since: e.now()}
		e.pairs[k] = p
	}
	return p
}

// SetWindow sets target's window; its pairs start over when it changes.
func (e *EffectiveCapacity) SetWindow(target string, window time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.windows[target] == window {
		return
	}
	e.windows[target] = window
	for k := range e.pairs {
		if k.Target == target {
			delete(e.pairs, k)
			e.pairLocked(k)
		}
	}
}

// ForgetTarget drops a removed target's window.
func (e *EffectiveCapacity) ForgetTarget(target string) {
	e.mu.Lock()
	delete(e.windows, target)
	e.mu.Unlock()
}

// Add adds a finished request: its profile and, with observed: usage, its
// observed side. Only requests that count on both sides of the cache
// efficiency count, and of those, with observed: usage, only those whose
// profile is known (with server_metrics the credit of a read cannot be
// split by request, so the observed side takes every counted request).
func (e *EffectiveCapacity) Add(r *replay.Result) {
	if !r.Counted.Reported {
		return
	}
	known := r.TheoreticalByCapacity.Known
	if !known && r.Counted.UsageCached {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.pairLocked(Pair{r.Workload, r.Target}).slot(e.now())
	s.prompt += float64(promptOf(r) - r.Counted.LeftOut)
	if r.Counted.UsageCached {
		s.cached += float64(r.CachedTokens - r.Counted.LeftOut)
	}
	if !known {
		return
	}
	s.trace += float64(r.TraceInputLength)
	s.model += float64(r.TheoreticalCachedTokens)
	if s.hits == nil {
		s.hits = make([]float64, len(capacityGrid))
	}
	prev := 0
	for _, st := range r.TheoreticalByCapacity.Steps {
		s.hits[gridIndex(st.Capacity)] += float64(st.Tokens - prev)
		prev = st.Tokens
	}
}

// AddCredit adds the observed cached tokens of requests counted on both
// sides, read from the engine's counter (observed: server_metrics).
func (e *EffectiveCapacity) AddCredit(workload, target string, reportedCached float64) {
	if reportedCached <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pairLocked(Pair{workload, target}).slot(e.now()).cached += reportedCached
}

// Figure is a pair's effective capacity at now, for the landing page.
func (e *EffectiveCapacity) Figure(workload, target string, now time.Time) EffectiveFigure {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.pairs[Pair{workload, target}]
	if p == nil {
		return EffectiveFigure{State: EffectiveNotReported}
	}
	return p.figure(now)
}

func (p *effectiveSums) epochOf(t time.Time) int64 { return t.UnixNano() / int64(p.slice) }

// slot is the sub-window of at, emptied first when it held an older one.
func (p *effectiveSums) slot(at time.Time) *effectiveSlot {
	ep := p.epochOf(at)
	s := &p.slices[int(ep%effectiveSlices+effectiveSlices)%effectiveSlices]
	if s.epoch != ep {
		hits := s.hits
		clear(hits)
		*s = effectiveSlot{epoch: ep, hits: hits}
	}
	return s
}

// figure adds up the sub-windows of the window ending at now and inverts
// the theoretical hits: the smallest capacity whose hit reaches what the
// engine served, in the same proportion to the trace's tokens as the
// observed cached tokens are to the server's prompt tokens (the cache
// efficiency's two sides).
func (p *effectiveSums) figure(now time.Time) EffectiveFigure {
	cur := p.epochOf(now)
	start := time.Unix(0, (cur-effectiveSlices+1)*int64(p.slice))
	if p.since.After(start) {
		start = p.since
	}
	f := EffectiveFigure{State: EffectiveNotReported, Window: max(now.Sub(start), 0)}
	var sum effectiveSlot
	sum.hits = make([]float64, len(capacityGrid))
	for i := range p.slices {
		s := &p.slices[i]
		if s.epoch <= cur-effectiveSlices || s.epoch > cur {
			continue
		}
		sum.trace += s.trace
		sum.model += s.model
		sum.cached += s.cached
		sum.prompt += s.prompt
		for j, h := range s.hits {
			sum.hits[j] += h
		}
	}
	if sum.trace <= 0 || sum.prompt <= 0 {
		return f
	}
	for j := 1; j < len(sum.hits); j++ {
		sum.hits[j] += sum.hits[j-1]
	}
	total := sum.hits[len(sum.hits)-1]
	served := sum.cached / sum.prompt * sum.trace
	switch {
	case total < minSharedShare*sum.trace:
		f.State = EffectiveNothingToShare
	case served > total:
		f.State = EffectiveAboveModel
	default:
		f.State, f.Tokens = EffectiveMeasured, invertHits(sum.hits, served)
		f.LowerBound = served >= lowerBoundShare*min(total, sum.model)
	}
	return f
}

// invertHits is the capacity at which the cumulative hits H (H[j] at
// capacityGrid[j]) reach served, at most H's last: interpolated between
// grid points on a log scale of capacity, and linearly from 0 below the
// first.
func invertHits(h []float64, served float64) float64 {
	if served <= 0 {
		return 0
	}
	j := sort.SearchFloat64s(h, served)
	if j == 0 {
		return capacityGrid[0] * served / h[0]
	}
	lo, hi := h[j-1], h[j]
	if served == hi {
		return capacityGrid[j]
	}
	frac := (served - lo) / (hi - lo)
	return capacityGrid[j-1] * math.Pow(capacityGrid[j]/capacityGrid[j-1], frac)
}
