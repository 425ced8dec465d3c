package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/kvevents"
)

// KVEvents is the collector's part for a target's KV cache events: why
// the engine missed the hits the model counted, and the health of its
// event streams. It is the explainer's kvevents.Sink.
type KVEvents struct {
	tokens       *prometheus.CounterVec // by workload, target, class
	unclassified *prometheus.CounterVec // by workload, target, reason
	errors       *prometheus.CounterVec // by target, reason
	batches      *prometheus.CounterVec // by target
	streams      *prometheus.GaugeVec   // by target
	connected    *prometheus.GaugeVec   // by target
}

var _ kvevents.Sink = (*KVEvents)(nil)

func newKVEvents() *KVEvents {
	wt := []string{"workload", "target"}
	target := []string{"target"}
	return &KVEvents{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "cache_missed_hit_tokens_total",
			Help: "Prompt tokens the theoretical model counted as cached that the engine did not serve from its cache, by why, from the engine's KV cache events (cache.kv_events): evicted, never_stored, cleared, unexplained."},
			append(wt, "class")),
		unclassified: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "cache_missed_hit_unclassified_requests_total",
			Help: "Requests with missed hits that were not classified, by reason: no_stream (an event stream not followed at the send time), tokenize, queue_full, request_form, block_size."},
			append(wt, "reason")),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "kv_events_errors_total",
			Help: "Problems of a target's KV event streams, by reason: unreachable, disconnected, decode, too_large, gap (batches missed), restart (the sequence went back or jumped too far), unlinked (blocks stored after a parent never seen), overflow (blocks not kept), stalled (a publisher silent mid-message), replay (a gap the replay socket did not fill)."},
			append(target, "reason")),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "kv_events_batches_total",
			Help: "KV event batches received from a target's engines."}, target),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "kv_events_streams",
			Help: "KV event streams configured for a target (cache.kv_events)."}, target),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "kv_events_streams_connected",
			Help: "KV event streams of a target connected now."}, target),
	}
}

func (m *KVEvents) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.tokens, m.unclassified, m.errors, m.batches, m.streams, m.connected}
}

func (m *KVEvents) forget(l prometheus.Labels) {
	m.tokens.DeletePartialMatch(l)
	m.unclassified.DeletePartialMatch(l)
}

// Stop deletes a target's stream and miss series: it follows no stream
// any more.
func (m *KVEvents) Stop(target string) {
	l := prometheus.Labels{"target": target}
	for _, v := range []*prometheus.CounterVec{m.tokens, m.unclassified, m.errors, m.batches} {
		v.DeletePartialMatch(l)
	}
	m.streams.DeletePartialMatch(l)
	m.connected.DeletePartialMatch(l)
}

// StartMissedHits creates a (workload, target)'s miss counters at zero: its
// target follows KV event streams.
func (m *KVEvents) StartMissedHits(workload, target string) {
	for _, cl := range kvevents.Classes {
		m.tokens.WithLabelValues(workload, target, string(cl))
	}
	for _, r := range kvevents.UnclassifiedReasons {
		m.unclassified.WithLabelValues(workload, target, string(r))
	}
}

// Start creates a target's stream series: streams are followed.
func (m *KVEvents) Start(target string, streams int) {
	for _, r := range kvevents.ErrorReasons {
		m.errors.WithLabelValues(target, string(r))
	}
	m.batches.WithLabelValues(target)
	m.streams.WithLabelValues(target).Set(float64(streams))
	m.connected.WithLabelValues(target).Set(0)
}

// MissedHitTokens implements kvevents.Sink.
func (m *KVEvents) MissedHitTokens(workload, target string, class kvevents.Class, tokens int) {
	m.tokens.WithLabelValues(workload, target, string(class)).Add(float64(tokens))
}

// MissedHitUnclassified implements kvevents.Sink.
func (m *KVEvents) MissedHitUnclassified(workload, target string, reason kvevents.UnclassifiedReason) {
	m.unclassified.WithLabelValues(workload, target, string(reason)).Inc()
}

// Error counts n problems of a target's event streams.
func (m *KVEvents) Error(target string, reason kvevents.ErrorReason, n int) {
	m.errors.WithLabelValues(target, string(reason)).Add(float64(n))
}

// Batch counts a batch received.
func (m *KVEvents) Batch(target string) {
	m.batches.WithLabelValues(target).Inc()
}

// Connected adds delta (+1, -1) to a target's connected streams.
func (m *KVEvents) Connected(target string, delta int) {
	m.connected.WithLabelValues(target).Add(float64(delta))
}
