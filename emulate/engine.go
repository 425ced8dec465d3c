// Package emulate is an OpenAI-compatible inference engine emulator, so
// that the exporter can be run, demonstrated and tested without a GPU.
//
// It answers /v1/chat/completions, /v1/completions, /v1/models, /tokenize,
// /detokenize, /health and /metrics with vLLM's shapes. What it models is
// what the exporter measures: a real BPE tokenizer (o200k_base) so prompt
// lengths are honest; a prefix cache over the real token ids that fills
// usage.prompt_tokens_details.cached_tokens; and a timing model in which a
// bounded number of sequences run at once, the time to first token grows
// with the prompt tokens not found in the cache, and output tokens follow
// at a fixed pace.
//
// The cache is a token trie with LRU eviction of whole blocks, written
// independently of the exporter's theoretical model so that it can be the
// ground truth the model is checked against. Config.Engine picks whose
// behaviour it imitates: vLLM (full 16-token blocks, at most prompt−1
// tokens hit, vllm:* metrics and vllm:cache_config_info), SGLang
// (token-granular, sglang:* metrics, /get_server_info), TensorRT-LLM
// (32-token blocks with partial reuse) or llama.cpp (one remembered prompt
// per slot and a host prompt cache behind them, llamacpp:* metrics, /props,
// timings.cache_n). Config.BOS prepends a BOS token to text prompts, as
// Llama tokenizers do.
//
// With Config.KVEvents the trie cache also publishes vLLM's KV cache
// events (blocks stored and removed, the cache cleared) in vLLM's wire
// format on a ZMQ PUB socket (kvevents.go).
//
// Faults (errors, disconnects, malformed chunks, hangs, slow first tokens)
// can be injected with seeded probabilities, and the cache can be
// disabled, resized or flushed at run time to show a cache regression.
// Output text is filler; every request generates exactly its max_tokens,
// as vLLM does with ignore_eos.
package emulate

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/tokenizer"
)

// Engine is one emulated inference server. Its methods are safe for
// concurrent use.
type Engine struct {
	cfg    Config              // with defaults; Faults here is the initial set
	tok    tokenizer.Tokenizer // o200k_base: a real BPE, so lengths and shared prefixes behave as on a real model
	pieces []string            // output token texts, cycled
	cache  prefixCache
	sched  *scheduler
	faults faultState
	reg    *prometheus.Registry
	m      engineMetrics
	mux    *http.ServeMux
	nextID atomic.Uint64
	// events publishes the cache's KV events (Config.KVEvents); nil when
	// none are.
	events *kvPublisher
	// told is the capacity the engine tells where its real engine does
	// (info.go): blocks, or slots in the llamacpp personality. Only a
	// redeploy changes it.
	told atomic.Int64

	// encoding holds a token for each request being decoded, rendered
	// and tokenized: one per CPU, since an encode keeps several times its
	// text's size in flight and more at once would only share the CPUs,
	// while requests queueing behind a slow emulator would each hold
	// that much (tokenizing).
	encoding chan struct{}

	statsMu sync.Mutex
	stats   Stats // request and token counts only

	// Seams for tests, set before the engine serves.
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	onDone func(Result) // called after a generation request is counted
}

// New returns an engine for cfg (see Config for the defaults).
func New(cfg Config) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.Load("o200k_base")
	if err != nil {
		return nil, fmt.Errorf("emulate: tokenizer: %w", err)
	}
	e := &Engine{
		cfg:      cfg,
		tok:      tok,
		pieces:   outputPieces(),
		cache:    newPrefixCache(cfg.Engine, cfg.BlockSize, cfg.CapacityBlocks, cfg.Slots, !cfg.DisablePrefixCache),
		sched:    newScheduler(cfg.MaxRunning),
		faults:   faultState{f: cfg.Faults, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6b766c6f6164))},
		reg:      prometheus.NewRegistry(),
		encoding: make(chan struct{}, runtime.GOMAXPROCS(0)),
		now:      time.Now,
		sleep:    sleepCtx,
	}
	if sc, ok := e.cache.(*slotCache); ok {
		sc.setHostBudget(cfg.CacheRAMTokens)
	}
	if tc, ok := e.cache.(*trieCache); ok && cfg.KVEvents != "" {
		e.events = newKVPublisher(cfg, func() time.Time { return e.now() })
		tc.events = e.events
	}
	e.told.Store(int64(cfg.CapacityBlocks))
	if cfg.Engine == PersonalityLlamaCpp {
		e.told.Store(int64(cfg.Slots))
	}
	if err := e.registerMetrics(); err != nil {
		return nil, err
	}
	e.mux = e.routes()
	return e, nil
}

// Config returns the engine's configuration with defaults filled in and
// the faults in force now.
func (e *Engine) Config() Config {
	c := e.cfg
	c.Faults = e.faults.get()
	st := e.cache.state()
	c.DisablePrefixCache = !st.Enabled
	if c.Engine == PersonalityLlamaCpp {
		c.Slots = st.CapacityBlocks
		c.CacheRAMTokens = cmp.Or(st.CacheRAMTokens, -1)
	} else {
		c.CapacityBlocks = st.CapacityBlocks
	}
	return c
}

// LogTo makes the engine log to logger what it refuses: KV event
// subscribers and replay clients past KVEventsMaxSubscribers. Call it
// before the engine serves; without it nothing is logged.
func (e *Engine) LogTo(logger log.Logger) {
	if e.events != nil {
		e.events.logger = logger
	}
}

// KVEventsEndpoint is where the engine publishes its KV events,
// tcp://host:port with the port bound, once Start or Serve has bound it;
// "" before, and when Config.KVEvents is empty.
func (e *Engine) KVEventsEndpoint() string {
	if e.events == nil {
		return ""
	}
	return e.events.Endpoint()
}

// BindKVEvents binds the KV events endpoint now, as Start and Serve
// otherwise do, so that KVEventsEndpoint names it before the engine
// serves; it does nothing without Config.KVEvents.
func (e *Engine) BindKVEvents() error {
	if e.events == nil {
		return nil
	}
	if err := e.events.bind(); err != nil {
		return fmt.Errorf("emulate: %w", err)
	}
	return nil
}

// Handler returns the HTTP API.
func (e *Engine) Handler() http.Handler { return e.mux }

// Gatherer returns the engine's own registry, the one behind /metrics.
func (e *Engine) Gatherer() prometheus.Gatherer { return e.reg }

// SetCacheEnabled turns the prefix cache on or off; off also empties it.
func (e *Engine) SetCacheEnabled(on bool) { e.cache.setEnabled(on) }

// Resize sets the cache capacity in blocks (0 for unbounded), evicting
// least recently used blocks beyond it; in the llamacpp personality it
// sets the number of slots (at least 1). The capacity the engine exports
// (vllm:cache_config_info, /get_server_info, /props) keeps its value, as
// on a real engine whose KV memory shrinks under it: see Redeploy.
func (e *Engine) Resize(capacityBlocks int) error {
	if err := e.cache.resize(capacityBlocks); err != nil {
		return fmt.Errorf("emulate: %w", err)
	}
	return nil
}

// Redeploy stands for the engine restarted with another KV cache size: the
// cache empties and holds capacityBlocks blocks (slots in the llamacpp
// personality) from now on, and the capacity the engine tells follows.
// Only the cache is redeployed: the counters go on.
func (e *Engine) Redeploy(capacityBlocks int) error {
	if err := e.Resize(capacityBlocks); err != nil {
		return err
	}
	e.Flush()
	e.told.Store(int64(capacityBlocks))
	return nil
}

// Flush empties the prefix cache.
func (e *Engine) Flush() { e.cache.flush() }

// SetFaults replaces the fault probabilities for requests arriving from
// now on.
func (e *Engine) SetFaults(f Faults) error {
	f, err := f.withDefaults()
	if err != nil {
		return fmt.Errorf("emulate: %w", err)
	}
	e.faults.set(f)
	return nil
}

// Result is how a generation request ended.
type Result int

// Results, one counter each in Stats.
const (
	ResultSuccess      Result = iota
	ResultError500            // injected 500
	ResultError429            // injected 429
	ResultDisconnected        // injected disconnect
	ResultMalformed           // injected malformed chunk
	ResultHung                // injected hang, counted when the client left
	ResultRejected            // invalid request: 400, 404, 413
	ResultCanceled            // the client went away first
)

func (r Result) String() string {
	switch r {
	case ResultSuccess:
		return "success"
	case ResultError500:
		return "error_500"
	case ResultError429:
		return "error_429"
	case ResultDisconnected:
		return "disconnected"
	case ResultMalformed:
		return "malformed"
	case ResultHung:
		return "hung"
	case ResultRejected:
		return "rejected"
	case ResultCanceled:
		return "canceled"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// Stats is the emulator's ground truth, for tests and GET /emulator/stats.
// A request is counted just before its last byte is written, so a client
// that has read a whole response sees it counted.
type Stats struct {
	// Received counts generation requests on arrival, before any check,
	// so that a request lost between arrival and its end shows: once none
	// is running, Received equals the sum of the results below.
	Received int64 `json:"received"`
	// SlowFirstTokens counts requests whose prefill the slow-first-token
	// fault lengthened, whatever their end.
	SlowFirstTokens int64 `json:"slow_first_tokens"`

	// Generation requests by how they ended.
	Success      int64 `json:"success"`
	Error500     int64 `json:"error_500"`
	Error429     int64 `json:"error_429"`
	Disconnected int64 `json:"disconnected"`
	Malformed    int64 `json:"malformed"`
	Hung         int64 `json:"hung"`
	Rejected     int64 `json:"rejected"`
	Canceled     int64 `json:"canceled"`

	// Usage totals of successful requests: what their usage objects said.
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	CachedTokens     int64 `json:"cached_tokens"`

	// Prompt tokens looked up in the cache and found there, for every
	// request that was admitted, whatever its end: the same numbers as
	// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total
	// (half the latter with MetricsDoubleCountHits).
	CacheQueryTokens int64 `json:"cache_query_tokens"`
	CacheHitTokens   int64 `json:"cache_hit_tokens"`
	// KVEventsSubscribersRefused counts KV event subscribers closed at
	// once, KVEventsMaxSubscribers being served.
	KVEventsSubscribersRefused int64 `json:"kv_events_subscribers_refused"`

	// Now.
	Running int        `json:"running"`
	Waiting int        `json:"waiting"`
	Cache   CacheState `json:"cache"`
}

// Stats returns a snapshot of the counts.
func (e *Engine) Stats() Stats {
	e.statsMu.Lock()
	s := e.stats
	e.statsMu.Unlock()
	s.Running, s.Waiting = e.sched.counts()
	s.Cache = e.cache.state()
	if e.events != nil {
		s.KVEventsSubscribersRefused = e.events.refusedSubscribers()
	}
	return s
}

// usageCounts are one response's usage numbers.
type usageCounts struct {
	prompt, completion, cached int
}

// finish counts a generation request's end. It is called exactly once
// per request, before the response's last write.
func (e *Engine) finish(r Result, u usageCounts) {
	e.statsMu.Lock()
	s := &e.stats
	switch r {
	case ResultSuccess:
		s.Success++
		s.PromptTokens += int64(u.prompt)
		s.CompletionTokens += int64(u.completion)
		s.CachedTokens += int64(u.cached)
	case ResultError500:
		s.Error500++
	case ResultError429:
		s.Error429++
	case ResultDisconnected:
		s.Disconnected++
	case ResultMalformed:
		s.Malformed++
	case ResultHung:
		s.Hung++
	case ResultRejected:
		s.Rejected++
	case ResultCanceled:
		s.Canceled++
	}
	e.statsMu.Unlock()
	if e.onDone != nil {
		e.onDone(r)
	}
}

// received counts a generation request on arrival.
func (e *Engine) received() {
	e.statsMu.Lock()
	e.stats.Received++
	e.statsMu.Unlock()
}

// slowed counts a request that the slow-first-token fault delays.
func (e *Engine) slowed() {
	e.statsMu.Lock()
	e.stats.SlowFirstTokens++
	e.statsMu.Unlock()
}

// admitted records an admitted request's cache lookup in the metrics and
// the stats together.
func (e *Engine) admitted(promptTokens, hitTokens int) {
	e.m.queries.Add(float64(promptTokens))
	if e.cfg.MetricsDoubleCountHits {
		e.m.hits.Add(float64(hitTokens)) // and once more below
	}
	e.m.hits.Add(float64(hitTokens) * (1 + e.cfg.MetricsHitsOvercount))
	e.m.promptTokens.Add(float64(promptTokens))
	e.m.computedTokens.Add(float64(promptTokens - hitTokens))
	e.statsMu.Lock()
	e.stats.CacheQueryTokens += int64(promptTokens)
	e.stats.CacheHitTokens += int64(hitTokens)
	e.statsMu.Unlock()
}

// engineMetrics are the engine metrics the emulator keeps. Each
// personality exports those its engine has, under the engine's names.
type engineMetrics struct {
	queries, hits            prometheus.Counter // prompt tokens looked up, and found, in the cache
	promptTokens, genTokens  prometheus.Counter
	computedTokens           prometheus.Counter // prompt tokens not found in the cache
	ttft                     prometheus.Histogram
	runningFunc, waitingFunc prometheus.GaugeFunc
}

// metricNames are one personality's metric names; an empty name is not
// exported.
type metricNames struct {
	queries, hits, prompt, computed, gen, ttft, running, waiting string
	modelLabel                                                   bool // model_name on every series
}

var personalityMetrics = [...]metricNames{
	PersonalityVLLM: {queries: "vllm:prefix_cache_queries_total", hits: "vllm:prefix_cache_hits_total",
		prompt: "vllm:prompt_tokens_total", gen: "vllm:generation_tokens_total", ttft: "vllm:time_to_first_token_seconds",
		running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting", modelLabel: true},
	// sglang/srt/metrics/collector.py: prompt_tokens_total counts all
	// prompt tokens, cached_tokens_total those found in the cache.
	PersonalitySGLang: {hits: "sglang:cached_tokens_total", prompt: "sglang:prompt_tokens_total",
		gen: "sglang:generation_tokens_total", ttft: "sglang:time_to_first_token_seconds",
		running: "sglang:num_running_reqs", waiting: "sglang:num_queue_reqs", modelLabel: true},
	// trtllm-serve's /metrics is a JSON array, not Prometheus text; the
	// emulator keeps only its TTFT histogram, and the cache shows in usage.
	PersonalityTRTLLM: {ttft: "trtllm_time_to_first_token_seconds", modelLabel: true},
	// llama.cpp's server (tools/server, since its metrics refactor):
	// prompt_tokens_total excludes cached tokens, which
	// prompt_tokens_cached_total counts; no labels, no TTFT histogram.
	PersonalityLlamaCpp: {computed: "llamacpp:prompt_tokens_total", hits: "llamacpp:prompt_tokens_cached_total",
		gen: "llamacpp:tokens_predicted_total", running: "llamacpp:requests_processing",
		waiting: "llamacpp:requests_deferred"},
}

// registerMetrics creates the metrics and registers the personality's on
// the engine's own registry. The names keep the engines' prefixes so that
// dashboards and the exporter's server-metrics scraper work unchanged;
// colons are legal in Prometheus metric names (meant for recording rules,
// which is why promlint flags them), and the engines use them anyway.
func (e *Engine) registerMetrics() error {
	names := personalityMetrics[e.cfg.Engine]
	var labels prometheus.Labels
	if names.modelLabel {
		labels = prometheus.Labels{"model_name": e.cfg.Model}
	}
	var export []prometheus.Collector
	// Metrics the personality does not export are still kept (unregistered)
	// so that the code counting them needs no checks.
	keep := func(name string, c prometheus.Collector) {
		if name != "" {
			export = append(export, c)
		}
	}
	orUnexported := func(name string) string {
		if name == "" {
			return "kvload_emulator_unexported"
		}
		return name
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: orUnexported(name), Help: help, ConstLabels: labels})
		keep(name, c)
		return c
	}
	e.m.queries = counter(names.queries, "Prompt tokens looked up in the prefix cache.")
	e.m.hits = counter(names.hits, "Prompt tokens found in the prefix cache.")
	e.m.promptTokens = counter(names.prompt, "Prompt tokens of admitted requests, cached or not.")
	e.m.computedTokens = counter(names.computed, "Prompt tokens of admitted requests not found in the prefix cache.")
	e.m.genTokens = counter(names.gen, "Output tokens generated.")
	e.m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:        orUnexported(names.ttft),
		Help:        "Time from arrival to the first output token, queueing included.",
		ConstLabels: labels,
		// Wide enough for a queued long prompt, fine enough for a hit.
		Buckets: []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
			0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560},
	})
	keep(names.ttft, e.m.ttft)
	e.m.runningFunc = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: orUnexported(names.running), Help: "Requests in prefill or decode.", ConstLabels: labels,
	}, func() float64 { r, _ := e.sched.counts(); return float64(r) })
	keep(names.running, e.m.runningFunc)
	e.m.waitingFunc = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: orUnexported(names.waiting), Help: "Requests queued for a running slot.", ConstLabels: labels,
	}, func() float64 { _, w := e.sched.counts(); return float64(w) })
	keep(names.waiting, e.m.waitingFunc)
	if e.cfg.Engine == PersonalityVLLM && !e.cfg.HideCacheConfig {
		export = append(export, newCacheConfigInfo(e))
	}
	if e.cfg.Engine == PersonalityVLLM {
		export = append(export, newVLLMPromptCounters(e))
	}
	// A real server's process start time (vLLM's Python client exports
	// it): a scraper tells an engine restart by it, even when the new
	// counters have already passed the old values.
	started := prometheus.NewGauge(prometheus.GaugeOpts{Name: "process_start_time_seconds", Help: "When the engine started, in seconds since the epoch."})
	started.Set(float64(e.now().UnixNano()) / 1e9)
	export = append(export, started)
	for _, c := range export {
		if err := e.reg.Register(c); err != nil {
			return fmt.Errorf("emulate: register metrics: %w", err)
		}
	}
	return nil
}

// sleepCtx waits for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
