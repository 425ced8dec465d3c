package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/servedcache"
)

// EffectiveCapacityState is a label value of
// kvload_cache_effective_capacity_state, as the landing page reads it.
type EffectiveCapacityState = servedcache.EffectiveCapacityState

// The effective capacity states (servedcache.EffectiveCapacityStates).
const (
	EffectiveMeasured       = servedcache.EffectiveMeasured
	EffectiveAboveModel     = servedcache.EffectiveAboveModel
	EffectiveNothingToShare = servedcache.EffectiveNothingToShare
	EffectiveNotReported    = servedcache.EffectiveNotReported
)

// EffectiveCapacityStates lists every state, for the state series.
var EffectiveCapacityStates = servedcache.EffectiveCapacityStates

// effectiveMetrics exports each (workload, target)'s effective capacity,
// which servedcache.EffectiveCapacity works out at each scrape.
type effectiveMetrics struct {
	capacity *servedcache.EffectiveCapacity

	tokens, state, window, lowerBound *prometheus.Desc
}

func newEffectiveMetrics(capacity *servedcache.EffectiveCapacity) *effectiveMetrics {
	wt := []string{"workload", "target"}
	return &effectiveMetrics{
		capacity: capacity,
		tokens: prometheus.NewDesc(namespace+"_cache_effective_capacity_tokens",
			"The capacity, in tokens, of the LRU prefix cache whose theoretical hits over the window equal the observed cached tokens (requests counted on both sides of the cache efficiency); present only in the state measured.", wt, nil),
		state: prometheus.NewDesc(namespace+"_cache_effective_capacity_state",
			"1 for the effective capacity's state: measured, above_model (the engine served more than a cache at the model's ceiling would have), nothing_to_share (the requests share almost nothing at any capacity), not_reported (no request counted).", append(wt, "state"), nil),
		lowerBound: prometheus.NewDesc(namespace+"_cache_effective_capacity_lower_bound",
			"1 when kvload_cache_effective_capacity_tokens is only a lower bound: the engine served 90 % or more of what a cache at the model's ceiling, or at its configured or read capacity, would have, so a larger cache would have served about as much; 0 when the figure is the size. Present with the capacity.", wt, nil),
		window: prometheus.NewDesc(namespace+"_cache_effective_capacity_window_seconds",
			"The time the effective capacity's figures cover: the target's cache.estimate_window (5 minutes unless set) once the pair is that old, moving in steps of a tenth of it.", wt, nil),
	}
}

// ValueType says that every series of the collector is a gauge.
func (e *effectiveMetrics) ValueType() prometheus.ValueType { return prometheus.GaugeValue }

// Describe implements prometheus.Collector.
func (e *effectiveMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- e.tokens
	ch <- e.state
	ch <- e.window
	ch <- e.lowerBound
}

// Collect implements prometheus.Collector: the figures of the window
// ending now.
func (e *effectiveMetrics) Collect(ch chan<- prometheus.Metric) {
	for k, f := range e.capacity.Figures() {
		if f.State == servedcache.EffectiveMeasured {
			ch <- prometheus.MustNewConstMetric(e.tokens, prometheus.GaugeValue, f.Tokens, k.Workload, k.Target)
			ch <- prometheus.MustNewConstMetric(e.lowerBound, prometheus.GaugeValue, boolValue(f.LowerBound), k.Workload, k.Target)
		}
		for _, s := range servedcache.EffectiveCapacityStates {
			ch <- prometheus.MustNewConstMetric(e.state, prometheus.GaugeValue, boolValue(s == f.State), k.Workload, k.Target, string(s))
		}
		ch <- prometheus.MustNewConstMetric(e.window, prometheus.GaugeValue, f.Window.Seconds(), k.Workload, k.Target)
	}
}
