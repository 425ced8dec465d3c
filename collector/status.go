package collector

import (
	"slices"
	"sort"
	"time"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// The landing page shows a live summary per (workload, target) computed
// from the last statusWindow finished requests no older than statusAge.
const (
	statusWindow = 1024
	statusAge    = time.Minute
)

// recent is a ring of the last finished requests of one (workload, target).
type recent struct {
	samples [statusWindow]sample
	n, next int
	since   time.Time // first sample
}

type sample struct {
	at          time.Time
	success     bool
	ttft        time.Duration // 0 when unknown
	reported    bool          // cached and theoretical tokens both known
	prompt      int           // server prompt tokens, when reported
	cached      int
	trace       int
	theoretical int // -1 when unknown
}

func (r *recent) add(s sample) {
	if r.n == 0 {
		r.since = s.at
	}
	r.samples[r.next] = s
	r.next = (r.next + 1) % statusWindow
	r.n = min(r.n+1, statusWindow)
}

// Status is the live summary of one (workload, target).
type Status struct {
	Workload, Target string
	RequestsPerSec   float64 // finished requests per second over the window
	ErrorRatio       float64
	TTFTP50, TTFTP99 time.Duration // 0 when no successful request
	// ObservedHitRate is cached / server prompt tokens of the requests
	// that reported their cached tokens; Reported is false when none did.
	ObservedHitRate float64
	Reported        bool
	TheoreticalRate float64 // theoretical cached / trace prompt tokens
	// Efficiency is ObservedHitRate over the theoretical rate of the same
	// reporting requests; 0 when not Reported or nothing could hit.
	Efficiency float64
	Window     time.Duration // span the figures cover
}

type wtKey struct{ workload, target string }

// recordLocked adds a finished request to the live summary; c.mu is held.
// usageCached tells whether the response's cached tokens count as observed
// for its target (not with observed: server_metrics or none); reported,
// whether the request counts on both sides of the efficiency ratio.
func (c *Collector) recordLocked(r *replay.Result, usageCached, reported bool, preamble int) {
	s := sample{at: c.now(), success: r.Outcome == replay.OutcomeSuccess, theoretical: -1}
	if s.success {
		if d, ok := r.TTFT(); ok {
			s.ttft = d
		}
		s.reported = reported && usageCached
		if s.reported {
			s.prompt, s.cached = r.TraceInputLength, r.CachedTokens
			if r.PromptKnown {
				s.prompt = r.PromptTokens
			}
			// As in the counters: the preamble's hit is on neither side.
			skip := min(preamble, s.cached, s.prompt)
			s.prompt, s.cached = s.prompt-skip, s.cached-skip
		}
		s.trace = r.TraceInputLength
		if r.TheoreticalKnown {
			s.theoretical = r.TheoreticalCachedTokens
		}
	}
	k := wtKey{r.Workload, r.Target}
	w := c.recent[k]
	if w == nil {
		w = &recent{}
		c.recent[k] = w
	}
	w.add(s)
}

// Status returns the live summaries, sorted by workload then target.
func (c *Collector) Status() []Status {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Status, 0, len(c.recent))
	for k, w := range c.recent {
		st := Status{Workload: k.workload, Target: k.target}
		var ttfts []time.Duration
		var n, failed, prompt, cached, trace, theo, repTrace, repTheo int
		oldest := now
		for i := 0; i < w.n; i++ {
			s := w.samples[i]
			if now.Sub(s.at) > statusAge {
				continue
			}
			n++
			if s.at.Before(oldest) {
				oldest = s.at
			}
			if !s.success {
				failed++
				continue
			}
			if s.ttft > 0 {
				ttfts = append(ttfts, s.ttft)
			}
			if s.theoretical >= 0 {
				trace += s.trace
				theo += s.theoretical
			}
			if s.reported {
				prompt += s.prompt
				cached += s.cached
				repTrace += s.trace
				repTheo += s.theoretical
			}
		}
		if n > 0 {
			// The figures cover the last minute, or less when the ring is
			// full or the pair is younger than that.
			start := now.Add(-statusAge)
			if w.since.After(start) {
				start = w.since
			}
			if w.n == statusWindow && oldest.After(start) {
				start = oldest
			}
			st.Window = max(now.Sub(start), time.Second)
			st.RequestsPerSec = float64(n) / st.Window.Seconds()
			st.ErrorRatio = float64(failed) / float64(n)
		}
		if len(ttfts) > 0 {
			slices.Sort(ttfts)
			st.TTFTP50 = nearestRank(ttfts, 50)
			st.TTFTP99 = nearestRank(ttfts, 99)
		}
		if prompt > 0 {
			st.Reported = true
			st.ObservedHitRate = float64(cached) / float64(prompt)
			if repTheo > 0 {
				st.Efficiency = st.ObservedHitRate / (float64(repTheo) / float64(repTrace))
			}
		}
		if trace > 0 {
			st.TheoreticalRate = float64(theo) / float64(trace)
		}
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

// nearestRank is the p-th percentile of sorted by the nearest-rank method.
func nearestRank(sorted []time.Duration, p int) time.Duration {
	i := (p*len(sorted)+99)/100 - 1
	return sorted[max(i, 0)]
}
