package collector

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/servedcache"
	"github.com/kvload-exporter/kvload-exporter/servedcache/costfit"
)

// DefaultWindow is the estimates' window of a target not given one.
const DefaultWindow = servedcache.DefaultWindow

// costMetrics exports each (workload, target)'s cached-token cost fit
// (servedcache.CostWindows). The fit is
// made at scrape time, off the request path, and reused while no request
// finished and none aged out.
type costMetrics struct {
	c                                               *Collector // its clock
	ratio, stdErr, perUncached, state, requests, pf *prometheus.Desc
}

func newCostMetrics(c *Collector) *costMetrics {
	wt := []string{"workload", "target"}
	desc := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, append(append([]string{}, wt...), extra...), nil)
	}
	return &costMetrics{
		c: c,
		ratio: desc("cache_cached_token_cost_ratio",
			"What a prompt token an ideal cache would serve costs the target, over what a token it must compute costs, fitted on the successful requests of the target's cache.estimate_window (5 minutes unless set; at most 512 requests): near 0 when the cache works, near 1 when it does not. Absent unless the fit's state is decided."),
		stdErr: desc("cache_cached_token_cost_ratio_stderr",
			"Standard error of kvload_cache_cached_token_cost_ratio; absent where the cost of an uncached token is not established."),
		perUncached: desc("cache_uncached_token_cost_seconds",
			"Fitted seconds of prefill (or TTFT) per prompt token an ideal cache would not serve; absent where not established."),
		state: desc("cache_cost_fit_state",
			"1 for the state of the cached-token cost fit, 0 for the others: decided, too_few_requests, too_little_spread, no_uncached_cost (the time is mostly something else, such as a queue), too_uncertain.", "state"),
		requests: desc("cache_cost_fit_requests",
			"Requests the cached-token cost fit rests on: successful, with a known theoretical side, in its window (only those timed by the engine, where its prefill time is used)."),
		pf: desc("cache_cost_fit_prefill_timed",
			"1 when the cached-token cost fit uses the engine's own prefill time, its queue left out (llama.cpp's timings.prompt_ms, vLLM's per-request metrics), 0 when it uses TTFT."),
	}
}

// ValueType says what the series made at scrape time are, which a registry
// cannot tell while there are none.
func (m *costMetrics) ValueType() prometheus.ValueType { return prometheus.GaugeValue }

// Describe implements prometheus.Collector.
func (m *costMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.ratio, m.stdErr, m.perUncached, m.state, m.requests, m.pf} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one fit per (workload, target).
func (m *costMetrics) Collect(ch chan<- prometheus.Metric) {
	for k, r := range m.c.costs.Estimates(m.c.now()) {
		gauge := func(d *prometheus.Desc, v float64, extra ...string) {
			if !math.IsNaN(v) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{k.Workload, k.Target}, extra...)...)
			}
		}
		for _, s := range costfit.States {
			gauge(m.state, boolValue(s == r.State), string(s))
		}
		gauge(m.requests, float64(r.Requests))
		gauge(m.pf, boolValue(r.Timing == costfit.TimingPrefill))
		gauge(m.ratio, r.Ratio)
		gauge(m.stdErr, r.RatioStdErr)
		if !math.IsNaN(r.RatioStdErr) {
			gauge(m.perUncached, r.PerUncached)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// SetEstimateWindow sets how far back target's estimates look: the cost
// fit and the effective capacity. A changed window starts them over.
func (c *Collector) SetEstimateWindow(target string, span time.Duration) {
	c.effective.SetWindow(target, span)
	c.costs.SetWindow(target, span)
}
