package emulate

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults applied by New to zero fields where zero has no useful meaning.
const (
	DefaultModel        = "kvload-emulated"
	DefaultBlockSize    = 16 // vLLM's default KV block size
	DefaultSlots        = 1  // llama.cpp slots in the llamacpp personality
	DefaultMaxRunning   = 256
	DefaultMaxModelLen  = 262144
	DefaultMaxBodyBytes = 64 << 20
	// DefaultSlowFirstTokenDelay is the extra prefill time of the
	// slow-first-token fault when its delay is left at zero.
	DefaultSlowFirstTokenDelay = time.Second
)

// Demo timings of DefaultConfig, roughly a small model on one GPU. New
// keeps zero durations as zero (no delay), which is what tests want.
const (
	DefaultOverhead        = 2 * time.Millisecond
	DefaultPrefillPerToken = 20 * time.Microsecond
	DefaultInterToken      = 10 * time.Millisecond
)

// Config describes one emulated engine. The zero value is valid: New fills
// in the model name, block size, max running, max model length and body
// limit, and keeps every duration at zero, so responses come back at once.
// DefaultConfig has demo timings instead.
type Config struct {
	// Model is the served model name; requests naming another model get
	// a 404 like vLLM's. Empty model fields in requests are accepted.
	Model string `yaml:"model"`
	// MaxModelLen bounds prompt plus output tokens (400 beyond it).
	MaxModelLen int `yaml:"max_model_len"`
	// MaxBodyBytes bounds a request body (413 beyond it).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`

	// Engine is the engine imitated (vllm, the default; sglang; trtllm;
	// llamacpp): it decides the cache's granularity, the metric names and
	// the capacity endpoints (see Personality).
	Engine Personality `yaml:"engine"`
	// BlockSize is the prefix cache's block size in tokens; 0 picks the
	// engine's default (vllm 16, sglang 1, trtllm 32). The llamacpp
	// personality matches tokens one by one and rejects other sizes.
	BlockSize int `yaml:"block_size"`
	// CapacityBlocks bounds the prefix cache, evicting least recently
	// used blocks; 0 means unbounded. Not for llamacpp, which has Slots.
	CapacityBlocks int `yaml:"capacity_blocks"`
	// Slots is the number of llama.cpp slots (llamacpp only; default 1).
	// Each keeps the last prompt it ran; a request reuses the prefix it
	// shares with its slot's prompt.
	Slots int `yaml:"slots"`
	// CacheRAMTokens sizes the llamacpp host prompt cache in tokens, where
	// idle slots' prompts are kept and restored from (llama-server's
	// --cache-ram, on by default): 0 picks DefaultCacheRAMTokens, -1 turns
	// it off as --cache-ram 0 does, and slots then keep their prompts.
	CacheRAMTokens int `yaml:"cache_ram_tokens"`
	// HideCacheConfig leaves out the capacity the engine would export
	// (vllm: vllm:cache_config_info; sglang: GET /get_server_info), as
	// an engine whose capacity cannot be read. Not for trtllm and llamacpp,
	// which export none.
	HideCacheConfig bool `yaml:"hide_cache_config"`
	// BOS prepends a beginning-of-sequence token (o200k_base's
	// <|endoftext|>, id 199999) to every prompt given as text, chat
	// messages included, as Llama tokenizers do. Every such prompt then
	// shares at least that token with every other, which the llamacpp
	// personality reports as cached even for unrelated prompts. Prompts
	// sent as token ids are taken as they are, as vLLM and llama.cpp do.
	BOS bool `yaml:"bos"`
	// DisablePrefixCache starts with the cache off (no hits), like vLLM's
	// --no-enable-prefix-caching. It can be turned on at run time.
	DisablePrefixCache bool `yaml:"disable_prefix_cache"`
	// OmitCachedTokens sends "prompt_tokens_details": null in usage, as
	// vLLM does without --enable-prompt-tokens-details.
	OmitCachedTokens bool `yaml:"omit_cached_tokens"`
	// KVEvents publishes the prefix cache's KV events (blocks stored and
	// removed, the cache cleared) in vLLM's wire format on a ZMQ PUB socket
	// bound to this endpoint, tcp://host:port (port 0 picks one; see
	// Engine.KVEventsEndpoint); empty publishes none. Not for llamacpp,
	// whose cache has no blocks.
	KVEvents string `yaml:"kv_events"`
	// KVEventsTopic is the first frame of every event message (vLLM's
	// topic, empty by default).
	KVEventsTopic string `yaml:"kv_events_topic"`
	// KVEventsFormat encodes each event as a tagged map (map, vLLM's
	// encoding now, the default) or a tagged array (array, its older one).
	KVEventsFormat KVEventsFormat `yaml:"kv_events_format"`
	// KVEventsReplayEndpoint binds a replay socket as vLLM's
	// replay_endpoint does (a ZMQ ROUTER, tcp://host:port, port 0 picks
	// one; see Engine.KVEventsReplayEndpoint): it answers a starting
	// sequence number with the last KVEventsReplayBatches batches from it
	// on, in vLLM's layout since v0.26.0. Needs KVEvents.
	KVEventsReplayEndpoint string `yaml:"kv_events_replay_endpoint"`
	// KVEventsDrop is the share of event batches, in [0, 1], not sent to
	// the subscribers (each drawn from Seed), as a publisher past its
	// high-water mark drops them: a subscriber sees a gap. The replay
	// socket keeps them.
	KVEventsDrop float64 `yaml:"kv_events_drop"`
	// MetricsDoubleCountHits counts every cache hit twice in the hit
	// counters of /metrics (vllm: its prefix_cache_hits and its
	// per-request cached counts alike), the prompt-token counters staying
	// right, as vLLM's did when it retried an admission and when it
	// counted preempted tokens as hits. Usage and Stats stay true.
	MetricsDoubleCountHits bool `yaml:"metrics_double_count_hits"`
	// HoldAbandonedSlots keeps generating for a client that closed its
	// stream, holding the request's running slot until its output would
	// have ended, as an engine that misses the disconnect does; by
	// default the slot is freed at once.
	HoldAbandonedSlots bool `yaml:"hold_abandoned_slots"`
	// MetricsHitsOvercount is the share of its cache hits that the hit
	// counter of /metrics counts once more (0.5: it reads 1.5 times the
	// hits), as vLLM's vllm:prefix_cache_hits_total counts a preempted
	// request's lookup again (vLLM issue 25780). vLLM's per-request
	// counts (vllm:prompt_tokens_cached_total and
	// vllm:prompt_tokens_by_source_total), usage and Stats stay true.
	MetricsHitsOvercount float64 `yaml:"metrics_hits_overcount"`

	// MaxRunning is how many sequences prefill or decode at once; later
	// requests wait in a FIFO queue (vllm:num_requests_waiting). 0 picks
	// DefaultMaxRunning, or Slots in the llamacpp personality.
	MaxRunning int `yaml:"max_running"`
	// Overhead is the fixed part of the time to first token.
	Overhead time.Duration `yaml:"overhead"`
	// PrefillPerToken is added to the time to first token for every
	// prompt token not found in the prefix cache.
	PrefillPerToken time.Duration `yaml:"prefill_per_token"`
	// InterToken is the time between two output tokens.
	InterToken time.Duration `yaml:"inter_token"`

	// Faults are injected with the given probabilities.
	Faults Faults `yaml:"faults"`
	// Seed seeds the fault RNG, so a run's faults are reproducible for a
	// given arrival order.
	Seed uint64 `yaml:"seed"`
}

// Faults are per-request probabilities in [0, 1]. One draw per request
// picks at most one of the exclusive faults (Error500, Error429,
// Disconnect, Malformed, Hang), so their sum must not exceed 1;
// SlowFirstToken is drawn separately and combines with any outcome that
// reaches prefill.
type Faults struct {
	// Error500 answers 500 with vLLM's nested error body, before any work.
	Error500 float64 `yaml:"error_500"`
	// Error429 answers 429 (rate limited), before any work.
	Error429 float64 `yaml:"error_429"`
	// Disconnect closes the connection after AfterTokens tokens.
	Disconnect float64 `yaml:"disconnect"`
	// Malformed writes "data: {not json" after AfterTokens tokens and ends
	// the stream without [DONE] (a truncated JSON body when not streaming).
	Malformed float64 `yaml:"malformed"`
	// Hang sends the response headers and then nothing until the client
	// goes away.
	Hang float64 `yaml:"hang"`
	// SlowFirstToken adds SlowFirstTokenDelay to the prefill.
	SlowFirstToken float64 `yaml:"slow_first_token"`
	// SlowFirstTokenDelay defaults to DefaultSlowFirstTokenDelay.
	SlowFirstTokenDelay time.Duration `yaml:"slow_first_token_delay"`
	// AfterTokens is how many output tokens go out before a disconnect or
	// malformed fault; 0 means half of the requested output.
	AfterTokens int `yaml:"after_tokens"`
}

// DefaultConfig returns the demo configuration: the defaults of New plus
// the Default* timings. BlockSize and MaxRunning stay 0, so that New picks
// the engine's defaults.
func DefaultConfig() Config {
	return Config{
		Model:           DefaultModel,
		MaxModelLen:     DefaultMaxModelLen,
		MaxBodyBytes:    DefaultMaxBodyBytes,
		Overhead:        DefaultOverhead,
		PrefillPerToken: DefaultPrefillPerToken,
		InterToken:      DefaultInterToken,
	}
}

// withDefaults fills the zero fields that have a default and reports
// every invalid field at once.
func (c Config) withDefaults() (Config, error) {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = DefaultMaxModelLen
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	var errs []error
	if _, err := c.Engine.MarshalText(); err != nil {
		errs = append(errs, fmt.Errorf("engine: %w", err))
	}
	if c.BlockSize == 0 {
		c.BlockSize = c.Engine.defaultBlockSize()
	}
	c, engineErrs := c.engineDefaults()
	errs = append(errs, engineErrs...)
	c, eventErrs := c.kvEventsDefaults()
	errs = append(errs, eventErrs...)
	if c.MaxRunning == 0 {
		c.MaxRunning = DefaultMaxRunning
	}
	positive := func(name string, v int64) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %d", name, v))
		}
	}
	positive("max_model_len", int64(c.MaxModelLen))
	positive("max_body_bytes", c.MaxBodyBytes)
	positive("block_size", int64(c.BlockSize))
	positive("capacity_blocks", int64(c.CapacityBlocks))
	if c.CapacityBlocks > maxCacheBlocks {
		errs = append(errs, fmt.Errorf("capacity_blocks must be at most %d, got %d", maxCacheBlocks, c.CapacityBlocks))
	}
	positive("slots", int64(c.Slots))
	if !(c.MetricsHitsOvercount >= 0 && c.MetricsHitsOvercount <= maxHitsOvercount) {
		errs = append(errs, fmt.Errorf("metrics_hits_overcount must be within 0 to %d, got %v", maxHitsOvercount, c.MetricsHitsOvercount))
	}
	positive("max_running", int64(c.MaxRunning))
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"overhead", c.Overhead}, {"prefill_per_token", c.PrefillPerToken}, {"inter_token", c.InterToken}} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %v", d.name, d.d))
		}
	}
	f, err := c.Faults.withDefaults()
	if err != nil {
		errs = append(errs, err)
	}
	c.Faults = f
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("emulate: invalid config: %w", err)
	}
	return c, nil
}

// engineDefaults fills and checks the keys that depend on the engine.
func (c Config) engineDefaults() (Config, []error) {
	var errs []error
	if c.Engine == PersonalityLlamaCpp {
		if c.Slots == 0 {
			c.Slots = DefaultSlots
		}
		if c.MaxRunning == 0 {
			// llama.cpp runs one sequence per slot.
			c.MaxRunning = c.Slots
		}
		if c.BlockSize != 1 {
			errs = append(errs, fmt.Errorf("block_size must be 1 (or unset) for engine llamacpp, got %d", c.BlockSize))
		}
		if c.CapacityBlocks != 0 {
			errs = append(errs, errors.New("capacity_blocks does not apply to engine llamacpp: set slots"))
		}
		switch {
		case c.CacheRAMTokens == 0:
			c.CacheRAMTokens = DefaultCacheRAMTokens
		case c.CacheRAMTokens < -1:
			errs = append(errs, fmt.Errorf("cache_ram_tokens must be -1 (off), 0 (the default) or positive, got %d", c.CacheRAMTokens))
		}
	} else {
		if c.Slots != 0 {
			errs = append(errs, fmt.Errorf("slots only applies to engine llamacpp, not %s", c.Engine))
		}
		if c.CacheRAMTokens != 0 {
			errs = append(errs, fmt.Errorf("cache_ram_tokens only applies to engine llamacpp, not %s", c.Engine))
		}
	}
	if c.HideCacheConfig && c.Engine != PersonalityVLLM && c.Engine != PersonalitySGLang {
		errs = append(errs, fmt.Errorf("hide_cache_config only applies to engines vllm and sglang, which export their capacity; %s exports none", c.Engine))
	}
	return c, errs
}

// kvEventsDefaults fills and checks the KV events keys.
func (c Config) kvEventsDefaults() (Config, []error) {
	var errs []error
	switch c.KVEventsFormat {
	case "":
		c.KVEventsFormat = KVEventsMap
	case KVEventsMap, KVEventsArray:
	default:
		errs = append(errs, fmt.Errorf("kv_events_format must be map or array, got %q", c.KVEventsFormat))
	}
	if math.IsNaN(c.KVEventsDrop) || c.KVEventsDrop < 0 || c.KVEventsDrop > 1 {
		errs = append(errs, fmt.Errorf("kv_events_drop must be within [0, 1], got %v", c.KVEventsDrop))
	}
	if c.KVEvents == "" {
		if c.KVEventsReplayEndpoint != "" || c.KVEventsDrop != 0 {
			errs = append(errs, errors.New("kv_events_replay_endpoint and kv_events_drop need kv_events"))
		}
		return c, errs
	}
	if _, err := kvAddress(c.KVEvents); err != nil {
		errs = append(errs, err)
	}
	if c.KVEventsReplayEndpoint != "" {
		if _, err := kvAddress(c.KVEventsReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("kv_events_replay_endpoint: %w", err))
		}
	}
	if c.Engine == PersonalityLlamaCpp {
		errs = append(errs, errors.New("kv_events does not apply to engine llamacpp, whose cache has no blocks"))
	}
	return c, errs
}

// withDefaults validates the probabilities and fills the slow delay.
func (f Faults) withDefaults() (Faults, error) {
	var errs []error
	sum := 0.0
	for _, p := range []struct {
		name string
		p    float64
	}{
		{"error_500", f.Error500}, {"error_429", f.Error429}, {"disconnect", f.Disconnect},
		{"malformed", f.Malformed}, {"hang", f.Hang}, {"slow_first_token", f.SlowFirstToken},
	} {
		if math.IsNaN(p.p) || p.p < 0 || p.p > 1 {
			errs = append(errs, fmt.Errorf("faults.%s must be within [0, 1], got %v", p.name, p.p))
		}
		if p.name != "slow_first_token" {
			sum += p.p
		}
	}
	// A little slack for decimal fractions such as 0.1+0.2+0.7.
	if sum > 1+1e-9 {
		errs = append(errs, fmt.Errorf("faults: error_500+error_429+disconnect+malformed+hang must not exceed 1, got %v", sum))
	}
	if f.SlowFirstTokenDelay < 0 {
		errs = append(errs, fmt.Errorf("faults.slow_first_token_delay must not be negative, got %v", f.SlowFirstTokenDelay))
	}
	if f.SlowFirstTokenDelay == 0 {
		f.SlowFirstTokenDelay = DefaultSlowFirstTokenDelay
	}
	if f.AfterTokens < 0 {
		errs = append(errs, fmt.Errorf("faults.after_tokens must not be negative, got %d", f.AfterTokens))
	}
	return f, errors.Join(errs...)
}
