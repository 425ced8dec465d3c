// Package collector turns what the replayer measures into the Prometheus
// metrics of the contract (docs/contract.md in the shared docs).
package collector

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

const namespace = "kvload"

// LatencyBuckets are the classic buckets of every latency histogram: 1 ms to
// 10 min, dense where TTFT and inter-token latency usually fall. The native
// representation is exported beside them.
var LatencyBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600,
}

// Collector implements replay.Observer with the contract's metrics.
type Collector struct {
	requests          *prometheus.CounterVec
	dropped           *prometheus.CounterVec
	inFlight          *prometheus.GaugeVec
	lag               *prometheus.HistogramVec
	ttft              *prometheus.HistogramVec
	itl               *prometheus.HistogramVec
	duration          *prometheus.HistogramVec
	promptTokens      *prometheus.CounterVec
	tracePromptTokens *prometheus.CounterVec
	completionTokens  *prometheus.CounterVec
	cachedTokens      *prometheus.CounterVec
	theoreticalTokens *prometheus.CounterVec
	loops             *prometheus.CounterVec
	targetInfo        *prometheus.GaugeVec
	reloadOK          prometheus.Gauge
	reloadTime        prometheus.Gauge

	now        func() time.Time
	mu         sync.Mutex
	passesDone map[string]int // workload → passes counted in trace_loops_total
	recent     map[wtKey]*recent
	observed   map[string]string // target → usage | server_metrics | none
	// pending holds, per server_metrics target, the prompt tokens each
	// workload sent since the last scrape: the share of the server's cached
	// tokens it is credited with.
	pending map[string]map[string]float64
}

var _ replay.Observer = (*Collector)(nil)

// New creates the metrics and registers them with reg.
func New(reg prometheus.Registerer) *Collector {
	wt := []string{"workload", "target"}
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, append(append([]string{}, wt...), extra...))
	}
	histogram := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:                       namespace,
			Name:                            name,
			Help:                            help,
			Buckets:                         LatencyBuckets,
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  160,
			NativeHistogramMinResetDuration: time.Hour,
		}, wt)
	}
	c := &Collector{
		requests:          counter("requests_total", "Finished requests by outcome.", "outcome"),
		dropped:           counter("requests_dropped_total", "Requests the schedule called for but that were never sent, by reason.", "reason"),
		inFlight:          prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "requests_in_flight", Help: "Requests sent and not yet finished."}, wt),
		lag:               histogram("schedule_lag_seconds", "Actual send time minus the time the trace scheduled."),
		ttft:              histogram("time_to_first_token_seconds", "Time from send to the first chunk carrying content, reasoning or tool-call text (successful requests)."),
		itl:               histogram("inter_token_latency_seconds", "Per request, (latency - TTFT) / (output tokens - 1) (successful requests with at least two output tokens)."),
		duration:          histogram("request_duration_seconds", "Time from send to the last content chunk (successful requests)."),
		promptTokens:      counter("prompt_tokens_total", "Prompt tokens the server reported for successful requests."),
		tracePromptTokens: counter("trace_prompt_tokens_total", "The trace's input_length of the same successful requests."),
		completionTokens:  counter("completion_tokens_total", "Output tokens of successful requests (server usage, else counted chunks)."),
		cachedTokens:      counter("cached_prompt_tokens_total", "Cached prompt tokens the server reported (usage or server metrics)."),
		theoreticalTokens: counter("theoretical_cached_prompt_tokens_total", "Prompt tokens an ideal prefix cache would have served for the same requests."),
		loops:             prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "trace_loops_total", Help: "Completed passes over the trace."}, []string{"workload"}),
		targetInfo:        prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "target_info", Help: "Configured targets; always 1."}, []string{"target", "model", "api", "dialect"}),
		reloadOK:          prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "config_last_reload_successful", Help: "Whether the last configuration reload succeeded (1) or failed (0)."}),
		reloadTime:        prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "config_last_reload_success_timestamp_seconds", Help: "Time of the last successful configuration reload."}),
		now:               time.Now,
		passesDone:        map[string]int{},
		recent:            map[wtKey]*recent{},
		observed:          map[string]string{},
		pending:           map[string]map[string]float64{},
	}
	reg.MustRegister(c.requests, c.dropped, c.inFlight, c.lag, c.ttft, c.itl, c.duration,
		c.promptTokens, c.tracePromptTokens, c.completionTokens, c.cachedTokens, c.theoreticalTokens,
		c.loops, c.targetInfo, c.reloadOK, c.reloadTime)
	return c
}

// Start creates the series of a (workload, target) at zero, so that rates
// and ratios exist before the first request finishes.
func (c *Collector) Start(workload, target string) {
	for _, o := range replay.Outcomes {
		c.requests.WithLabelValues(workload, target, string(o))
	}
	c.dropped.WithLabelValues(workload, target, replay.DropMaxInFlight)
	c.inFlight.WithLabelValues(workload, target)
	for _, v := range []*prometheus.CounterVec{c.promptTokens, c.tracePromptTokens, c.completionTokens, c.cachedTokens, c.theoreticalTokens} {
		v.WithLabelValues(workload, target)
	}
	c.loops.WithLabelValues(workload)
}

// Forget deletes every series of a (workload, target) that was removed or
// changed by a reload.
func (c *Collector) Forget(workload, target string) {
	l := prometheus.Labels{"workload": workload, "target": target}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{c.requests, c.dropped, c.inFlight, c.lag, c.ttft, c.itl, c.duration,
		c.promptTokens, c.tracePromptTokens, c.completionTokens, c.cachedTokens, c.theoreticalTokens} {
		v.DeletePartialMatch(l)
	}
	c.mu.Lock()
	delete(c.recent, wtKey{workload, target})
	c.mu.Unlock()
}

// ForgetWorkload deletes the per-workload series of a removed workload.
func (c *Collector) ForgetWorkload(workload string) {
	c.loops.DeleteLabelValues(workload)
	c.mu.Lock()
	delete(c.passesDone, workload)
	c.mu.Unlock()
}

// SetTarget publishes a target's info series, replacing an older one, and
// says where its observed cached tokens come from: "usage" (each response),
// "server_metrics" (AddServerCached) or "none".
func (c *Collector) SetTarget(target, model, api, dialect, observed string) {
	c.targetInfo.DeletePartialMatch(prometheus.Labels{"target": target})
	c.targetInfo.WithLabelValues(target, model, api, dialect).Set(1)
	c.mu.Lock()
	c.observed[target] = observed
	c.mu.Unlock()
}

// ForgetTarget deletes a removed target's info series.
func (c *Collector) ForgetTarget(target string) {
	c.targetInfo.DeletePartialMatch(prometheus.Labels{"target": target})
	c.mu.Lock()
	delete(c.observed, target)
	delete(c.pending, target)
	c.mu.Unlock()
}

// AddServerCached credits the increase of a target's own cached-token
// counter to the workloads that sent it prompts since the last call, in
// proportion to the prompt tokens each sent. Hits while this exporter sent
// nothing came from other traffic and are not counted.
func (c *Collector) AddServerCached(target string, delta float64) {
	c.mu.Lock()
	shares := c.pending[target]
	delete(c.pending, target)
	c.mu.Unlock()
	var total float64
	for _, p := range shares {
		total += p
	}
	if delta <= 0 || total == 0 {
		return
	}
	for w, p := range shares {
		c.cachedTokens.WithLabelValues(w, target).Add(delta * p / total)
	}
}

// ReloadDone records the outcome of a configuration (re)load.
func (c *Collector) ReloadDone(ok bool, at time.Time) {
	if !ok {
		c.reloadOK.Set(0)
		return
	}
	c.reloadOK.Set(1)
	c.reloadTime.Set(float64(at.UnixNano()) / 1e9)
}

// Sent implements replay.Observer.
func (c *Collector) Sent(workload, target string, scheduled, sent time.Time) {
	c.inFlight.WithLabelValues(workload, target).Inc()
	c.lag.WithLabelValues(workload, target).Observe(sent.Sub(scheduled).Seconds())
}

// Finished implements replay.Observer. Latencies and token counts come from
// successful requests only, as in AIPerf: a failed request has no TTFT.
func (c *Collector) Finished(r *replay.Result) {
	w, t := r.Workload, r.Target
	c.inFlight.WithLabelValues(w, t).Dec()
	c.requests.WithLabelValues(w, t, string(r.Outcome)).Inc()
	success := r.Outcome == replay.OutcomeSuccess

	// One lock for the live summary and the server-metrics shares.
	c.mu.Lock()
	mode := c.observed[t]
	usageCached := r.CachedKnown && (mode == "usage" || mode == "")
	c.recordLocked(r, usageCached)
	if success && mode == "server_metrics" {
		if c.pending[t] == nil {
			c.pending[t] = map[string]float64{}
		}
		c.pending[t][w] += float64(r.TraceInputLength)
	}
	c.mu.Unlock()

	if !success {
		return
	}
	if d, ok := r.TTFT(); ok {
		c.ttft.WithLabelValues(w, t).Observe(d.Seconds())
	}
	if d, ok := r.ITL(); ok {
		c.itl.WithLabelValues(w, t).Observe(d.Seconds())
	}
	if d, ok := r.Latency(); ok {
		c.duration.WithLabelValues(w, t).Observe(d.Seconds())
	}
	if r.PromptKnown {
		c.promptTokens.WithLabelValues(w, t).Add(float64(r.PromptTokens))
	}
	c.tracePromptTokens.WithLabelValues(w, t).Add(float64(r.TraceInputLength))
	c.completionTokens.WithLabelValues(w, t).Add(float64(r.OutputTokens))
	if usageCached {
		c.cachedTokens.WithLabelValues(w, t).Add(float64(r.CachedTokens))
	}
	c.theoreticalTokens.WithLabelValues(w, t).Add(float64(r.TheoreticalCachedTokens))
}

// Dropped implements replay.Observer.
func (c *Collector) Dropped(workload, target, reason string, _ time.Time) {
	c.dropped.WithLabelValues(workload, target, reason).Inc()
}

// PassCompleted implements replay.Observer. Passes are counted per workload
// (passes are numbered from 0): each target replays the whole trace, and the
// first target to complete a pass counts it.
func (c *Collector) PassCompleted(workload, _ string, pass int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.passesDone[workload] <= pass {
		c.passesDone[workload]++
		c.loops.WithLabelValues(workload).Inc()
	}
}
