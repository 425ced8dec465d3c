package collector

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// ExemplarTraceID is the exemplar label that carries a request's trace id
// (the name Grafana links to a tracing data source by default).
const ExemplarTraceID = "trace_id"

// exemplarEvery: how often at most a classic bucket of a series takes a
// new exemplar. Each exemplar offered costs a label set, a timestamp and
// the trace id in hex, and a scrape shows only a bucket's last one: at
// 1,000 requests/s that was about 2 % of the daemon's CPU for exemplars no
// scrape saw. A bucket hit less often than this (the slow tail a user
// follows to its trace) still takes the trace of every request.
const exemplarEvery = time.Second

// exemplarGate says when each classic bucket of one histogram series is
// due an exemplar again. Its zero value is ready.
type exemplarGate struct {
	last [len(latencyBuckets) + 1]atomic.Int64 // Unix nanoseconds of each classic bucket's last exemplar, +Inf's included
}

// due tells whether an observation of v at now is the one to carry an
// exemplar, and if so claims the bucket until exemplarEvery has passed.
// A clock that went back claims it at once.
func (g *exemplarGate) due(v float64, now time.Time) bool {
	i := sort.SearchFloat64s(latencyBuckets[:], v) // len(latencyBuckets): +Inf, NaN included
	at := now.UnixNano()
	last := g.last[i].Load()
	if last != 0 && at >= last && at-last < int64(exemplarEvery) {
		return false
	}
	return g.last[i].CompareAndSwap(last, at)
}

// observeTraced observes v, with r's trace id as the exemplar where the
// request was sampled and gate finds v's bucket due one: only a sampled
// trace was recorded anywhere, by the exporter's span or the engine's own,
// so only it is worth a link.
func observeTraced(o prometheus.Observer, gate *exemplarGate, v float64, r *replay.Result, now time.Time) {
	if r.Trace.IsSampled() && gate.due(v, now) {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{ExemplarTraceID: r.Trace.TraceID().String()})
			return
		}
	}
	o.Observe(v)
}
