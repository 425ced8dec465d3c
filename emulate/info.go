package emulate

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The capacity each personality exports, where its real engine exports
// it, so that the exporter can discover the cache size. It keeps the value
// of the start or the last Redeploy: a real engine only changes it on a
// restart, and a run-time Resize models a KV cache cut that the exporter
// must detect from the hits, as a regression, not read from a label.
// Config.HideCacheConfig leaves them out, as an engine whose capacity
// cannot be read.
//
// The emulator's cache may be unbounded (capacity 0), which no real engine
// is: there the exported capacity is 0, meaning unbounded, for the
// emulator only.

// cacheConfigInfo is vLLM's info gauge vllm:cache_config_info: always 1,
// its labels the cache config as strings (vllm/v1/metrics/loggers.py
// log_metrics_info, from CacheConfig.metrics_info(), plus engine). vLLM
// has many more labels; these are the ones the emulator models. vLLM only
// changes them on a restart: here num_gpu_blocks follows a Redeploy, and
// not a run-time Resize, which stands for a KV cut that the exporter must
// detect as a regression.
type cacheConfigInfo struct {
	e    *Engine
	desc *prometheus.Desc
}

func newCacheConfigInfo(e *Engine) cacheConfigInfo {
	return cacheConfigInfo{e: e, desc: prometheus.NewDesc("vllm:cache_config_info",
		"Prefix cache configuration of the engine's (re)deployment, in the labels; num_gpu_blocks 0 means unbounded (emulator only).",
		[]string{"block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"}, nil)}
}

func (c cacheConfigInfo) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c cacheConfigInfo) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, strconv.Itoa(c.e.cfg.BlockSize),
		strconv.FormatInt(c.e.told.Load(), 10), pythonBool(!c.e.cfg.DisablePrefixCache), "0")
}

// pythonBool spells a bool as vLLM's str(bool) labels do.
func pythonBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// handleServerInfo answers SGLang's GET /get_server_info, which flattens
// the server arguments (page_size, disable_radix_cache, ...) and the
// scheduler's max_total_num_tokens, the KV pool size in tokens, into one
// object. Only a few of its many fields are modelled.
func (e *Engine) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, struct {
		ModelPath          string `json:"model_path"`
		ServedModelName    string `json:"served_model_name"`
		ContextLength      int    `json:"context_length"`
		PageSize           int    `json:"page_size"`
		DisableRadixCache  bool   `json:"disable_radix_cache"`
		MaxRunningRequests int    `json:"max_running_requests"`
		MaxTotalNumTokens  int    `json:"max_total_num_tokens"`
		Status             string `json:"status"`
		Version            string `json:"version"`
	}{e.cfg.Model, e.cfg.Model, e.cfg.MaxModelLen, e.cfg.BlockSize, e.cfg.DisablePrefixCache, e.cfg.MaxRunning,
		int(e.told.Load()) * e.cfg.BlockSize, "ready", "kvload-emulated"})
}

// handleProps answers llama.cpp's GET /props: total_slots and the
// per-slot context in default_generation_settings.n_ctx, among others
// (tools/server get_props).
func (e *Engine) handleProps(w http.ResponseWriter, _ *http.Request) {
	type settings struct {
		NCtx   int            `json:"n_ctx"`
		Params map[string]any `json:"params"`
	}
	writeJSON(w, http.StatusOK, struct {
		DefaultGenerationSettings settings `json:"default_generation_settings"`
		TotalSlots                int      `json:"total_slots"`
		ModelAlias                string   `json:"model_alias"`
		ModelPath                 string   `json:"model_path"`
		EndpointSlots             bool     `json:"endpoint_slots"`
		EndpointProps             bool     `json:"endpoint_props"`
		EndpointMetrics           bool     `json:"endpoint_metrics"`
		BOSToken                  string   `json:"bos_token"`
		BuildInfo                 string   `json:"build_info"`
	}{settings{NCtx: e.cfg.MaxModelLen, Params: map[string]any{}}, int(e.told.Load()), e.cfg.Model, e.cfg.Model,
		false, false, true, bosText, "kvload-emulated"})
}

// maxHitsOvercount bounds Config.MetricsHitsOvercount: a counter that
// overcounts more is no engine's.
const maxHitsOvercount = 100

// vllmPromptCounters are vLLM's per-request counts of cached prompt
// tokens (vllm/v1/metrics/loggers.py, since PR 33290):
// vllm:prompt_tokens_cached_total, local and from a KV connector, and
// vllm:prompt_tokens_by_source_total split into local_compute,
// local_cache_hit and external_kv_transfer. vLLM counts a request once,
// at its prefill, so that a preempted request's lookups are not counted
// again as vllm:prefix_cache_hits_total counts them; here they follow the
// cache's lookups at admission, as the emulator preempts nothing. They
// are vLLM's since PR 38709: local_cache_hit without the recomputed last
// token, and no vllm:prompt_tokens_recomputed_total. The emulator has no
// KV connector: external_kv_transfer stays 0.
type vllmPromptCounters struct {
	e                *Engine
	cached, bySource *prometheus.Desc
}

func newVLLMPromptCounters(e *Engine) vllmPromptCounters {
	labels := prometheus.Labels{"model_name": e.cfg.Model, "engine": "0"}
	return vllmPromptCounters{
		e:        e,
		cached:   prometheus.NewDesc("vllm:prompt_tokens_cached_total", "Number of cached prompt tokens (local + external).", nil, labels),
		bySource: prometheus.NewDesc("vllm:prompt_tokens_by_source_total", "Number of prompt tokens by source.", []string{"source"}, labels),
	}
}

func (c vllmPromptCounters) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.cached
	ch <- c.bySource
}

func (c vllmPromptCounters) Collect(ch chan<- prometheus.Metric) {
	c.e.statsMu.Lock()
	queried, hit := c.e.stats.CacheQueryTokens, c.e.stats.CacheHitTokens
	c.e.statsMu.Unlock()
	cached := float64(hit)
	if c.e.cfg.MetricsDoubleCountHits {
		cached *= 2
	}
	ch <- prometheus.MustNewConstMetric(c.cached, prometheus.CounterValue, cached)
	for _, s := range []struct {
		source string
		v      float64
	}{{"local_compute", float64(queried - hit)}, {"local_cache_hit", cached}, {"external_kv_transfer", 0}} {
		ch <- prometheus.MustNewConstMetric(c.bySource, prometheus.CounterValue, s.v, s.source)
	}
}
