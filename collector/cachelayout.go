package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// CacheLayout is the collector's part for the re-reads of a target's KV
// cache layout at run time.
type CacheLayout struct {
	changes  *prometheus.CounterVec // by target
	failures *prometheus.CounterVec // by target and reason
}

func newCacheLayout() *CacheLayout {
	return &CacheLayout{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "target_cache_layout_changes_total",
			Help: "Changes of the KV cache layout read from a target at run time (capacity known after unknown, or other blocks or block size); the target's theoretical model follows each."},
			[]string{"target"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "target_cache_discovery_failures_total",
			Help: "Reads of a target's KV cache layout that failed, by reason: unreachable, timeout, bad_answer."},
			[]string{"target", "reason"}),
	}
}

func (l *CacheLayout) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.changes, l.failures}
}

// Watch creates at zero the counters of a target whose KV cache layout is
// read again at run time, so that their increase exists before the first
// change or failure.
func (l *CacheLayout) Watch(target string) {
	l.changes.WithLabelValues(target)
	for _, r := range engine.LayoutFailures {
		l.failures.WithLabelValues(target, string(r))
	}
}

// Unwatch deletes those counters of a target whose layout is no longer
// read (it is configured now).
func (l *CacheLayout) Unwatch(target string) {
	l.changes.DeleteLabelValues(target)
	l.failures.DeletePartialMatch(prometheus.Labels{"target": target})
}

// Changed counts a change of the layout read from target.
func (l *CacheLayout) Changed(target string) {
	l.changes.WithLabelValues(target).Inc()
}

// DiscoveryFailed counts a failed read of target's layout.
func (l *CacheLayout) DiscoveryFailed(target string, reason engine.LayoutFailure) {
	l.failures.WithLabelValues(target, string(reason)).Inc()
}
