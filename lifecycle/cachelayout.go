package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
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
		Granularity:    engine.For(t.Dialect).Granularity,
	}, known: !t.Cache.CapacityBlocks.Auto(), note: "configured"}
	if !t.Cache.BlockSize.Auto() && !t.Cache.CapacityBlocks.Auto() {
		return tc
	}
	layout, err := discoverLayout(ctx, t, d.targetBaseURL(t))
	if t.Cache.BlockSize.Auto() {
		tc.params.ServerBlock = engine.For(t.Dialect).BlockSize
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
			if !errors.Is(err, engine.ErrNotExposed) {
				why = err.Error()
			}
			level.Warn(d.logger).Log("msg", "the target's KV cache size is unknown, so its theoretical model assumes an unbounded cache and cache efficiency will read low on a healthy server; set cache.capacity_blocks (and cache.block_size) for it, or reload once it answers",
				"target", t.Name, "reason", why)
		}
	}
	return tc
}

// discoverLayout reads the KV cache layout of t, answering at url, within
// discoverTimeout. Its error wraps engine.ErrNotExposed when t's engine
// does not say.
func discoverLayout(ctx context.Context, t *config.Target, url string) (engine.Layout, error) {
	spec := engine.For(t.Dialect)
	if !spec.ExposesLayout() {
		return engine.Layout{}, engine.ErrNotExposed
	}
	client, err := targetHTTPClient(t, "kvload_cache_discovery")
	if err != nil {
		return engine.Layout{}, fmt.Errorf("target %s: cache discovery client: %w", t.Name, err)
	}
	defer client.CloseIdleConnections()
	dctx, cancel := context.WithTimeout(ctx, discoverTimeout)
	defer cancel()
	layout, err := spec.ReadLayout(dctx, client, url)
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

// logUnreported is the cache-truth step's NotifyUnreported.
func (d *Daemon) logUnreported(target string, dialect engine.Dialect) {
	level.Warn(d.logger).Log("msg", "responses carry no cached-token count: their requests count on neither side of the cache efficiency, shown as not reported",
		"target", target, "what_to_do", engine.For(dialect).UnreportedAdvice)
}
