package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/servedcache"
)

// The comparison's names, as the landing page reads them.
type (
	// ReconcileState is a label value of kvload_cache_reconcile_state.
	ReconcileState = servedcache.ReconcileState
	// ReconcileStatus is one target's comparison now.
	ReconcileStatus = servedcache.ReconcileStatus
)

// The reconciliation states (servedcache.ReconcileStates).
const (
	ReconcileNoEngineCounter    = servedcache.ReconcileNoEngineCounter
	ReconcileNoQueryCounter     = servedcache.ReconcileNoQueryCounter
	ReconcileNothingCounted     = servedcache.ReconcileNothingCounted
	ReconcileEngineUndercounted = servedcache.ReconcileEngineUndercounted
	ReconcileNotReported        = servedcache.ReconcileNotReported
	ReconcileSharedEngine       = servedcache.ReconcileSharedEngine
	ReconcileTooFewHits         = servedcache.ReconcileTooFewHits
	ReconcileCompared           = servedcache.ReconcileCompared
	// MinCanaryShare is the share of the engine's prompt tokens the
	// ratios need (servedcache.MinCanaryShare).
	MinCanaryShare = servedcache.MinCanaryShare
)

// Reconcile is the collector's side of cache.reconcile: the series of the
// comparison of each target's engine counters with its responses, which
// servedcache.Reconciliation works out.
type Reconcile struct {
	comparison *servedcache.Reconciliation

	engineCached, enginePrompt             *prometheus.CounterVec
	canaryPrompt, usagePrompt, usageCached *prometheus.CounterVec
	engineRecomputed                       *prometheus.CounterVec
	errors                                 *prometheus.CounterVec
	state, share                           *prometheus.Desc
	engineOverUsage, usageOverModel        *prometheus.Desc
	engineOverModel                        *prometheus.Desc
}

func newReconcile(comparison *servedcache.Reconciliation) *Reconcile {
	t := []string{"target"}
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, append(append([]string{}, t...), extra...))
	}
	desc := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, append(append([]string{}, t...), extra...), nil)
	}
	return &Reconcile{
		comparison:   comparison,
		engineCached: counter("cache_reconcile_engine_cached_tokens_total", "Increase of the engine's own cached-token counter, over the reads of it that cache.reconcile made after the first."),
		enginePrompt: counter("cache_reconcile_engine_prompt_tokens_total", "Increase of the engine's own prompt-token (cache query) counter over the same reads."),
		canaryPrompt: counter("cache_reconcile_canary_prompt_tokens_total", "Prompt tokens of this exporter's successful requests to the target, finished between the same reads."),
		usagePrompt:  counter("cache_reconcile_usage_prompt_tokens_total", "Prompt tokens of those requests whose usage carried a cached-token count."),
		usageCached:  counter("cache_reconcile_usage_cached_tokens_total", "Their cached tokens, as their usage said."),
		engineRecomputed: counter("cache_reconcile_engine_recomputed_tokens_total",
			"Increase of the engine's own count of tokens it found in its cache and computed again (vllm:prompt_tokens_recomputed_total) over the same reads, where it counts them: in neither its cached tokens nor usage."),
		errors: counter("cache_reconcile_errors_total", "Reads of the engine's counters for cache.reconcile that failed or were refused, by reason: scrape, timeout, duplicate, not_finite, negative, too_large, jump, backwards.", "reason"),
		state: desc("cache_reconcile_state",
			"1 for the state of the comparison of the engine's counters with the responses over the last 5 minutes, 0 for the others: compared, no_engine_counter, no_query_counter, nothing_counted, engine_undercounted, not_reported, shared_engine, too_few_hits.", "state"),
		share: desc("cache_reconcile_canary_share",
			"Prompt tokens this exporter's requests had over those the engine counted in the last 5 minutes; the ratios need 0.95 to 1.05. Absent where the engine counted none."),
		engineOverUsage: desc("cache_reconcile_engine_over_usage_ratio",
			"The engine's hit rate from its own counters over the responses' hit rate from usage, last 5 minutes; 1 when they agree. Present only in the state compared."),
		usageOverModel: desc("cache_reconcile_usage_over_model_ratio",
			"The responses' hit rate over the model's theoretical hit rate for the same requests, last 5 minutes. Present only in the state compared, where the model's is 5 % or more."),
		engineOverModel: desc("cache_reconcile_engine_over_model_ratio",
			"The engine's hit rate from its own counters over the model's theoretical hit rate, last 5 minutes. As the ratio above."),
	}
}

// collectors are the comparison's series, to register.
func (r *Reconcile) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.engineCached, r.enginePrompt, r.canaryPrompt, r.usagePrompt, r.usageCached, r.engineRecomputed, r.errors, reconcileFigures{r}}
}

// Start begins comparing target's engine counters with its responses,
// its counters at zero: from now on its finished requests are added up
// between two reads (AddEngineRead). A target already compared goes on.
func (r *Reconcile) Start(target string) {
	if !r.comparison.Start(target) {
		return
	}
	for _, v := range []*prometheus.CounterVec{r.engineCached, r.enginePrompt, r.canaryPrompt, r.usagePrompt, r.usageCached} {
		v.WithLabelValues(target)
	}
	for _, reason := range []engine.ServerMetricsErrorReason{engine.ServerErrorScrape, engine.ServerErrorTimeout} {
		r.errors.WithLabelValues(target, string(reason))
	}
}

// Stop ends the comparison for target and deletes its series.
func (r *Reconcile) Stop(target string) {
	r.comparison.Stop(target)
	l := prometheus.Labels{"target": target}
	for _, v := range []*prometheus.CounterVec{r.engineCached, r.enginePrompt, r.canaryPrompt, r.usagePrompt, r.usageCached, r.engineRecomputed, r.errors} {
		v.DeletePartialMatch(l)
	}
}

// AddEngineRead adds a read of a compared target's engine counters; an
// implausible one is counted as refused.
func (r *Reconcile) AddEngineRead(target string, d engine.ServerCounts) {
	inc, refused := r.comparison.Read(target, d)
	if refused != "" {
		r.errors.WithLabelValues(target, string(refused)).Inc()
		return
	}
	if !inc.Stepped {
		return
	}
	r.engineCached.WithLabelValues(target).Add(inc.EngineCached)
	r.enginePrompt.WithLabelValues(target).Add(inc.EnginePrompt)
	r.canaryPrompt.WithLabelValues(target).Add(inc.CanaryPrompt)
	r.usagePrompt.WithLabelValues(target).Add(inc.UsagePrompt)
	r.usageCached.WithLabelValues(target).Add(inc.UsageCached)
	if inc.RecomputedKnown {
		// Created by the first read that counts them: absent where the
		// engine does not.
		r.engineRecomputed.WithLabelValues(target).Add(inc.EngineRecomputed)
	}
}

// EngineReadFailed counts a failed read of a compared target's engine
// counters.
func (r *Reconcile) EngineReadFailed(target string, reason engine.ServerMetricsErrorReason) {
	if r.comparison.Failed(target, reason) {
		r.errors.WithLabelValues(target, string(reason)).Inc()
	}
}

// reconcileFigures exports the comparison's figures of the window ending
// at each scrape.
type reconcileFigures struct{ r *Reconcile }

// ValueType says that every series made at scrape time is a gauge.
func (f reconcileFigures) ValueType() prometheus.ValueType { return prometheus.GaugeValue }

// Describe implements prometheus.Collector.
func (f reconcileFigures) Describe(ch chan<- *prometheus.Desc) {
	r := f.r
	for _, d := range []*prometheus.Desc{r.state, r.share, r.engineOverUsage, r.usageOverModel, r.engineOverModel} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (f reconcileFigures) Collect(ch chan<- prometheus.Metric) {
	r := f.r
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, st := range r.comparison.Status() {
		for _, s := range servedcache.ReconcileStates {
			gauge(r.state, boolValue(s == st.State), st.Target, string(s))
		}
		if st.ShareKnown {
			gauge(r.share, st.CanaryShare, st.Target)
		}
		if st.State != servedcache.ReconcileCompared {
			continue
		}
		gauge(r.engineOverUsage, st.EngineOverUsage, st.Target)
		if st.ModelKnown {
			gauge(r.usageOverModel, st.UsageOverModel, st.Target)
			gauge(r.engineOverModel, st.EngineOverModel, st.Target)
		}
	}
}

// Status is the comparison of every compared target now, for the landing
// page, sorted by target.
func (r *Reconcile) Status() []ReconcileStatus { return r.comparison.Status() }
