package collector

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/openai"
)

// pairSeries holds the per-request series of one (workload, target), each
// resolved on its first use and kept: looking a child up by its label
// values hashes and validates them, which was half of what the collector
// spent on a request. A child is created when it was before, on first
// use, so /metrics shows the same series. Forget drops the pair with the
// series it points at, so a pair started again resolves fresh ones.
type pairSeries struct {
	w, t string

	inFlight            atomic.Pointer[prometheus.Gauge]
	lag                 atomic.Pointer[prometheus.Observer]
	requests            [len(openai.Outcomes)]atomic.Pointer[prometheus.Counter]
	ttft, itl, duration atomic.Pointer[prometheus.Observer]
	inputLength         atomic.Pointer[prometheus.Observer]
	outputLength        atomic.Pointer[prometheus.Observer]
	promptTokens        atomic.Pointer[prometheus.Counter]
	tracePromptTokens   atomic.Pointer[prometheus.Counter]
	completionTokens    atomic.Pointer[prometheus.Counter]
	cachedTokens        atomic.Pointer[prometheus.Counter]
	unreported          atomic.Pointer[prometheus.Counter]
	theoreticalTokens   atomic.Pointer[prometheus.Counter]
	reportedPrompt      atomic.Pointer[prometheus.Counter]
	reportedCached      atomic.Pointer[prometheus.Counter]
	reportedTrace       atomic.Pointer[prometheus.Counter]
	reportedTheoretical atomic.Pointer[prometheus.Counter]
	classTTFT           [len(CacheClasses)]atomic.Pointer[prometheus.Observer]
	classTokens         [len(CacheClasses)]atomic.Pointer[prometheus.Counter]
	connections         [len(connectionKinds)]atomic.Pointer[prometheus.Counter]
	phases              [len(openai.Phases)]atomic.Pointer[prometheus.Observer]
	// When each bucket of the TTFT and duration series may take an
	// exemplar again.
	ttftExemplars, durationExemplars exemplarGate
}

// pair returns the series of (w, t).
func (c *Collector) pair(w, t string) *pairSeries {
	k := wtKey{w, t}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.pairs[k]
	if s == nil {
		s = &pairSeries{w: w, t: t}
		c.pairs[k] = s
	}
	return s
}

// resolved is *p, made by child on first use. Two goroutines resolving
// the same child at once is harmless: the vector hands both the same one.
func resolved[M any](p *atomic.Pointer[M], child func() M) M {
	if m := p.Load(); m != nil {
		return *m
	}
	m := child()
	p.Store(&m)
	return m
}

func (s *pairSeries) counter(p *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec) prometheus.Counter {
	return resolved(p, func() prometheus.Counter { return vec.WithLabelValues(s.w, s.t) })
}

func (s *pairSeries) counterBy(p *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec, label string) prometheus.Counter {
	return resolved(p, func() prometheus.Counter { return vec.WithLabelValues(s.w, s.t, label) })
}

func (s *pairSeries) observer(p *atomic.Pointer[prometheus.Observer], vec *prometheus.HistogramVec) prometheus.Observer {
	return resolved(p, func() prometheus.Observer { return vec.WithLabelValues(s.w, s.t) })
}

func (s *pairSeries) observerBy(p *atomic.Pointer[prometheus.Observer], vec *prometheus.HistogramVec, label string) prometheus.Observer {
	return resolved(p, func() prometheus.Observer { return vec.WithLabelValues(s.w, s.t, label) })
}

func (s *pairSeries) gauge(p *atomic.Pointer[prometheus.Gauge], vec *prometheus.GaugeVec) prometheus.Gauge {
	return resolved(p, func() prometheus.Gauge { return vec.WithLabelValues(s.w, s.t) })
}

// request is the requests_total child of outcome o.
func (s *pairSeries) request(vec *prometheus.CounterVec, o openai.Outcome) prometheus.Counter {
	for i, k := range openai.Outcomes {
		if k == o {
			return s.counterBy(&s.requests[i], vec, string(o))
		}
	}
	return vec.WithLabelValues(s.w, s.t, string(o)) // not one of openai.Outcomes: not expected
}

// class is the index of cl in CacheClasses; ok is false for another value.
func class(cl CacheClass) (i int, ok bool) {
	for i, k := range CacheClasses {
		if k == cl {
			return i, true
		}
	}
	return 0, false
}

// classTTFTOf and classTokensOf are the children of cache class cl.
func (s *pairSeries) classTTFTOf(vec *prometheus.HistogramVec, cl CacheClass) prometheus.Observer {
	if i, ok := class(cl); ok {
		return s.observerBy(&s.classTTFT[i], vec, string(cl))
	}
	return vec.WithLabelValues(s.w, s.t, string(cl))
}

func (s *pairSeries) classTokensOf(vec *prometheus.CounterVec, cl CacheClass) prometheus.Counter {
	if i, ok := class(cl); ok {
		return s.counterBy(&s.classTokens[i], vec, string(cl))
	}
	return vec.WithLabelValues(s.w, s.t, string(cl))
}
