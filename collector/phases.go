package collector

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// ConnectionKind tells a request's connection apart: dialled for it, or
// kept alive from an earlier one.
type ConnectionKind string

// The connection kinds: label values of kvload_http_connections_total.
const (
	ConnectionNew    ConnectionKind = "new"
	ConnectionReused ConnectionKind = "reused"
)

// httpPhases holds the series of the HTTP phases of each request and the
// connections they went out on.
type httpPhases struct {
	seconds     *prometheus.HistogramVec
	connections *prometheus.CounterVec
}

func newHTTPPhases() *httpPhases {
	wt := []string{"workload", "target"}
	return &httpPhases{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "http_phase_seconds",
			Help: "Time each HTTP phase of a request's last attempt took, every outcome: dns, connect, tls (those three on a new connection only), " +
				"write_request (connection to request written) and first_byte (request written to the answer's first byte, its headers).",
			Buckets:                         LagBuckets,
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  160,
			NativeHistogramMinResetDuration: time.Hour,
		}, append(wt, "phase")),
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "http_connections_total",
			Help:      "Requests by the connection their last attempt went out on: new (dialled for it) or reused (kept alive).",
		}, append(wt, "connection")),
	}
}

func (h *httpPhases) collectors() []prometheus.Collector {
	return []prometheus.Collector{h.seconds, h.connections}
}

func (h *httpPhases) start(w, t string) {
	for _, k := range connectionKinds {
		h.connections.WithLabelValues(w, t, string(k))
	}
}

func (h *httpPhases) forget(l prometheus.Labels) {
	h.seconds.DeletePartialMatch(l)
	h.connections.DeletePartialMatch(l)
}

// finished counts r's phases and connection, whatever its outcome: a
// failed request's connect and first byte are as telling as a success's.
// The series are s's, resolved once.
func (h *httpPhases) finished(s *pairSeries, r *replay.Result) {
	p := &r.Phases
	if !p.GotConn {
		return
	}
	kind := 0
	if p.Reused {
		kind = 1
	}
	s.counterBy(&s.connections[kind], h.connections, string(connectionKinds[kind])).Inc()
	for i, ph := range openai.Phases {
		if d, ok := p.Took(ph); ok {
			s.observerBy(&s.phases[i], h.seconds, ph.String()).Observe(d.Seconds())
		}
	}
}

// connectionKinds in the order of pairSeries.connections.
var connectionKinds = [...]ConnectionKind{ConnectionNew, ConnectionReused}
