// Package collector turns what the replayer measures into the Prometheus
// metrics of the contract (docs/contract.md in the shared docs).
package collector

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/servedcache"
)

const namespace = "kvload"

// LatencyBuckets are the classic buckets of every latency histogram: 1 ms to
// 10 min, dense where TTFT and inter-token latency usually fall. The native
// representation is exported beside them.
var LatencyBuckets = latencyBuckets[:]

var latencyBuckets = [...]float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600,
}

// LagBuckets are the classic buckets of kvload_schedule_lag_seconds: those
// of LatencyBuckets with four more below 1 ms. A healthy dispatcher sends
// well under a millisecond late, which LatencyBuckets could not resolve;
// every bound of LatencyBuckets is kept, so queries naming one still work.
var LagBuckets = append([]float64{0.0001, 0.00025, 0.0005, 0.00075}, LatencyBuckets...)

// LengthBuckets are the classic buckets of the input and output length
// histograms, in tokens: powers of two from 16 to 256 Ki, which covers the
// longest rows a request holds.
var LengthBuckets = prometheus.ExponentialBuckets(16, 2, 15)

// Collector implements replay.Observer with the contract's metrics. It
// counts what it is given: how a result's cached tokens count
// (replay.Result.Counted) and the server's cached tokens credited to each
// workload come from the cache-truth step in front of it
// (servedcache.Truth), and the estimates it exports are worked out by
// package servedcache. The metrics of one concern that the daemon drives
// on their own are reached through small parts: KVEvents, Reconcile,
// ChatTemplate and CacheLayout.
type Collector struct {
	requests          *prometheus.CounterVec
	dropped           *prometheus.CounterVec
	inFlight          *prometheus.GaugeVec
	lag               *prometheus.HistogramVec
	ttft              *prometheus.HistogramVec
	itl               *prometheus.HistogramVec
	inputLength       *prometheus.HistogramVec
	outputLength      *prometheus.HistogramVec
	duration          *prometheus.HistogramVec
	promptTokens      *prometheus.CounterVec
	tracePromptTokens *prometheus.CounterVec
	completionTokens  *prometheus.CounterVec
	cachedTokens      *prometheus.CounterVec
	theoreticalTokens *prometheus.CounterVec
	loops             *prometheus.CounterVec
	targetInfo        *prometheus.GaugeVec

	// The efficiency ratio's two sides, over the requests whose cached
	// tokens the server reported: unknown is not zero.
	reportedCached      *prometheus.CounterVec
	reportedPrompt      *prometheus.CounterVec
	reportedTrace       *prometheus.CounterVec
	reportedTheoretical *prometheus.CounterVec
	unreported          *prometheus.CounterVec
	// The cache signal that needs nothing from the server.
	classTTFT   *prometheus.HistogramVec
	classTokens *prometheus.CounterVec
	// The cache each target's model stands for.
	capacityBlocks *prometheus.GaugeVec
	blockSize      *prometheus.GaugeVec
	capacityKnown  *prometheus.GaugeVec
	preambleTokens *prometheus.GaugeVec
	tokenizeRatio  *prometheus.GaugeVec
	serverErrors   *prometheus.CounterVec // by target and reason
	// The re-reads of a target's KV cache layout.
	layout     *CacheLayout
	reloadOK   prometheus.Gauge
	reloadTime prometheus.Gauge
	// The chat template's size, per (workload, target).
	template *ChatTemplate
	// Why hits were missed, from KV cache events (misses.go).
	misses *KVEvents
	// The service-level objectives and their judgements (slo.go).
	slos *SLOs
	// The HTTP phases of each request and its connection (phases.go).
	phases *httpPhases
	// Span exports that failed (tracing.go).
	tracingErrors prometheus.Counter

	now      func() time.Time
	mu       sync.Mutex
	lastPass map[string]int // workload → the last pass counted in trace_loops_total
	recent   map[wtKey]*recent
	pairs    map[wtKey]*pairSeries
	// costs fit what a cached prompt token costs, per (workload, target).
	costs     *servedcache.CostWindows
	effective *servedcache.EffectiveCapacity
	// reconcile compares each target's engine counters with its responses.
	reconcile *Reconcile
}

// CacheClass is how much of a request's prompt an ideal cache would serve.
type CacheClass string

// The cache classes: label values of the cache_class label.
const (
	CacheClassNone    CacheClass = "none"    // under 10 %
	CacheClassPartial CacheClass = "partial" // 10 % to 70 %
	CacheClassMost    CacheClass = "most"    // 70 % or more
)

// CacheClasses lists every class, for initialising series.
var CacheClasses = [...]CacheClass{CacheClassNone, CacheClassPartial, CacheClassMost}

// ClassOf is the cache class of a request with this theoretical share.
func ClassOf(theoretical, inputLength int) CacheClass {
	if inputLength <= 0 {
		return CacheClassNone
	}
	switch f := float64(theoretical) / float64(inputLength); {
	case f >= 0.7:
		return CacheClassMost
	case f >= 0.1:
		return CacheClassPartial
	}
	return CacheClassNone
}

var _ replay.Observer = (*Collector)(nil)

// wt are the labels of the per-(workload, target) series.
var wt = []string{"workload", "target"}

// counter is a per-(workload, target) counter, with extra labels.
func counter(name, help string, extra ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, append(append([]string{}, wt...), extra...))
}

// histogramWith is a per-(workload, target) histogram of buckets, classic
// and native at once, with extra labels.
func histogramWith(buckets []float64, name, help string, extra ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace:                       namespace,
		Name:                            name,
		Help:                            help,
		Buckets:                         buckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}, append(append([]string{}, wt...), extra...))
}

// histogram is a latency histogramWith.
func histogram(name, help string, extra ...string) *prometheus.HistogramVec {
	return histogramWith(LatencyBuckets, name, help, extra...)
}

// targetGauge is a per-target gauge.
func targetGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, []string{"target"})
}

// New creates the metrics and registers them with reg.
func New(reg prometheus.Registerer) *Collector {
	c := &Collector{
		requests:          counter("requests_total", "Finished requests by outcome.", "outcome"),
		dropped:           counter("requests_dropped_total", "Requests the schedule called for but that were never sent, by reason.", "reason"),
		inFlight:          prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "requests_in_flight", Help: "Requests sent and not yet finished."}, wt),
		lag:               histogramWith(LagBuckets, "schedule_lag_seconds", "Actual send time minus the time the trace scheduled."),
		ttft:              histogram("time_to_first_token_seconds", "Time from send to the first chunk carrying content, reasoning or tool-call text (successful requests)."),
		itl:               histogram("inter_token_latency_seconds", "Per request, (latency - TTFT) / (output tokens - 1) (successful requests with at least two output tokens)."),
		inputLength:       histogramWith(LengthBuckets, "input_sequence_length_tokens", "Per successful request, its prompt tokens: the server's usage, else the trace's input_length."),
		outputLength:      histogramWith(LengthBuckets, "output_sequence_length_tokens", "Per successful request, its output tokens (server usage, else counted chunks)."),
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
		reportedCached:    counter("cache_reported_cached_prompt_tokens_total", "Observed cached prompt tokens of the requests counted in kvload_cache_reported_prompt_tokens_total: the observed side of the cache efficiency."),
		reportedPrompt:    counter("cache_reported_prompt_tokens_total", "Server prompt tokens of successful requests whose cached tokens are known (reported in usage, or observed: server_metrics)."),
		reportedTrace:     counter("cache_reported_trace_prompt_tokens_total", "The trace's input_length of the same requests."),
		reportedTheoretical: counter("cache_reported_theoretical_cached_prompt_tokens_total",
			"Theoretical cached prompt tokens of the same requests."),
		unreported:     counter("cache_unreported_requests_total", "Successful requests whose response carried no cached-token count."),
		classTTFT:      histogram("cache_class_time_to_first_token_seconds", "Time to first token of successful requests by how much of their prompt an ideal cache would serve (none < 10 %, partial, most >= 70 %).", "cache_class"),
		classTokens:    counter("cache_class_trace_prompt_tokens_total", "The trace's input_length of the same requests, by cache class.", "cache_class"),
		capacityBlocks: targetGauge("target_cache_capacity_blocks", "KV blocks of the cache the target's theoretical model stands for; 0 is unbounded."),
		blockSize:      targetGauge("target_cache_block_size_tokens", "Tokens per KV block of the target's theoretical model."),
		capacityKnown:  targetGauge("target_cache_capacity_known", "1 when the target's cache size was configured or read from it, 0 when unknown (the model is then unbounded)."),
		preambleTokens: targetGauge("target_cache_preamble_tokens", "Tokens the target reports as cached for prompts that share nothing (a BOS, a chat header), learned from its answers and left out of the observed hit rate."),
		tokenizeRatio:  targetGauge("target_tokenize_ratio", "Tokens the target's tokenize endpoint counts in a prompt the exporter built, over the tokens the exporter built it of (1 when the server's tokenizer counts prompts as the exporter does); checked when the target is configured, absent where the engine has no tokenize endpoint or it did not answer."),
		serverErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "server_metrics_errors_total",
			Help: "Scrapes of a target's own cached-token and prompt-token counters (observed: server_metrics) not credited, by reason: scrape (unreadable), timeout, duplicate, not_finite, negative, too_large, jump, backwards."},
			[]string{"target", "reason"}),
		layout:   newCacheLayout(),
		template: newChatTemplate(),
		misses:   newKVEvents(),
		slos:     newSLOs(),
		phases:   newHTTPPhases(),
		now:      time.Now,
		lastPass: map[string]int{},
		recent:   map[wtKey]*recent{},
		pairs:    map[wtKey]*pairSeries{},
		costs:    servedcache.NewCostWindows(),
	}
	// The estimates take the collector's clock, which tests set.
	clock := func() time.Time { return c.now() }
	c.effective = servedcache.NewEffectiveCapacity(clock)
	c.reconcile = newReconcile(servedcache.NewReconciliation(clock))
	reg.MustRegister(c.requests, c.dropped, c.inFlight, c.lag, c.ttft, c.itl, c.inputLength, c.outputLength, c.duration,
		c.promptTokens, c.tracePromptTokens, c.completionTokens, c.cachedTokens, c.theoreticalTokens,
		c.loops, c.targetInfo, c.reloadOK, c.reloadTime,
		c.reportedCached, c.reportedPrompt, c.reportedTrace, c.reportedTheoretical, c.unreported, c.classTTFT, c.classTokens,
		c.capacityBlocks, c.blockSize, c.capacityKnown, c.preambleTokens, c.tokenizeRatio, c.serverErrors,
		newCostMetrics(c))
	reg.MustRegister(c.layout.collectors()...)
	reg.MustRegister(c.template.collectors()...)
	reg.MustRegister(c.misses.collectors()...)
	reg.MustRegister(c.slos.collectors()...)
	reg.MustRegister(c.phases.collectors()...)
	c.tracingErrors = newTracingExportErrors()
	reg.MustRegister(c.tracingErrors)
	reg.MustRegister(newEffectiveMetrics(c.effective))
	reg.MustRegister(c.reconcile.collectors()...)
	return c
}

// KVEvents is the part that counts the target's KV event streams and the
// hits they explain as missed.
func (c *Collector) KVEvents() *KVEvents { return c.misses }

// Reconcile is the part that compares each target's engine counters with
// its responses (cache.reconcile).
func (c *Collector) Reconcile() *Reconcile { return c.reconcile }

// ChatTemplate is the part that publishes each (workload, target)'s chat
// template size.
func (c *Collector) ChatTemplate() *ChatTemplate { return c.template }

// SLOs is the part that judges each (workload, target)'s requests against
// its service-level objective.
func (c *Collector) SLOs() *SLOs { return c.slos }

// CacheLayout is the part that counts the re-reads of each target's KV
// cache layout.
func (c *Collector) CacheLayout() *CacheLayout { return c.layout }

// ServerMetricsError counts a scrape of target's cached-token counter that
// was not credited, for reason (see ServerScraper).
func (c *Collector) ServerMetricsError(target string, reason engine.ServerMetricsErrorReason) {
	c.serverErrors.WithLabelValues(target, string(reason)).Inc()
}

// Start creates the series of a (workload, target) at zero, so that rates
// and ratios exist before the first request finishes.
func (c *Collector) Start(workload, target string) {
	for _, o := range openai.Outcomes {
		c.requests.WithLabelValues(workload, target, string(o))
	}
	c.dropped.WithLabelValues(workload, target, string(replay.DropMaxInFlight))
	c.inFlight.WithLabelValues(workload, target)
	for _, v := range []*prometheus.CounterVec{c.promptTokens, c.tracePromptTokens, c.completionTokens, c.cachedTokens, c.theoreticalTokens,
		c.reportedCached, c.reportedPrompt, c.reportedTrace, c.reportedTheoretical, c.unreported} {
		v.WithLabelValues(workload, target)
	}
	for _, cl := range CacheClasses {
		c.classTokens.WithLabelValues(workload, target, string(cl))
	}
	c.loops.WithLabelValues(workload)
	c.phases.start(workload, target)
	c.effective.Start(workload, target)
	c.costs.Start(workload, target)
	// The landing page lists the pair from now on, even while no request
	// finishes (a target that hangs must not be invisible).
	c.mu.Lock()
	if c.recent[wtKey{workload, target}] == nil {
		c.recent[wtKey{workload, target}] = &recent{}
	}
	c.mu.Unlock()
}

// Forget deletes every series of a (workload, target) that was removed or
// changed by a reload.
func (c *Collector) Forget(workload, target string) {
	l := prometheus.Labels{"workload": workload, "target": target}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{c.requests, c.dropped, c.inFlight, c.lag, c.ttft, c.itl, c.inputLength, c.outputLength, c.duration,
		c.promptTokens, c.tracePromptTokens, c.completionTokens, c.cachedTokens, c.theoreticalTokens,
		c.reportedCached, c.reportedPrompt, c.reportedTrace, c.reportedTheoretical, c.unreported, c.classTTFT, c.classTokens} {
		v.DeletePartialMatch(l)
	}
	c.template.forget(l)
	c.misses.forget(l)
	c.slos.forget(l)
	c.phases.forget(l)
	c.mu.Lock()
	delete(c.recent, wtKey{workload, target})
	delete(c.pairs, wtKey{workload, target})
	c.mu.Unlock()
	c.costs.Forget(workload, target)
	c.effective.Forget(workload, target)
}

// ForgetWorkload deletes the per-workload series of a removed workload.
func (c *Collector) ForgetWorkload(workload string) {
	c.loops.DeleteLabelValues(workload)
	c.mu.Lock()
	delete(c.lastPass, workload)
	c.mu.Unlock()
}

// SetTarget publishes a target's info series, replacing an older one.
func (c *Collector) SetTarget(target, model string, api openai.API, dialect engine.Dialect) {
	c.targetInfo.DeletePartialMatch(prometheus.Labels{"target": target})
	c.targetInfo.WithLabelValues(target, model, string(api), string(dialect)).Set(1)
}

// SetPreamble publishes the tokens a target reports as cached for prompts
// that share nothing, left out of its observed hit rate.
func (c *Collector) SetPreamble(target string, tokens int) {
	c.preambleTokens.WithLabelValues(target).Set(float64(tokens))
}

// SetTargetCache publishes the cache a target's theoretical model stands
// for: blocks of blockSize tokens (0 blocks: unbounded); known is false when
// the size could be neither configured nor read from the target.
func (c *Collector) SetTargetCache(target string, blocks, blockSize int, known bool) {
	c.capacityBlocks.WithLabelValues(target).Set(float64(blocks))
	c.blockSize.WithLabelValues(target).Set(float64(blockSize))
	v := 0.0
	if known {
		v = 1
	}
	c.capacityKnown.WithLabelValues(target).Set(v)
}

// SetTokenizeRatio publishes a target's tokenize check: the server's token
// count over the exporter's for one built prompt; ok false (no endpoint,
// no answer) removes the series.
func (c *Collector) SetTokenizeRatio(target string, ratio float64, ok bool) {
	if !ok {
		c.tokenizeRatio.DeleteLabelValues(target)
		return
	}
	c.tokenizeRatio.WithLabelValues(target).Set(ratio)
}

// ForgetTarget deletes a removed target's series.
func (c *Collector) ForgetTarget(target string) {
	l := prometheus.Labels{"target": target}
	for _, v := range []*prometheus.GaugeVec{c.targetInfo, c.capacityBlocks, c.blockSize, c.capacityKnown, c.preambleTokens, c.tokenizeRatio} {
		v.DeletePartialMatch(l)
	}
	c.serverErrors.DeletePartialMatch(l)
	c.misses.Stop(target)
	c.layout.Unwatch(target)
	c.costs.ForgetTarget(target)
	c.effective.ForgetTarget(target)
	c.reconcile.Stop(target)
}

// AddServerCredit adds cached tokens read from a target's own counter
// (observed: server_metrics) to a workload: cached to all its cached
// tokens, reportedCached to the efficiency's observed side.
func (c *Collector) AddServerCredit(workload, target string, cached, reportedCached float64) {
	c.cachedTokens.WithLabelValues(workload, target).Add(cached)
	if reportedCached > 0 {
		c.reportedCached.WithLabelValues(workload, target).Add(reportedCached)
	}
	c.effective.AddCredit(workload, target, reportedCached)
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
	s := c.pair(workload, target)
	s.gauge(&s.inFlight, c.inFlight).Inc()
	s.observer(&s.lag, c.lag).Observe(sent.Sub(scheduled).Seconds())
	c.reconcile.comparison.Sent(target)
}

// Finished implements replay.Observer. Latencies and token counts come from
// successful requests only, as in AIPerf: a failed request has no TTFT.
// How its cached tokens count is r.Counted.
func (c *Collector) Finished(r *replay.Result) {
	w, t := r.Workload, r.Target
	s := c.pair(w, t)
	s.gauge(&s.inFlight, c.inFlight).Dec()
	s.request(c.requests, r.Outcome).Inc()
	at := c.now()
	c.mu.Lock()
	c.recentLocked(w, t).add(r, at)
	c.mu.Unlock()
	c.costs.Add(r, at)
	c.effective.Add(r)
	c.reconcile.comparison.Finished(r)
	c.slos.observe(r)
	c.phases.finished(s, r)

	if r.Outcome != openai.OutcomeSuccess {
		return
	}
	if d, ok := r.TTFT(); ok {
		observeTraced(s.observer(&s.ttft, c.ttft), &s.ttftExemplars, d.Seconds(), r, at)
	}
	if d, ok := r.ITL(); ok {
		s.observer(&s.itl, c.itl).Observe(d.Seconds())
	}
	if d, ok := r.Latency(); ok {
		observeTraced(s.observer(&s.duration, c.duration), &s.durationExemplars, d.Seconds(), r, at)
	}
	if r.PromptKnown {
		s.counter(&s.promptTokens, c.promptTokens).Add(float64(r.PromptTokens))
	}
	s.counter(&s.tracePromptTokens, c.tracePromptTokens).Add(float64(r.TraceInputLength))
	s.counter(&s.completionTokens, c.completionTokens).Add(float64(r.OutputTokens))
	s.observer(&s.inputLength, c.inputLength).Observe(float64(promptOf(r)))
	s.observer(&s.outputLength, c.outputLength).Observe(float64(r.OutputTokens))
	if r.Counted.UsageCached {
		s.counter(&s.cachedTokens, c.cachedTokens).Add(float64(r.CachedTokens))
	}
	if r.Counted.Unreported {
		s.counter(&s.unreported, c.unreported).Inc()
	}
	if !r.TheoreticalKnown {
		return
	}
	s.counter(&s.theoreticalTokens, c.theoreticalTokens).Add(float64(r.TheoreticalCachedTokens))
	if r.Counted.Reported {
		// The preamble's hit, when there was one, is on neither side.
		s.counter(&s.reportedPrompt, c.reportedPrompt).Add(float64(promptOf(r) - r.Counted.LeftOut))
		if r.Counted.UsageCached {
			s.counter(&s.reportedCached, c.reportedCached).Add(float64(r.CachedTokens - r.Counted.LeftOut))
		}
		s.counter(&s.reportedTrace, c.reportedTrace).Add(float64(r.TraceInputLength))
		s.counter(&s.reportedTheoretical, c.reportedTheoretical).Add(float64(r.TheoreticalCachedTokens))
	}
	class := ClassOf(r.TheoreticalCachedTokens, r.TraceInputLength)
	if d, ok := r.TTFT(); ok {
		s.classTTFTOf(c.classTTFT, class).Observe(d.Seconds())
		s.classTokensOf(c.classTokens, class).Add(float64(r.TraceInputLength))
	}
}

// promptOf is r's prompt tokens in the engine's units where the response
// says them, else the trace's.
func promptOf(r *replay.Result) int {
	if r.PromptKnown {
		return r.PromptTokens
	}
	return r.TraceInputLength
}

// Dropped implements replay.Observer.
func (c *Collector) Dropped(workload, target string, reason replay.DropReason, _ time.Time) {
	c.dropped.WithLabelValues(workload, target, string(reason)).Inc()
	at := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recentLocked(workload, target).addDrop(at)
}

// PassCompleted implements replay.Observer. Passes are counted per workload:
// each target replays the whole trace, and the first target to complete a
// pass counts it. Pass numbers come from the schedule's anchor, so only a
// pass later than the last one counted adds one.
func (c *Collector) PassCompleted(workload, _ string, pass int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.lastPass[workload]; ok && pass <= last {
		return
	}
	c.lastPass[workload] = pass
	c.loops.WithLabelValues(workload).Inc()
}
