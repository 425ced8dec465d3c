package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/kvcapacity"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// discoverTimeout bounds reading one target's cache size at a (re)load.
const discoverTimeout = 3 * time.Second

// targetCache is the cache a target's theoretical model stands for.
type targetCache struct {
	fingerprint string
	params      replay.CacheParams // TraceBlock is the workload's, set per unit
	known       bool               // capacity configured or read from the target
	note        string             // how the figures were found, for the landing page
	// chatTemplate is the target's chat template size, when its tokenize
	// endpoint measured it (chatTemplateKnown); chat units start with it.
	chatTemplate      int
	chatTemplateKnown bool
}

// dialectBlockSize is each engine's default KV block (page) size, used when
// block_size is auto and the target does not say.
func dialectBlockSize(dialect replay.Dialect) int {
	switch dialect {
	case replay.DialectSGLang, replay.DialectLlamaCpp:
		return 1
	case replay.DialectTRTLLM:
		return 32
	}
	return 16
}

// dialectGranularity is how each engine rounds a cache hit. TensorRT-LLM
// reuses partial blocks, but it stores only the full blocks of a prompt's
// first ISL-1 tokens: a hit can end inside a block only where a new prompt
// is shorter than a cached one, so whole blocks are the closer model (its
// emulation and TestE2ECacheTruthGranularity agree).
func dialectGranularity(dialect replay.Dialect) replay.CacheGranularity {
	switch dialect {
	case replay.DialectSGLang, replay.DialectLlamaCpp:
		return replay.GranularityToken
	}
	return replay.GranularityBlock
}

// applyCaches settles, for every target of cfg whose configuration changed,
// the cache its model stands for: configured values as they are, auto ones
// read from the target (all targets at once, each within discoverTimeout).
// A capacity that is neither is unknown: the model is unbounded and the
// user is told once, with the key to set.
func (d *Daemon) applyCaches(ctx context.Context, cfg *config.Config) {
	next := map[string]targetCache{}
	type template struct {
		tokens int
		known  bool
	}
	templates := map[string]template{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		fp := cfg.Fingerprint("target", t.Name) + "\x00" + d.emulatorURL(t.Name)
		if old, ok := d.caches[t.Name]; ok && old.fingerprint == fp {
			// Under mu too: the goroutines of earlier targets write next.
			mu.Lock()
			next[t.Name] = old
			mu.Unlock()
			continue
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			tc := d.settleCache(ctx, t, fp)
			mu.Lock()
			next[t.Name] = tc
			mu.Unlock()
		}()
		// The same moment and bound suit the tokenizer check.
		go func() {
			defer wg.Done()
			n, known := d.checkTokenizer(ctx, t)
			mu.Lock()
			templates[t.Name] = template{n, known}
			mu.Unlock()
		}()
	}
	wg.Wait()
	for name, tpl := range templates {
		tc := next[name]
		tc.chatTemplate, tc.chatTemplateKnown = tpl.tokens, tpl.known
		next[name] = tc
	}
	d.caches = next
	for name, tc := range next {
		d.coll.SetTargetCache(name, tc.params.CapacityBlocks, tc.params.ServerBlock, tc.known)
	}
}

func (d *Daemon) settleCache(ctx context.Context, t *config.Target, fp string) targetCache {
	tc := targetCache{fingerprint: fp, params: replay.CacheParams{
		ServerBlock:    t.Cache.BlockSize.N,
		CapacityBlocks: t.Cache.CapacityBlocks.N,
		Granularity:    dialectGranularity(t.Dialect),
	}, known: !t.Cache.CapacityBlocks.Auto(), note: "configured"}
	if !t.Cache.BlockSize.Auto() && !t.Cache.CapacityBlocks.Auto() {
		return tc
	}
	layout, err := discoverLayout(ctx, t, d.targetBaseURL(t))
	if t.Cache.BlockSize.Auto() {
		tc.params.ServerBlock = dialectBlockSize(t.Dialect)
		if err == nil {
			tc.params.ServerBlock = layout.BlockSize
		}
	}
	if t.Cache.CapacityBlocks.Auto() {
		if err == nil {
			tc.params.CapacityBlocks, tc.known, tc.note = layout.Blocks, true, "read from "+layout.Source
		} else {
			tc.params.CapacityBlocks, tc.note = 0, "unknown: set cache.capacity_blocks"
			why := "its engine does not expose it"
			if !errors.Is(err, kvcapacity.ErrNotExposed) {
				why = err.Error()
			}
			level.Warn(d.logger).Log("msg", "the target's KV cache size is unknown, so its theoretical model assumes an unbounded cache and cache efficiency will read low on a healthy server; set cache.capacity_blocks (and cache.block_size) for it, or reload once it answers",
				"target", t.Name, "reason", why)
		}
	}
	return tc
}

// discoverLayout reads the KV cache layout of t, answering at url, within
// discoverTimeout. Its error wraps kvcapacity.ErrNotExposed when t's engine
// does not say.
func discoverLayout(ctx context.Context, t *config.Target, url string) (kvcapacity.Layout, error) {
	if !kvcapacity.Exposed(t.Dialect) {
		return kvcapacity.Layout{}, kvcapacity.ErrNotExposed
	}
	client, err := targetHTTPClient(t, "kvload_cache_discovery")
	if err != nil {
		return kvcapacity.Layout{}, fmt.Errorf("target %s: cache discovery client: %w", t.Name, err)
	}
	defer client.CloseIdleConnections()
	dctx, cancel := context.WithTimeout(ctx, discoverTimeout)
	defer cancel()
	layout, err := kvcapacity.Discover(dctx, client, url, t.Dialect)
	if err != nil {
		return layout, fmt.Errorf("target %s: cache discovery: %w", t.Name, err)
	}
	return layout, nil
}

// targetBaseURL is where a target answers: its url, or its emulator's.
func (d *Daemon) targetBaseURL(t *config.Target) string {
	if t.Emulate != nil {
		return d.emulatorURL(t.Name)
	}
	return t.URL
}

// unreportedAdvice says what makes a target report cached tokens.
func unreportedAdvice(dialect replay.Dialect) string {
	switch dialect {
	case replay.DialectVLLM:
		return "start vLLM with --enable-prompt-tokens-details, or set cache.observed: server_metrics"
	case replay.DialectSGLang:
		return "start SGLang with --enable-cache-report, or set cache.observed: server_metrics"
	case replay.DialectTRTLLM, replay.DialectDynamo, replay.DialectLlamaCpp:
		return "set cache.observed: server_metrics to read the engine's own counter"
	}
	return "the server reports no cached tokens; cache efficiency is not computed for it (the cache-class TTFT signal still works)"
}

// logUnreported is the collector's NotifyUnreported.
func (d *Daemon) logUnreported(target string, dialect replay.Dialect) {
	level.Warn(d.logger).Log("msg", "responses carry no cached-token count: their requests count on neither side of the cache efficiency, shown as not reported",
		"target", target, "what_to_do", unreportedAdvice(dialect))
}
