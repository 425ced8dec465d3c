package collector

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// The landing page shows a live summary per (workload, target) computed
// from the last statusWindow finished requests no older than statusAge.
const (
	statusWindow = 1024
	statusAge    = time.Minute
)

// The health thresholds are the alerts' (dashboards/rules/kvload-alerts.yml),
// applied to the landing page's window instead of five minutes.
const (
	degradedErrorRatio = 0.05 // KvloadHighErrorRatio
	failingErrorRatio  = 0.5
	degradedLag        = time.Second // KvloadGeneratorBehind
	lowEfficiency      = 0.85        // KvloadCacheHitRegression
	minTheoretical     = 0.05        // below it, efficiency says little
	// aboveEfficiency is where observed exceeds theoretical by more than
	// noise: the model's cache is smaller than the server's.
	aboveEfficiency = 1.05
	// maxErrorLen bounds the last error shown: response bodies can be long.
	maxErrorLen = 300
)

// Health is the state of a (workload, target) on the landing page.
type Health string

// Health states.
const (
	HealthOK          Health = "ok"
	HealthDegraded    Health = "degraded"
	HealthFailing     Health = "failing"
	HealthNotReported Health = "not reported"
	// HealthRecovering is a pair whose window still holds enough failures
	// to read degraded or failing, but whose latest requests all succeeded,
	// too many of them in a row to be luck at the window's error ratio.
	HealthRecovering Health = "recovering"
)

// Healths lists every health state.
var Healths = []Health{HealthOK, HealthRecovering, HealthDegraded, HealthFailing, HealthNotReported}

// recoveredChance is the chance below which a run of successes is taken
// for a recovery rather than luck: at error ratio p, k successes in a row
// happen by chance with probability (1-p)^k.
const (
	recoveredChance = 0.001
	minRecoveredRun = 5
)

// recoveredRun is the run of successes that marks a recovery at error
// ratio p: the shortest whose chance under p is below recoveredChance.
func recoveredRun(p float64) int {
	if p >= 1 {
		return minRecoveredRun
	}
	return max(minRecoveredRun, int(math.Ceil(math.Log(recoveredChance)/math.Log(1-p))))
}

// EfficiencyState is what a (workload, target)'s cache efficiency says, on
// the landing page.
type EfficiencyState string

// Cache efficiency states.
const (
	EfficiencyOK          EfficiencyState = "ok"
	EfficiencyLow         EfficiencyState = "low"
	EfficiencyAbove       EfficiencyState = "above model"
	EfficiencyNotReported EfficiencyState = "not reported"
	EfficiencyNoSharing   EfficiencyState = "nothing to share"
	EfficiencyNoSuccess   EfficiencyState = "no success"
)

// recent is a ring of the last finished requests of one (workload, target).
type recent struct {
	samples [statusWindow]sample
	n, next int
	since   time.Time // first sample
	// The last failed request, kept beyond the window: it is what a user
	// looks for first.
	lastError   string
	lastErrorAt time.Time
	// drops are when scheduled requests were dropped, oldest first, at
	// most statusWindow of them: a generator that cannot keep up is
	// unhealthy even while what it does send succeeds.
	drops []time.Time
}

type sample struct {
	at          time.Time
	outcome     openai.Outcome
	lag         time.Duration // schedule lag
	success     bool
	ttft        time.Duration // 0 when unknown
	reported    bool          // cached and theoretical tokens both known
	prompt      int           // server prompt tokens, when reported
	cached      int
	trace       int
	theoretical int // -1 when unknown
}

func (r *recent) addSample(s sample) {
	if r.n == 0 {
		r.since = s.at
	}
	r.samples[r.next] = s
	r.next = (r.next + 1) % statusWindow
	r.n = min(r.n+1, statusWindow)
}

// addDrop records a dropped request at, forgetting drops older than
// statusAge and beyond statusWindow.
func (r *recent) addDrop(at time.Time) {
	i := 0
	for i < len(r.drops) && (at.Sub(r.drops[i]) > statusAge || len(r.drops)-i >= statusWindow) {
		i++
	}
	r.drops = append(r.drops[i:], at)
}

// OutcomeCount is how many requests of the window ended one way.
type OutcomeCount struct {
	Outcome string
	Count   int
}

// Status is the live summary of one (workload, target).
type Status struct {
	Workload, Target string
	Requests         int     // finished requests in the window
	RequestsPerSec   float64 // finished requests per second over the window
	ErrorRatio       float64
	// Outcomes counts the window's requests by outcome, every outcome
	// listed, in openai.Outcomes order.
	Outcomes []OutcomeCount
	// LastError is the reason of the last failed request (at most
	// maxErrorLen bytes), at LastErrorAt; empty when none failed yet.
	LastError   string
	LastErrorAt time.Time
	LagP99      time.Duration // schedule lag p99 of the window
	// Dropped is how many scheduled requests were dropped in the last
	// statusAge (at most statusWindow are remembered).
	Dropped          int
	TTFTP50, TTFTP99 time.Duration // 0 when no successful request
	// ObservedHitRate is cached / server prompt tokens of the requests
	// that reported their cached tokens; Reported is false when none did.
	ObservedHitRate float64
	Reported        bool
	TheoreticalRate float64 // theoretical cached / trace prompt tokens
	// TheoreticalKnown is false when no successful request had a
	// theoretical count: the rate is then no figure, not zero.
	TheoreticalKnown bool
	// Efficiency is ObservedHitRate over the theoretical rate of the same
	// reporting requests; 0 when not Reported or nothing could hit.
	Efficiency      float64
	EfficiencyState EfficiencyState
	// EffectiveCapacityTokens is the capacity of the LRU cache whose
	// theoretical hits equal the observed ones over its estimate window, when
	// EffectiveCapacityState is EffectiveMeasured; the window it covers
	// is EffectiveCapacityWindow.
	EffectiveCapacityTokens float64
	EffectiveCapacityState  EffectiveCapacityState
	EffectiveCapacityWindow time.Duration
	// EffectiveCapacityLowerBound: the engine served what the model's
	// ceiling or capacity would have, so EffectiveCapacityTokens is only
	// the least it holds.
	EffectiveCapacityLowerBound bool

	Window time.Duration // span the figures cover
	// HealthReason says why Health is what it is.
	Health       Health
	HealthReason string

	succeeded int // successful requests in the window
}

type wtKey struct{ workload, target string }

// recentLocked is the live summary of a pair, made if needed; c.mu is held.
func (c *Collector) recentLocked(workload, target string) *recent {
	k := wtKey{workload, target}
	w := c.recent[k]
	if w == nil {
		w = &recent{}
		c.recent[k] = w
	}
	return w
}

// add adds a request finished at at to the live summary. As in the
// counters, r.Counted says whether its cached tokens are known and count
// on the efficiency's sides, and what of them is left out.
func (r *recent) add(res *replay.Result, at time.Time) {
	s := sample{at: at, outcome: res.Outcome, lag: res.ScheduleLag(), success: res.Outcome == openai.OutcomeSuccess, theoretical: -1}
	if s.success {
		if d, ok := res.TTFT(); ok {
			s.ttft = d
		}
		s.reported = res.Counted.Reported && res.Counted.UsageCached
		if s.reported {
			// The preamble's hit is on neither side.
			s.prompt, s.cached = promptOf(res)-res.Counted.LeftOut, res.CachedTokens-res.Counted.LeftOut
		}
		s.trace = res.TraceInputLength
		if res.TheoreticalKnown {
			s.theoretical = res.TheoreticalCachedTokens
		}
	}
	r.addSample(s)
	if res.Outcome.IsError() {
		r.lastError, r.lastErrorAt = describeFailure(res), s.at
	}
}

// describeFailure is a failed request's outcome and reason, bounded.
func describeFailure(r *replay.Result) string {
	msg := string(r.Outcome)
	if r.HTTPStatus != 0 {
		msg += fmt.Sprintf(" (HTTP %d)", r.HTTPStatus)
	}
	if r.Error != "" {
		msg += ": " + r.Error
	}
	return truncate(msg, maxErrorLen)
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// Status returns the live summaries, sorted by workload then target.
func (c *Collector) Status() []Status {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Status, 0, len(c.recent))
	for k, w := range c.recent {
		st := w.status(k, now)
		f := c.effective.Figure(k.workload, k.target, now)
		st.EffectiveCapacityTokens, st.EffectiveCapacityState, st.EffectiveCapacityWindow = f.Tokens, f.State, f.Window
		st.EffectiveCapacityLowerBound = f.LowerBound
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Workload != out[j].Workload {
			return out[i].Workload < out[j].Workload
		}
		return out[i].Target < out[j].Target
	})
	return out
}

// tally adds up the samples of one pair within statusAge.
type tally struct {
	n, failed                                      int
	prompt, cached, trace, theo, repTrace, repTheo int
	ttfts, lags                                    []time.Duration
	byOutcome                                      map[openai.Outcome]int
	oldest                                         time.Time
	// run is how many of the newest requests succeeded in a row, the
	// first of them at runSince.
	run      int
	runSince time.Time
}

func (r *recent) tally(now time.Time) tally {
	t := tally{byOutcome: map[openai.Outcome]int{}, oldest: now}
	for i := 0; i < r.n; i++ {
		s := r.samples[i]
		if now.Sub(s.at) > statusAge {
			continue
		}
		t.n++
		t.byOutcome[s.outcome]++
		t.lags = append(t.lags, s.lag)
		if s.at.Before(t.oldest) {
			t.oldest = s.at
		}
		if !s.success {
			t.failed++
			continue
		}
		if s.ttft > 0 {
			t.ttfts = append(t.ttfts, s.ttft)
		}
		if s.theoretical >= 0 {
			t.trace += s.trace
			t.theo += s.theoretical
		}
		if s.reported {
			t.prompt += s.prompt
			t.cached += s.cached
			t.repTrace += s.trace
			t.repTheo += s.theoretical
		}
	}
	for i := 1; i <= r.n; i++ {
		s := r.samples[(r.next-i+statusWindow)%statusWindow]
		if !s.success || now.Sub(s.at) > statusAge {
			break
		}
		t.run, t.runSince = t.run+1, s.at
	}
	return t
}

// status is the live summary of one (workload, target) pair.
func (r *recent) status(k wtKey, now time.Time) Status {
	st := Status{Workload: k.workload, Target: k.target}
	t := r.tally(now)
	if t.n > 0 {
		// The figures cover the last minute, or less when the ring is
		// full or the pair is younger than that.
		start := now.Add(-statusAge)
		if r.since.After(start) {
			start = r.since
		}
		if r.n == statusWindow && t.oldest.After(start) {
			start = t.oldest
		}
		st.Window = max(now.Sub(start), time.Second)
		st.RequestsPerSec = float64(t.n) / st.Window.Seconds()
		st.ErrorRatio = float64(t.failed) / float64(t.n)
	}
	st.Requests, st.succeeded = t.n, t.n-t.failed
	for _, o := range openai.Outcomes {
		st.Outcomes = append(st.Outcomes, OutcomeCount{string(o), t.byOutcome[o]})
	}
	st.LastError, st.LastErrorAt = r.lastError, r.lastErrorAt
	for _, at := range r.drops {
		if now.Sub(at) <= statusAge {
			st.Dropped++
		}
	}
	if len(t.ttfts) > 0 {
		slices.Sort(t.ttfts)
		st.TTFTP50 = nearestRank(t.ttfts, 50)
		st.TTFTP99 = nearestRank(t.ttfts, 99)
	}
	if len(t.lags) > 0 {
		slices.Sort(t.lags)
		st.LagP99 = nearestRank(t.lags, 99)
	}
	var repTheoRate float64
	if t.prompt > 0 {
		st.Reported = true
		st.ObservedHitRate = float64(t.cached) / float64(t.prompt)
		if t.repTheo > 0 {
			repTheoRate = float64(t.repTheo) / float64(t.repTrace)
			st.Efficiency = st.ObservedHitRate / repTheoRate
		}
	}
	if t.trace > 0 {
		st.TheoreticalRate = float64(t.theo) / float64(t.trace)
		st.TheoreticalKnown = true
	}
	st.EfficiencyState = efficiencyState(st, repTheoRate)
	st.Health, st.HealthReason = health(st, t)
	return st
}

// efficiencyState judges the cache efficiency; repTheoRate is the
// theoretical hit rate of the requests that reported their cached tokens.
func efficiencyState(st Status, repTheoRate float64) EfficiencyState {
	switch {
	case !st.Reported && st.succeeded == 0:
		return EfficiencyNoSuccess // nothing could report
	case !st.Reported:
		return EfficiencyNotReported
	case repTheoRate < minTheoretical:
		return EfficiencyNoSharing
	case st.Efficiency < lowEfficiency:
		return EfficiencyLow
	case st.Efficiency > aboveEfficiency:
		return EfficiencyAbove
	}
	return EfficiencyOK
}

// health is the state of a (workload, target) and its reason, from the
// window's figures: the worst of errors, schedule lag and cache efficiency.
func health(st Status, t tally) (Health, string) {
	failed, byOutcome := t.failed, t.byOutcome
	recovering := "" // the reason, when the errors are behind the pair
	if st.Requests == 0 && st.Dropped > 0 {
		return HealthFailing, fmt.Sprintf("no request finished in the last %v, and %d scheduled requests were dropped", statusAge, st.Dropped)
	}
	if st.Requests == 0 {
		return HealthNotReported, fmt.Sprintf("no request finished in the last %v", statusAge)
	}
	if failed > 0 {
		// The most frequent failure names the problem.
		var worst openai.Outcome
		for _, o := range openai.Outcomes {
			if o != openai.OutcomeSuccess && byOutcome[o] > byOutcome[worst] {
				worst = o
			}
		}
		reason := fmt.Sprintf("%d of %d requests failed (%.1f%%), mostly %s", failed, st.Requests, 100*st.ErrorRatio, worst)
		switch {
		case st.ErrorRatio > degradedErrorRatio && t.run >= recoveredRun(st.ErrorRatio):
			// Judged on what else the window says, below.
			recovering = fmt.Sprintf("the last %d requests succeeded, since %s; the window still holds %s",
				t.run, t.runSince.UTC().Format("15:04:05 UTC"), reason)
		case st.ErrorRatio >= failingErrorRatio:
			return HealthFailing, reason
		case st.ErrorRatio > degradedErrorRatio:
			return HealthDegraded, reason
		}
	}
	var reasons []string
	if st.Dropped > 0 {
		// As KvloadGeneratorBehind: any drop means the schedule is not kept.
		reasons = append(reasons, fmt.Sprintf("%d scheduled requests dropped in the last %v: the target or max_in_flight cannot keep up", st.Dropped, statusAge))
	}
	if st.LagP99 > degradedLag {
		reasons = append(reasons, fmt.Sprintf("schedule lag p99 %d ms: the exporter falls behind the trace", st.LagP99.Milliseconds()))
	}
	if st.EfficiencyState == EfficiencyLow {
		reasons = append(reasons, fmt.Sprintf("the cache serves %.0f%% of what the trace allows", 100*st.Efficiency))
	}
	if len(reasons) > 0 {
		return HealthDegraded, strings.Join(reasons, "; ")
	}
	if recovering != "" {
		return HealthRecovering, recovering
	}
	if failed > 0 {
		return HealthOK, fmt.Sprintf("%d of %d requests failed, under the %.0f%% threshold", failed, st.Requests, 100*degradedErrorRatio)
	}
	return HealthOK, fmt.Sprintf("%d requests, none failed", st.Requests)
}

// nearestRank is the p-th percentile of sorted by the nearest-rank method.
func nearestRank(sorted []time.Duration, p int) time.Duration {
	i := (p*len(sorted)+99)/100 - 1
	return sorted[max(i, 0)]
}
