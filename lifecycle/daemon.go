// Package lifecycle owns the daemon's running set: the replay units, the
// emulated engines, the server-metrics scrapers, the watches of the
// targets' cache layouts and the KV event streams. Each kind is a part
// (parts.go) that reconciles its resources with every configuration
// applied. One goroutine applies every change (the first configuration,
// reloads asked for by a file change, SIGHUP or HTTP, cache layouts the
// watches read, and the drain at shutdown), one after another.
package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/kvevents"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/servedcache"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// Daemon owns the running configuration and its parts: the replay units,
// one per (workload, target), the in-process emulated engines, the
// scrapers, the layout watches and the KV event streams. It keeps the
// reload loop, the swap from one configuration to the next, and the
// status. Only its owner goroutine (started by Start) touches the parts;
// Reload, Ready, Status and Done may be called from any goroutine.
type Daemon struct {
	*common
	configFile string
	// shard, when set (--shard), replaces every workload's own shard.
	shard *config.Shard
	watch bool
	// watchTimer, when set, measures the watch's quiet (Options.watchTimer).
	watchTimer replay.DispatchTimer
	// memoryLimit refuses a configuration past it (Options.MemoryLimit).
	memoryLimit int64
	// beforeApply, when set, runs once a configuration is built and before
	// it is applied: tests make a reload slow with it.
	beforeApply func(ctx context.Context)
	// buildStep, when set, is the last step of building a configuration:
	// tests make a build fail with it.
	buildStep func(*config.Config) error

	// The parts, in the order a configuration is applied to them.
	emulators *emulatorSet
	layouts   *layoutSet
	kv        *kvSet
	scrapers  *scraperSet
	units     *unitSet

	reqs     chan reloadRequest // to the owner goroutine
	stopping chan struct{}      // closed when the shutdown begins
	done     chan struct{}      // closed when everything is drained

	// Owned by the owner goroutine.
	cfgBytes []byte // the file as last applied
	badBytes []byte // the file as last rejected
	cfg      *config.Config
	traces   *traceCache // the traces of cfg, kept across reloads

	// explainer classifies missed hits from the KV events (kvevents.go),
	// from Start until the shutdown stops it.
	explainer   *kvevents.Explainer
	explainStop context.CancelFunc
	explainDone chan struct{}

	ready   atomic.Bool
	mu      sync.Mutex // guards the fields below, read by the landing page
	status  reloadStatus
	targets []Target
}

type reloadStatus struct {
	ok          bool
	lastSuccess time.Time
	err         string
}

// New returns a daemon that runs nothing yet: see Start.
func New(o Options) *Daemon {
	logger := o.Logger
	if logger == nil {
		logger = log.NewNopLogger()
	}
	c := &common{logger: logger, coll: o.Collector, drainTimeout: o.DrainTimeout, tracer: tracing.NewCurrent(tracing.DefaultTracer())}
	d := &Daemon{
		common:      c,
		configFile:  o.ConfigFile,
		shard:       o.Shard,
		watch:       o.Watch,
		watchTimer:  o.watchTimer,
		memoryLimit: o.MemoryLimit,
		beforeApply: o.beforeApply,
		buildStep:   o.buildStep,
		traces:      newTraceCache(),
		reqs:        make(chan reloadRequest),
		stopping:    make(chan struct{}),
		done:        make(chan struct{}),
	}
	if d.coll != nil {
		d.truth = servedcache.New(d.coll)
		d.truth.NotifyUnreported = d.logUnreported
		d.explainer = kvevents.NewExplainer(d.coll.KVEvents(), maxTargetReads)
	}
	d.emulators = newEmulatorSet(c)
	d.units = newUnitSet(c, o.Shard, d.emulators)
	d.emulators.units = d.units
	d.layouts = newLayoutSet(c, o.discovery, d.emulators, d.units, d.showTargetCache)
	d.kv = newKVSet(c, d.explainer, d.emulators, d.layouts)
	d.scrapers = newScraperSet(c, d.emulators)
	d.units.layouts, d.units.kv = d.layouts, d.kv
	d.units.clock, d.units.resultObserved, d.units.replayFinished = o.dispatchClock, o.ResultObserved, o.ReplayFinished
	return d
}

// reload reads the configuration file, builds it and swaps it in; units
// run under unitCtx. With force false an unchanged file is a no-op (the
// watcher fires for any file of the directory). A configuration that
// cannot be built, even one whose build panics, leaves the running one in
// place, untouched. Once ctx is done (shutdown) it applies nothing.
func (d *Daemon) reload(ctx, unitCtx context.Context, force bool) error {
	if ctx.Err() != nil {
		return ErrShuttingDown
	}
	data, err := os.ReadFile(d.configFile)
	// The running bytes are "unchanged" only while the last reload
	// succeeded: a file restored after a rejected edit is applied again,
	// which sets the gauge back to 1.
	if err == nil && !force && d.cfg != nil && ((d.status.ok && bytes.Equal(data, d.cfgBytes)) || bytes.Equal(data, d.badBytes)) {
		return nil // nothing new: another file of the directory changed
	}
	if err == nil {
		var next *nextConfig
		if next, err = d.build(ctx, data); err == nil {
			err = d.swap(ctx, unitCtx, next)
		}
	}
	if ctx.Err() != nil {
		// Cut short by the shutdown: neither a success nor the file's fault.
		return fmt.Errorf("%w: reload abandoned", ErrShuttingDown)
	}
	if err != nil {
		d.badBytes = data
	} else {
		d.badBytes = nil // rejected bytes written again are news again
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.status.ok = false
		d.status.err = err.Error()
		d.coll.ReloadDone(false, time.Now())
		// The first load's error is Start's caller's to print, once; a
		// reload's only the log tells (the file watcher has no caller).
		if d.cfg != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				level.Error(d.logger).Log("msg", "configuration rejected", "problem", line)
			}
		}
		return err
	}
	now := time.Now()
	d.status = reloadStatus{ok: true, lastSuccess: now}
	d.coll.ReloadDone(true, now)
	return nil
}

// errBuildPanicked wraps the panic of a configuration's build.
var errBuildPanicked = errors.New("building the configuration panicked")

// build reads data and everything it references, and builds what
// starting it allocates from the configuration alone (traces, prompt
// builders, clients, the emulated engines' caches), before anything
// running is touched. A panic while building is recovered into an error,
// logged with its stack: the running configuration goes on as it was.
func (d *Daemon) build(ctx context.Context, data []byte) (next *nextConfig, err error) {
	defer func() {
		if p := recover(); p != nil {
			level.Error(d.logger).Log("msg", "building the configuration panicked; the running one is kept", "panic", p, "stack", string(debug.Stack()))
			next, err = nil, fmt.Errorf("%w: %v", errBuildPanicked, p)
		}
	}()
	cfg, loaded, traces, err := loadConfig(ctx, d.configFile, data, d.traces)
	if err != nil {
		return nil, err
	}
	if d.shard != nil {
		if err := cfg.CheckShardIsolation(d.shard.Count); err != nil {
			return nil, err
		}
	}
	if d.memoryLimit > 0 && d.cfg != nil {
		// A reload, before anything is allocated for it: a configuration
		// past the limit would take the running one down with it. The
		// first configuration was checked by the command before it
		// listened; its traces are not read twice more.
		f, err := cfg.Estimate(config.DefaultMemoryCosts)
		if err != nil {
			return nil, err
		}
		if err := cfg.CheckMemory(f, d.memoryLimit); err != nil {
			return nil, err
		}
	}
	next = &nextConfig{data: data, cfg: cfg, workloads: loaded, traces: traces}
	if next.engines, err = d.emulators.build(cfg); err != nil {
		return nil, err
	}
	if next.builders, err = d.units.build(next); err != nil {
		return nil, err
	}
	if d.buildStep != nil {
		if err := d.buildStep(cfg); err != nil {
			return nil, err
		}
	}
	// Last: nothing after it fails but the shutdown, which drops it.
	if next.tracer, err = d.buildTracer(ctx, cfg); err != nil {
		return nil, err
	}
	if d.beforeApply != nil {
		d.beforeApply(ctx)
	}
	if ctx.Err() != nil { // shutting down: start nothing
		d.dropTracer(next.tracer)
		return nil, ctx.Err()
	}
	return next, nil
}

// swap makes the running set match next, part by part: unchanged units
// keep running (and keep their trace position), changed and removed ones
// stop at once and drain in the background, new ones start.
func (d *Daemon) swap(ctx, unitCtx context.Context, next *nextConfig) error {
	defer func() { d.dropTracer(next.tracer) }() // nil once swapped in: a swap cut short drops it
	for _, p := range []part{d.emulators, d.layouts, d.kv} {
		if err := p.apply(ctx, unitCtx, next); err != nil {
			return err
		}
	}
	// The scrapers of removed and changed targets end before those
	// targets' series are deleted, so that no scrape recreates one.
	d.scrapers.stop(next)
	// The collector learns each target's mode before any request or
	// scrape of it, so that none is counted under the wrong one.
	d.publishTargets(next.cfg)
	if err := d.scrapers.apply(ctx, unitCtx, next); err != nil {
		return err // a client that cannot be made, or shutting down: start nothing more
	}
	// The new tracing before the new units, whose first requests it
	// traces; units that keep running trace under it from now on.
	d.swapTracer(next.tracer)
	next.tracer = nil
	// A unit that fails to start is reported; the others run, under the
	// new configuration.
	err := d.units.apply(ctx, unitCtx, next)
	d.cfg, d.cfgBytes, d.traces = next.cfg, next.data, next.traces
	d.logTraceNotes(next)
	level.Info(d.logger).Log("msg", "configuration applied", "file", d.configFile, "units", len(d.units.byKey))
	return err
}

// Check reads the configuration file and everything it references, as a
// reload would, and returns every problem it finds, and the warnings about
// its traces that a start would log.
func Check(path string) (notes []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg, loaded, _, err := loadConfig(context.Background(), path, data, newTraceCache())
	if err != nil {
		return nil, err
	}
	// The emulated engines are built as a start builds them, and dropped.
	if _, err := newEmulatorSet(nil).build(cfg); err != nil {
		return nil, err
	}
	for i := range cfg.Workloads {
		if wd := loaded[cfg.Workloads[i].Name]; wd != nil {
			notes = append(notes, wd.notes...)
		}
	}
	return notes, nil
}

// loadConfig parses a configuration and everything it references (traces,
// tokenizers), reporting every problem it finds. Traces that prev holds and
// that did not change are taken from it, not read again; the traces of the
// configuration are returned in a new cache. It gives up when ctx is done.
func loadConfig(ctx context.Context, path string, data []byte, prev *traceCache) (*config.Config, map[string]*workloadData, *traceCache, error) {
	cfg, err := config.ParseFile(path, data)
	if err != nil {
		// The trace files' problems too, which loading would reach only
		// once the file's own are fixed: every problem in one run.
		return nil, nil, nil, errors.Join(err, config.TraceFileProblems(path, data))
	}
	var errs []error
	// What only the emulator knows of an emulated target: its default
	// model, which the target's requests and labels name.
	for i := range cfg.Targets {
		if t := &cfg.Targets[i]; t.Emulate != nil && t.Model == "" {
			t.Model = emulate.DefaultModel
		}
	}
	loaded := map[string]*workloadData{}
	traces := prev.next()
	for i := range cfg.Workloads {
		w := &cfg.Workloads[i]
		wd, err := loadWorkload(ctx, cfg, w, traces, prev)
		if ctx.Err() != nil {
			return nil, nil, nil, ctx.Err()
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		loaded[w.Name] = wd
	}
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		if t.PromptFormat == openai.PromptFormatTokenIDs {
			if _, err := tokenizer.Load(t.Tokenizer); err != nil {
				errs = append(errs, fmt.Errorf("target %s: tokenizer: %w", t.Name, err))
			}
		}
	}
	// Build every target's client once now: what only the client checks
	// (extra_body, TLS files) must fail here, before a reload has stopped
	// anything, and in --config.check too.
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		url := t.URL
		if t.Emulate != nil {
			url = "http://127.0.0.1" // the emulator's port is not chosen yet
		}
		c, err := openai.New(targetConfig(t, url))
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				errs = append(errs, fmt.Errorf("%s: targets[%d].%s", path, i, line))
			}
			continue
		}
		c.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, nil, err
	}
	traces.letGoOfUnusedRows()
	return cfg, loaded, traces, nil
}

// logTraceNotes logs the warnings about the workloads' traces, once per
// trace as read: a reload that keeps a file says nothing again.
func (d *Daemon) logTraceNotes(next *nextConfig) {
	for i := range next.cfg.Workloads {
		if wd := next.workloads[next.cfg.Workloads[i].Name]; len(wd.notes) > 0 && !wd.trace.file.noted {
			wd.trace.file.noted = true
			for _, note := range wd.notes {
				level.Warn(d.logger).Log("msg", note)
			}
		}
	}
}

// publishTargets tells the collector, the cache-truth step and the landing
// page the targets of cfg, and has them forget those and the workloads
// the running configuration had and cfg has not.
func (d *Daemon) publishTargets(cfg *config.Config) {
	seen := map[string]bool{}
	targets := make([]Target, 0, len(cfg.Targets))
	for _, t := range cfg.Targets {
		d.coll.SetTarget(t.Name, t.Model, t.API, t.Dialect)
		d.truth.SetTarget(t.Name, t.Dialect, t.Cache.Observed)
		seen[t.Name] = true
		tc := d.layouts.caches[t.Name]
		targets = append(targets, Target{Name: t.Name, Model: t.Model, API: string(t.API), Dialect: string(t.Dialect),
			BlockSize: tc.params.ServerBlock, CapacityBlocks: tc.params.CapacityBlocks, CapacityKnown: tc.known, CacheNote: tc.note})
	}
	if d.cfg != nil {
		for _, t := range d.cfg.Targets {
			if !seen[t.Name] {
				d.truth.ForgetTarget(t.Name)
				d.coll.ForgetTarget(t.Name)
			}
		}
		kept := map[string]bool{}
		for _, w := range cfg.Workloads {
			kept[w.Name] = true
		}
		for _, w := range d.cfg.Workloads {
			if !kept[w.Name] {
				d.coll.ForgetWorkload(w.Name)
			}
		}
	}
	sort.Slice(targets, func(i, j int) bool { return targets[i].Name < targets[j].Name })
	d.mu.Lock()
	d.targets = targets
	d.mu.Unlock()
}

// showTargetCache puts target's cache on the landing page.
func (d *Daemon) showTargetCache(target string, tc targetCache) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// A new slice: Status has handed the old one out.
	targets := append([]Target(nil), d.targets...)
	for i := range targets {
		if targets[i].Name == target {
			targets[i].BlockSize, targets[i].CapacityBlocks = tc.params.ServerBlock, tc.params.CapacityBlocks
			targets[i].CapacityKnown, targets[i].CacheNote = tc.known, tc.note
		}
	}
	d.targets = targets
}

// halt ends every unit's dispatch and starts its drain, from any
// goroutine, without waiting; no unit starts after it. The owner goroutine
// then finishes what it was doing and waits for the drains (shutdown).
// Not ready comes once dispatch has stopped, so that a reader of Ready
// (GET /-/ready) can tell.
func (d *Daemon) halt() {
	d.units.halt(func() { d.ready.Store(false) })
}

// shutdown stops every part, last applied first: units let their requests
// in flight finish for up to the drain timeout (their results are still
// counted), then the watches, scrapers and streams, then the emulators.
// Each stop cancels its part's contexts before it waits.
func (d *Daemon) shutdown() {
	close(d.stopping) // every later reload request sees it
	d.halt()          // done already unless the first load failed
	d.units.stop(nil)
	d.dropTracer(d.tracer.Swap(tracing.DefaultTracer())) // every request has ended: flush their spans
	d.layouts.stop(nil)
	d.scrapers.stop(nil)
	d.kv.stop(nil)
	if d.explainStop != nil {
		d.explainStop()
		<-d.explainDone
	}
	d.emulators.stop(nil)
	d.wg.Wait()
}

// logUnreported is the cache-truth step's NotifyUnreported.
func (d *Daemon) logUnreported(target string, dialect engine.Dialect) {
	level.Warn(d.logger).Log("msg", "responses carry no cached-token count: their requests count on neither side of the cache efficiency, shown as not reported",
		"target", target, "what_to_do", engine.For(dialect).UnreportedAdvice)
}

// Status is what the landing page shows of the daemon.
type Status struct {
	ConfigFile  string
	ReloadOK    bool
	LastReload  time.Time // last successful (re)load
	ReloadError string    // why the last reload failed; never holds a secret
	Targets     []Target
}

// Target is a configured target as the landing page lists it.
type Target struct {
	Name, Model, API, Dialect string
	// The cache the target's theoretical model stands for.
	BlockSize, CapacityBlocks int
	CapacityKnown             bool
	CacheNote                 string
}

// Status may be called from any goroutine.
func (d *Daemon) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Status{
		ConfigFile:  d.configFile,
		ReloadOK:    d.status.ok,
		LastReload:  d.status.lastSuccess,
		ReloadError: d.status.err,
		Targets:     d.targets,
	}
}
