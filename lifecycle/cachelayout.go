package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kit/log/level"
	"golang.org/x/sync/errgroup"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// discoverTimeout bounds one read of a target's cache layout.
const discoverTimeout = 3 * time.Second

// How often a target's layout is read again (see discoverySchedule): with
// reads at most discoverRetryMax apart while it fails, a target that comes
// up is read within discoverRetryMax + discoverTimeout, under the two
// minutes promised, and at once when a request finds it answering.
const (
	discoverRetry    = 15 * time.Second
	discoverRetryMax = 30 * time.Second
	discoverRefresh  = 5 * time.Minute
)

// discoverySchedule is when a target's layout is read again after a read:
// retry after the first failure, twice as long after each further one up
// to retryMax, and refresh after a success.
type discoverySchedule struct {
	retry, retryMax, refresh time.Duration
	// ignoreAnswers, for tests, keeps a request's answer from hastening
	// the read of a target that was down: only the schedule reads.
	ignoreAnswers bool
}

var defaultDiscovery = discoverySchedule{retry: discoverRetry, retryMax: discoverRetryMax, refresh: discoverRefresh}

// wait is the time before the next read, after failures reads in a row
// failed (0: the last one succeeded).
func (s discoverySchedule) wait(failures int) time.Duration {
	if failures == 0 {
		return s.refresh
	}
	d := s.retry
	for i := 1; i < failures && d < s.retryMax; i++ {
		d *= 2
	}
	return min(d, s.retryMax)
}

// targetCache is the cache a target's theoretical model stands for.
type targetCache struct {
	fingerprint string
	params      replay.CacheParams // TraceBlock is the workload's, set per unit
	known       bool               // capacity configured or read from the target
	note        string             // how the figures were found, for the landing page
	// read: the auto values are the target's, as its last read said;
	// false while they are defaults, or the last read failed.
	read bool
	// lost: a read failed after one had succeeded, and the log said so.
	lost bool
	// chatTemplate is the target's chat template size, when its tokenize
	// endpoint measured it (chatTemplateKnown); chat units start with it.
	chatTemplate      int
	chatTemplateKnown bool
}

// watchesLayout tells whether t's layout is read from it, and so read
// again at run time.
func watchesLayout(t *config.Target) bool {
	return (t.Cache.BlockSize.Auto() || t.Cache.CapacityBlocks.Auto()) && engine.For(t.Dialect).ExposesLayout()
}

// layoutSet is the part that settles the cache each target's model
// stands for, and runs a watch that reads it again for each target whose
// layout is read from it.
type layoutSet struct {
	*common
	emulators *emulatorSet
	units     *unitSet // their models follow a layout that changed
	// show puts a target's cache on the landing page.
	show func(target string, tc targetCache)
	// discovery is when targets' cache layouts are read again.
	discovery discoverySchedule

	caches   map[string]targetCache
	watches  map[string]*layoutWatch // by target
	readings chan layoutReading      // from the watches, to the owner goroutine
}

func newLayoutSet(c *common, discovery discoverySchedule, emulators *emulatorSet, units *unitSet, show func(string, targetCache)) *layoutSet {
	if discovery == (discoverySchedule{}) {
		discovery = defaultDiscovery
	}
	return &layoutSet{common: c, emulators: emulators, units: units, show: show, discovery: discovery,
		caches: map[string]targetCache{}, watches: map[string]*layoutWatch{}, readings: make(chan layoutReading)}
}

// maxTargetReads bounds the reads of targets that a (re)load makes at
// once (cache layouts, tokenize checks): each holds a connection and its
// answer's parse, so that a configuration of many targets neither opens
// a connection to each at once nor holds all their answers together.
// With N targets whose reads all hang, a load waits ⌈2N / maxTargetReads⌉
// × discoverTimeout before it is applied (two reads a target); the web
// server answers meanwhile, and the shutdown ends the reads.
const maxTargetReads = 32

// apply settles, for every target of cfg whose configuration changed,
// the cache its model stands for: configured values as they are, auto ones
// read from the target (at most maxTargetReads reads at once, each within
// discoverTimeout). A capacity that is neither is unknown: the model is
// unbounded and the user is told once, with the key to set. A target whose
// configuration did not change is read again if its last read failed.
// Each target whose layout is read gets a watch, under unitCtx, that reads
// it again at run time. The reads end when ctx does (the shutdown): then
// nothing is applied and ctx's error returned.
func (l *layoutSet) apply(ctx, unitCtx context.Context, next *nextConfig) error {
	cfg := next.cfg
	l.stop(next)
	settledCaches := map[string]targetCache{}
	templates := map[string]template{}
	settled := map[string]error{}         // targets read anew: the read's error
	rereads := map[string]layoutReading{} // unchanged targets read again
	var mu sync.Mutex
	var reads errgroup.Group
	reads.SetLimit(maxTargetReads)
	// read runs f unless the shutdown began; Go waits for a free slot.
	read := func(f func()) {
		reads.Go(func() error {
			if ctx.Err() == nil {
				f()
			}
			return nil
		})
	}
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		fp := cfg.Fingerprint("target", t.Name) + "\x00" + l.emulators.url(t.Name)
		if old, ok := l.caches[t.Name]; ok && old.fingerprint == fp {
			// Under mu too: the goroutines of earlier targets write settledCaches.
			mu.Lock()
			settledCaches[t.Name] = old
			mu.Unlock()
			if watchesLayout(t) && !old.read {
				url := l.emulators.baseURL(t)
				read(func() {
					r := readLayout(ctx, t, url)
					mu.Lock()
					rereads[t.Name] = r
					mu.Unlock()
				})
			}
			continue
		}
		read(func() {
			tc, err := l.settle(ctx, t, fp)
			mu.Lock()
			settledCaches[t.Name], settled[t.Name] = tc, err
			mu.Unlock()
		})
		// The same moment and bound suit the tokenizer check.
		read(func() {
			n, known := l.checkTokenizer(ctx, t)
			mu.Lock()
			templates[t.Name] = template{n, known}
			mu.Unlock()
		})
	}
	_ = reads.Wait() // the reads report through the maps, never an error
	if err := ctx.Err(); err != nil {
		return err
	}
	for name, tpl := range templates {
		tc := settledCaches[name]
		tc.chatTemplate, tc.chatTemplateKnown = tpl.tokens, tpl.known
		settledCaches[name] = tc
	}
	l.caches = settledCaches
	for name, r := range rereads {
		t, _ := cfg.Target(name)
		l.applyReading(t, r)
	}
	for name, tc := range l.caches {
		l.coll.SetTargetCache(name, tc.params.CapacityBlocks, tc.params.ServerBlock, tc.known)
	}
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		l.coll.SetEstimateWindow(t.Name, time.Duration(t.Cache.EstimateWindow))
	}
	l.startWatches(unitCtx, cfg, settled)
	return nil
}

// template is a chat template's size as the tokenizer check measured it.
type template struct {
	tokens int
	known  bool
}

// settle is the cache of t, whose configuration is new: configured
// values, and auto ones read from t. The error is the read's.
func (l *layoutSet) settle(ctx context.Context, t *config.Target, fp string) (targetCache, error) {
	tc := configuredCache(t, fp)
	if !t.Cache.BlockSize.Auto() && !t.Cache.CapacityBlocks.Auto() {
		return tc, nil
	}
	layout, err := discoverLayout(ctx, t, l.emulators.baseURL(t))
	if err == nil {
		return tc.withLayout(t, layout), nil
	}
	if ctx.Err() != nil {
		return tc, err // shutting down: the read says nothing of the target
	}
	if !errors.Is(err, engine.ErrNotExposed) {
		l.coll.CacheLayout().DiscoveryFailed(t.Name, engine.LayoutFailureOf(err))
	}
	if errors.Is(err, engine.ErrImplausibleLayout) {
		// Taken as true, such a size overflowed the model, or made one
		// that never evicts: the values read are refused, as unknown.
		tc.note = "configured; the block size read is implausible, the engine's is used"
		if t.Cache.CapacityBlocks.Auto() {
			tc.note = "unknown: the layout read is implausible; set cache.capacity_blocks and cache.block_size"
		}
		level.Warn(l.logger).Log("msg", "the target reports a KV cache layout no server has: it is refused, and its model takes the configured values, else an unknown (unbounded) capacity and the engine's block size",
			"target", t.Name, "reason", err, "what_to_do", "set cache.capacity_blocks and cache.block_size for it")
		return tc, err
	}
	if t.Cache.CapacityBlocks.Auto() {
		why, then := "its engine does not expose it", "set cache.capacity_blocks (and cache.block_size) for it"
		if !errors.Is(err, engine.ErrNotExposed) {
			why, then = err.Error(), "it is read again until the target answers, or set cache.capacity_blocks (and cache.block_size) for it"
			tc.note = "unknown: read again until the target answers, or set cache.capacity_blocks"
		}
		level.Warn(l.logger).Log("msg", "the target's KV cache size is unknown, so its theoretical model assumes an unbounded cache and cache efficiency will read low on a healthy server; "+then,
			"target", t.Name, "reason", why)
	}
	return tc, err
}

// configuredCache is the cache of t before anything is read from it: the
// configured values, the engine's default block size, and an unknown
// capacity where it is auto.
func configuredCache(t *config.Target, fp string) targetCache {
	tc := targetCache{fingerprint: fp, params: replay.CacheParams{
		ServerBlock:    t.Cache.BlockSize.N,
		CapacityBlocks: t.Cache.CapacityBlocks.N,
		Granularity:    engine.For(t.Dialect).Granularity,
	}, known: true, note: "configured"}
	if t.Cache.BlockSize.Auto() {
		tc.params.ServerBlock = engine.For(t.Dialect).BlockSize
	}
	if t.Cache.CapacityBlocks.Auto() {
		tc.params.CapacityBlocks, tc.known, tc.note = 0, false, "unknown: set cache.capacity_blocks"
	}
	return tc
}

// withLayout is tc with t's auto values taken from layout, read from t.
func (tc targetCache) withLayout(t *config.Target, layout engine.Layout) targetCache {
	if t.Cache.BlockSize.Auto() {
		tc.params.ServerBlock = layout.BlockSize
	}
	if t.Cache.CapacityBlocks.Auto() {
		tc.params.CapacityBlocks, tc.known = layout.Blocks, true
		tc.note = "read from " + layout.Source
	} else {
		tc.note = "configured; block size read from " + layout.Source
	}
	tc.read = true
	return tc
}

// describe says what the model stands for, for logs and the landing page.
func (tc targetCache) describe() string {
	switch {
	case !tc.known:
		return fmt.Sprintf("unknown capacity, %d-token blocks", tc.params.ServerBlock)
	case tc.params.CapacityBlocks == 0:
		return fmt.Sprintf("unbounded, %d-token blocks", tc.params.ServerBlock)
	}
	return fmt.Sprintf("%d blocks of %d tokens", tc.params.CapacityBlocks, tc.params.ServerBlock)
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

// layoutReading is one read of a target's layout at run time.
type layoutReading struct {
	watch  *layoutWatch // the watch that read it; nil for a reload's read
	layout engine.Layout
	err    error
	at     time.Time
}

// readLayout reads t's layout, at url, now.
func readLayout(ctx context.Context, t *config.Target, url string) layoutReading {
	layout, err := discoverLayout(ctx, t, url)
	return layoutReading{layout: layout, err: err, at: time.Now()}
}

// applyReading takes a run-time read of t's layout, on the owner
// goroutine. A failure is counted and keeps what the model stands for; a
// layout other than the model's (or a capacity known at last) is logged,
// counted and shown, and the models of t's units follow it from their
// next row on.
func (l *layoutSet) applyReading(t *config.Target, r layoutReading) {
	old := l.caches[t.Name]
	if r.err != nil {
		l.coll.CacheLayout().DiscoveryFailed(t.Name, engine.LayoutFailureOf(r.err))
		if old.read {
			level.Warn(l.logger).Log("msg", "the target's KV cache layout could not be read again; its model keeps the last one read, and it is read again soon",
				"target", t.Name, "model", old.describe(), "err", r.err)
			old.lost = true
		} else {
			level.Debug(l.logger).Log("msg", "the target's KV cache layout is still unknown", "target", t.Name, "err", r.err)
		}
		old.read = false
		l.caches[t.Name] = old
		return
	}
	if old.lost {
		level.Info(l.logger).Log("msg", "the target's KV cache layout is read again", "target", t.Name)
	}
	tc := old.withLayout(t, r.layout)
	tc.lost = false
	if tc.params == old.params && tc.known == old.known {
		old.read, old.lost = true, false // its note keeps an earlier change
		l.caches[t.Name] = old
		return
	}
	tc.note += fmt.Sprintf(", changed from %s to %s at %s", old.describe(), tc.describe(), r.at.UTC().Format(time.RFC3339))
	l.caches[t.Name] = tc
	level.Info(l.logger).Log("msg", "the target's KV cache layout changed; its theoretical model follows from the next request on",
		"target", t.Name, "source", r.layout.Source, "old", old.describe(), "new", tc.describe())
	l.units.followCache(t.Name, tc.params)
	l.coll.CacheLayout().Changed(t.Name)
	l.coll.SetTargetCache(t.Name, tc.params.CapacityBlocks, tc.params.ServerBlock, tc.known)
	l.show(t.Name, tc)
}

// layoutWatch reads one target's layout again and again, in a goroutine
// of its own, and hands each reading to the owner goroutine.
type layoutWatch struct {
	target      config.Target // a copy: the configuration it was started for
	fingerprint string
	read        func(ctx context.Context) layoutReading
	schedule    discoverySchedule
	newTimer    func(time.Duration) (<-chan time.Time, func() bool)
	// down is set while the target did not answer the last scheduled
	// read: the next answer to a request (answered) asks for a read at
	// once, through recovered.
	down      atomic.Bool
	recovered chan struct{} // capacity 1
	cancel    context.CancelFunc
	done      chan struct{} // closed when run returned
}

// observe tells the watch of each answer of its target's: an answer
// after a read found the target down asks for a read at once.
func (w *layoutWatch) observe(r *replay.Result) {
	if targetAnswered(r.Outcome) {
		w.answered()
	}
}

// answered is told that the target answered a request; it is called for
// every answer, so it costs one atomic load when nothing is to be done.
func (w *layoutWatch) answered() {
	if w.down.Load() && w.down.CompareAndSwap(true, false) {
		select {
		case w.recovered <- struct{}{}:
		default:
		}
	}
}

// run reads on the schedule, starting after a read that failures reads in
// a row failed, and hands each reading to report, until ctx is done or
// report says to stop.
func (w *layoutWatch) run(ctx context.Context, failures int, report func(context.Context, layoutReading) bool) {
	defer close(w.done)
	for {
		c, stop := w.newTimer(w.schedule.wait(failures))
		hastened := false
		select {
		case <-ctx.Done():
			stop()
			return
		case <-c:
		case <-w.recovered:
			stop()
			hastened = true
		}
		r := w.read(ctx)
		if ctx.Err() != nil {
			return // stopped during the read: it says nothing of the target
		}
		if r.err == nil {
			failures = 0
			w.down.Store(false)
		} else {
			failures++
			// Only a scheduled read arms the hastened one, so that a
			// target that answers requests but not this read is read at
			// most twice per scheduled read.
			if !hastened {
				w.down.Store(!w.schedule.ignoreAnswers && targetDown(r.err))
			}
		}
		r.watch = w
		if !report(ctx, r) {
			return
		}
	}
}

// targetDown tells whether a failed read says the target is not answering
// (as opposed to answering without a usable layout).
func targetDown(err error) bool {
	f := engine.LayoutFailureOf(err)
	return f == engine.LayoutUnreachable || f == engine.LayoutTimeout
}

// timer is the real clock's timer of a layout watch.
func timer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// startWatches starts a watch for every target of cfg whose layout is
// read and that has none; settled holds the errors of the reads just
// made of new targets.
func (l *layoutSet) startWatches(unitCtx context.Context, cfg *config.Config, settled map[string]error) {
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		if !watchesLayout(t) {
			l.coll.CacheLayout().Unwatch(t.Name)
			continue
		}
		if l.watches[t.Name] != nil {
			continue
		}
		tc := l.caches[t.Name]
		ctx, cancel := context.WithCancel(unitCtx)
		w := &layoutWatch{target: *t, fingerprint: tc.fingerprint, schedule: l.discovery, newTimer: timer,
			recovered: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
		url := l.emulators.baseURL(t) // the emulators are the owner goroutine's
		w.read = func(ctx context.Context) layoutReading { return readLayout(ctx, &w.target, url) }
		failures := 0
		if !tc.read {
			failures = 1
			err := settled[t.Name]
			w.down.Store(!l.discovery.ignoreAnswers && err != nil && targetDown(err))
		}
		l.coll.CacheLayout().Watch(t.Name)
		l.watches[t.Name] = w
		l.wg.Go(func() { w.run(ctx, failures, l.report) })
	}
}

// report hands a watch's reading to the owner goroutine; false
// once ctx is done.
func (l *layoutSet) report(ctx context.Context, r layoutReading) bool {
	select {
	case l.readings <- r:
		return true
	case <-ctx.Done():
		return false
	}
}

// take applies a watch's reading on the owner goroutine, unless a
// reload has replaced the watch since.
func (l *layoutSet) take(r layoutReading) {
	if w := l.watches[r.watch.target.Name]; w == r.watch && l.caches[w.target.Name].fingerprint == w.fingerprint {
		l.applyReading(&w.target, r)
	}
}

// stop stops the watches of targets that next changed or removed (all of
// them when next is nil) and waits for their end.
func (l *layoutSet) stop(next *nextConfig) {
	var cfg *config.Config
	if next != nil {
		cfg = next.cfg
	}
	var stopped []*layoutWatch
	for name, w := range l.watches {
		if cfg != nil {
			t, ok := cfg.Target(name)
			if ok && watchesLayout(t) && cfg.Fingerprint("target", name)+"\x00"+l.emulators.url(name) == w.fingerprint {
				continue
			}
		}
		w.cancel() // every one before waiting for any
		stopped = append(stopped, w)
		delete(l.watches, name)
	}
	for _, w := range stopped {
		<-w.done
	}
}
