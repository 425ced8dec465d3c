package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// ExemplarTraceID is the exemplar label that carries a request's trace id
// (the name Grafana links to a tracing data source by default).
const ExemplarTraceID = "trace_id"

// observeTraced observes v, with r's trace id as the exemplar where the
// request was sampled: only a sampled trace was recorded anywhere, by the
// exporter's span or the engine's own, so only it is worth a link.
func observeTraced(o prometheus.Observer, v float64, r *replay.Result) {
	if r.Trace.IsSampled() {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{ExemplarTraceID: r.Trace.TraceID().String()})
			return
		}
	}
	o.Observe(v)
}
