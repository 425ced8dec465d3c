// Package lifecycle owns the daemon's running set: the replay units, the
// emulated engines, the server-metrics scrapers and the watches of the
// targets' cache layouts. One goroutine applies every change to it (the
// first configuration, reloads asked for by a file change, SIGHUP or HTTP,
// cache layouts the watches read, and the drain at shutdown), one after
// another.
package lifecycle

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/kvevents"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/servedcache"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
)

// Daemon owns the running configuration: the replay units, one per
// (workload, target), the in-process emulated engines and the scrapers.
// Only its owner goroutine (started by Start) touches them; Reload, Ready,
// Status and Done may be called from any goroutine.
type Daemon struct {
	logger       log.Logger
	configFile   string
	drainTimeout time.Duration
	coll         *collector.Collector
	// truth decides how results and server counts count, in front of coll.
	truth *servedcache.Truth
	// anchor is the origin of every looping workload's pass grid: replicas
	// and restarts agree on pass numbers, positions and prompts.
	anchor time.Time
	// shard, when set (--shard), replaces every workload's own shard.
	shard *config.Shard
	watch bool
	// beforeApply, when set, runs after a configuration is parsed and before
	// it is applied: tests make a reload slow with it.
	beforeApply func(ctx context.Context)
	// discovery is when targets' cache layouts are read again.
	discovery discoverySchedule
	// epoch makes the cache salts of targets that isolate without an
	// isolation_epoch: this daemon's own (see unitSalt).
	epoch string

	wg sync.WaitGroup // every unit and emulator goroutine, and drains

	reqs     chan reloadRequest // to the owner goroutine
	readings chan layoutReading // from the layout watches, to the owner goroutine
	stopping chan struct{}      // closed when the shutdown begins
	done     chan struct{}      // closed when everything is drained

	// Owned by the owner goroutine.
	cfgBytes  []byte // the file as last applied
	badBytes  []byte // the file as last rejected
	cfg       *config.Config
	units     map[unitKey]*unit
	emulators map[string]*emulated
	scrapers  map[string]*scraping
	caches    map[string]targetCache
	watches   map[string]*layoutWatch // by target
	kvTargets map[string]*kvFollowing // targets whose KV events are followed
	traces    *traceCache             // the traces of cfg, kept across reloads
	saltsSent map[string]bool         // the cache salts units were given

	// explainer classifies missed hits from the KV events (kvevents.go),
	// from Start until the shutdown stops it.
	explainer   *kvevents.Explainer
	explainStop context.CancelFunc
	explainDone chan struct{}

	// Every running unit, for halt: the owner goroutine may be busy (a slow
	// reload) when the shutdown begins, and dispatch must end at once.
	haltMu sync.Mutex
	halted bool
	live   map[*unit]struct{}

	ready   atomic.Bool
	mu      sync.Mutex // guards the fields below, read by the landing page
	status  reloadStatus
	targets []Target
}

type unitKey struct{ workload, target string }

// unit is one running (workload, target).
type unit struct {
	fingerprint string
	workload    *replay.Workload
	client      *openai.Client
	gate        *gatedObserver
	plan        *replay.Plan // the trace it replays, shared with the other units of the trace
	// pacerOpts and newModel build its cache model again when the
	// target's cache changes (followCache): newModel takes the workload's
	// trace block, the target's model ceiling and its warm-up learning.
	pacerOpts replay.PacerOptions
	newModel  func(*replay.Pacer, replay.CacheParams) *replay.CacheModel
	done      chan struct{} // closed when Run returned
	// stopping is set before a reload or the shutdown stops the unit, so
	// that its end is not taken for the end of its trace.
	stopping atomic.Bool
}

// emulated is an in-process emulated engine serving one target.
type emulated struct {
	fingerprint string
	url         string
	engine      *emulate.Engine
	cancel      context.CancelFunc
	wait        func() error
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
	d := &Daemon{
		logger:       logger,
		configFile:   o.ConfigFile,
		drainTimeout: o.DrainTimeout,
		coll:         o.Collector,
		shard:        o.Shard,
		watch:        o.Watch,
		beforeApply:  o.beforeApply,
		discovery:    cmp.Or(o.discovery, defaultDiscovery),
		anchor:       time.Unix(0, 0),
		epoch:        newEpoch(),
		saltsSent:    map[string]bool{},
		units:        map[unitKey]*unit{},
		emulators:    map[string]*emulated{},
		scrapers:     map[string]*scraping{},
		caches:       map[string]targetCache{},
		watches:      map[string]*layoutWatch{},
		kvTargets:    map[string]*kvFollowing{},
		live:         map[*unit]struct{}{},
		traces:       newTraceCache(),
		reqs:         make(chan reloadRequest),
		readings:     make(chan layoutReading),
		stopping:     make(chan struct{}),
		done:         make(chan struct{}),
	}
	if d.coll != nil {
		d.truth = servedcache.New(d.coll)
		d.truth.NotifyUnreported = d.logUnreported
		d.explainer = kvevents.NewExplainer(d.coll.KVEvents(), maxTargetReads)
	}
	return d
}

// reload reads the configuration file and applies it; units run under
// unitCtx. With force false an unchanged file is a no-op (the watcher fires
// for any file of the directory). A bad configuration leaves the running
// one in place. Once ctx is done (shutdown) it applies nothing.
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
		err = d.apply(ctx, unitCtx, data)
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
	for i := range cfg.Workloads {
		if wd := loaded[cfg.Workloads[i].Name]; wd != nil && wd.note != "" {
			notes = append(notes, wd.note)
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
		return nil, nil, nil, err
	}
	var errs []error
	// What only the emulator knows of an emulated target: its default
	// model (which the target's requests and labels name) and the engine
	// names it takes.
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		if t.Emulate == nil {
			continue
		}
		if t.Model == "" {
			t.Model = emulate.DefaultModel
		}
		if _, err := emulateConfig(t); err != nil {
			errs = append(errs, cfg.KeyError(fmt.Sprintf("targets[%d].emulate.engine", i), err))
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

// apply makes the running state match data: unchanged units keep running
// (and keep their trace position), changed and removed ones stop at once
// and drain in the background, new ones start.
func (d *Daemon) apply(ctx, unitCtx context.Context, data []byte) error {
	cfg, loaded, traces, err := loadConfig(ctx, d.configFile, data, d.traces)
	if err != nil {
		return err
	}
	if d.shard != nil {
		if err := cfg.CheckShardIsolation(d.shard.Count); err != nil {
			return err
		}
	}
	if d.beforeApply != nil {
		d.beforeApply(ctx)
	}
	if err := ctx.Err(); err != nil {
		return err // shutting down: start nothing
	}
	running := map[string]bool{} // workloads with a unit before this apply
	for k := range d.units {
		running[k.workload] = true
	}
	if err := d.applyEmulators(unitCtx, cfg); err != nil {
		return err
	}
	if err := d.applyCaches(ctx, unitCtx, cfg); err != nil {
		return err // shutting down: start nothing
	}
	if err := d.applyKVEvents(ctx, unitCtx, cfg); err != nil {
		return err
	}
	// The scrapers of removed and changed targets end before those
	// targets' series are deleted, so that no scrape recreates one.
	d.stopScrapers(cfg)
	// The collector learns each target's mode before any request or
	// scrape of it, so that none is counted under the wrong one.
	d.publishTargets(cfg)
	if err := d.applyScrapers(ctx, unitCtx, cfg); err != nil {
		return err // a client that cannot be made, or shutting down: start nothing more
	}

	want := map[unitKey]string{}
	for i := range cfg.Workloads {
		w := &cfg.Workloads[i]
		for _, tn := range w.Targets {
			want[unitKey{w.Name, tn}] = cfg.Fingerprint("workload", w.Name) + "\x00" +
				cfg.Fingerprint("target", tn) + "\x00" + loaded[w.Name].trace.file.hash + "\x00" + d.emulatorURL(tn)
		}
	}
	for k, u := range d.units {
		if want[k] != u.fingerprint {
			d.stopUnit(k, u)
		}
	}
	// A workload none of whose units survived starts over from pass 0: its
	// pass count must too, or kvload_trace_loops_total stalls until the new
	// units catch up with the old count.
	for k := range d.units {
		delete(running, k.workload)
	}
	for w := range running {
		d.coll.ForgetWorkload(w)
	}
	var errs []error
	tokenizers := map[string]tokenizer.Tokenizer{}
	for i := range cfg.Workloads {
		w := &cfg.Workloads[i]
		for _, tn := range w.Targets {
			k := unitKey{w.Name, tn}
			if _, running := d.units[k]; running {
				continue
			}
			t, _ := cfg.Target(tn)
			u, err := d.startUnit(unitCtx, w, t, loaded[w.Name], tokenizers, want[k])
			if err != nil {
				errs = append(errs, fmt.Errorf("workload %s, target %s: %w", w.Name, tn, err))
				continue
			}
			d.units[k] = u
		}
	}
	d.cfg, d.cfgBytes, d.traces = cfg, data, traces
	d.logTraceNotes(cfg, loaded)
	level.Info(d.logger).Log("msg", "configuration applied", "file", d.configFile, "units", len(d.units))
	return errors.Join(errs...)
}

// logTraceNotes logs the warnings about the workloads' traces, once per
// trace as read: a reload that keeps a file says nothing again.
func (d *Daemon) logTraceNotes(cfg *config.Config, loaded map[string]*workloadData) {
	for i := range cfg.Workloads {
		if wd := loaded[cfg.Workloads[i].Name]; wd.note != "" && !wd.trace.file.noted {
			wd.trace.file.noted = true
			level.Warn(d.logger).Log("msg", wd.note)
		}
	}
}

// startUnit builds the unit of workload w on target t and starts its
// replay.
func (d *Daemon) startUnit(ctx context.Context, w *config.Workload, t *config.Target, wd *workloadData, tokenizers map[string]tokenizer.Tokenizer, fp string) (*unit, error) {
	u, err := d.newUnit(w, t, wd, tokenizers, fp)
	if err != nil {
		return nil, err
	}
	if !d.register(u) {
		u.client.Close()
		return nil, ErrShuttingDown
	}
	logger := log.With(d.logger, "workload", w.Name, "target", t.Name)
	d.coll.Start(w.Name, t.Name)
	if u.gate.misses != nil {
		d.coll.KVEvents().StartMissedHits(w.Name, t.Name)
	}
	if tpl := u.gate.template; tpl != nil {
		d.coll.ChatTemplate().Start(w.Name, t.Name)
		tpl.start()
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(u.done)
		if err := u.workload.Run(ctx); err != nil {
			level.Error(logger).Log("msg", "replay stopped", "err", err)
		} else if w.Loop == replay.LoopOnce && !u.stopping.Load() {
			// Run returned by itself: the single pass is sent and drained.
			level.Info(logger).Log("msg", "replay finished: its single pass is done and drained", "rows", wd.rows())
		}
	}()
	level.Info(logger).Log("msg", "replay started", "rows", wd.rows(), "schedule", wd.trace.plan.Schedule())
	return u, nil
}

// newUnit assembles a unit: its request builder, its pacer over the
// trace's shared plan, its cache model, and its client, which it closes
// again when a later part cannot be built.
func (d *Daemon) newUnit(w *config.Workload, t *config.Target, wd *workloadData, tokenizers map[string]tokenizer.Tokenizer, fp string) (_ *unit, err error) {
	rb, err := unitRequestBuilder(w, t, wd, tokenizers)
	if err != nil {
		return nil, err
	}
	pacer, popts, start, err := d.unitPacer(w, wd)
	if err != nil {
		return nil, err
	}
	logger := log.With(d.logger, "workload", w.Name, "target", t.Name)
	salt, empty := d.unitSalt(w, t, logger)
	newModel := func(pacer *replay.Pacer, params replay.CacheParams) *replay.CacheModel {
		params.TraceBlock = w.BlockSize
		params.CeilingTokens = t.Cache.ModelCeilingTokens
		m := unitCacheModel(pacer, params, t, logger)
		if empty {
			// Only the first model: a later one (followCache) starts
			// where this unit has already sent rows under the salt.
			m.StartEmpty()
			empty = false
		}
		return m
	}
	gate := &gatedObserver{obs: d.truth, fails: newFailureLog(logger), watch: d.watches[t.Name], salt: salt}
	if f := d.kvTargets[t.Name]; f != nil {
		gate.misses = f.offer
	}
	if t.API == openai.APIChat && !rb.tokenIDs {
		// A chat template wraps the built prompt: its size, measured at
		// the (re)load where the target can say, or learnt from answers.
		tc := d.caches[t.Name]
		rb.template = newTemplateOverhead(logger, tc.chatTemplate, tc.chatTemplateKnown, d.templatePublisher(w.Name, t.Name))
		gate.template = rb.template
	}
	url := t.URL
	if t.Emulate != nil {
		url = d.emulatorURL(t.Name)
	}
	tc := targetConfig(t, url)
	tc.CacheSalt = salt
	client, err := openai.New(tc)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			client.Close()
		}
	}()
	wl, err := replay.NewWorkload(replay.WorkloadConfig{
		Name:         w.Name,
		Target:       t.Name,
		MaxInFlight:  w.MaxInFlight,
		OnSaturation: w.OnSaturation,
		MaxQueueLag:  time.Duration(w.MaxQueueLag),
		Start:        start,
		Cache:        newModel(pacer, d.caches[t.Name].params),
		OnBuildError: func(err error) { level.Warn(logger).Log("msg", "request not built, counted as dropped", "err", err) },
	}, pacer, replay.SendWith(client), rb, gate)
	if err != nil {
		return nil, err
	}
	return &unit{fingerprint: fp, workload: wl, client: client, gate: gate, plan: wd.trace.plan,
		pacerOpts: popts, newModel: newModel, done: make(chan struct{})}, nil
}

// templatePublisher exports the chat template size of workload w on
// target t as its unit settles it.
func (d *Daemon) templatePublisher(w, t string) templatePublisher {
	return func(tokens int, source collector.TemplateSource, corrected bool) {
		d.coll.ChatTemplate().Set(w, t, tokens, source)
		if corrected {
			d.coll.ChatTemplate().Corrected(w, t)
		}
	}
}

// unitRequestBuilder is the request builder of workload w on target t:
// the workload's prompts, or with token-id prompts a builder with t's
// tokenizer (loaded once per reload into tokenizers).
func unitRequestBuilder(w *config.Workload, t *config.Target, wd *workloadData, tokenizers map[string]tokenizer.Tokenizer) (*requestBuilder, error) {
	rb := &requestBuilder{prompts: wd.builder, sessions: t.SessionHeader != ""}
	if t.PromptFormat != openai.PromptFormatTokenIDs {
		return rb, nil
	}
	rb.tokenIDs = true
	tok := tokenizers[t.Tokenizer]
	if tok == nil {
		var err error
		if tok, err = tokenizer.Load(t.Tokenizer); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		tokenizers[t.Tokenizer] = tok
	}
	var err error
	rb.prompts, err = prompt.NewBuilder(prompt.Options{BlockSize: w.BlockSize, Seed: w.Seed, CacheBytes: promptCacheBytes, Tokenizer: tok})
	return rb, err
}

// unitPacer is the unit's cursor over the trace's shared plan, the
// options it was made with, and the time its grid starts (zero for a
// single pass, which starts from the top now).
func (d *Daemon) unitPacer(w *config.Workload, wd *workloadData) (*replay.Pacer, replay.PacerOptions, time.Time, error) {
	shard := w.Shard
	if d.shard != nil {
		shard = *d.shard
	}
	now := time.Now()
	var onceNS uint64
	if shard.Count == 1 && !w.Prompts.Reproducible {
		// A single pass of its own: a restarted exporter must not resend
		// prompts a warm server still holds while its model starts cold.
		// Replicas of a sharded workload must build the same prompts, and
		// reproducible ones are the same on every run.
		onceNS = uint64(now.UnixNano())
	}
	opts := replay.PacerOptions{
		Loop:          w.Loop,
		Shard:         replay.Shard{Index: shard.Index, Count: shard.Count},
		OnceNamespace: onceNS,
	}
	pacer, err := wd.trace.plan.NewPacer(opts)
	if err != nil || w.Loop == replay.LoopOnce {
		return pacer, opts, time.Time{}, err
	}
	// Looping workloads keep the pass grid anchored in wall-clock time.
	offset, err := pacer.SeekTime(now.Sub(d.anchor))
	if err != nil {
		return nil, opts, time.Time{}, err
	}
	if wd.trace.plan.Schedule().Closed() {
		// Users start now, where the grid stands: its pass numbers keep a
		// restart's prompts apart from the last run's.
		return pacer, opts, time.Time{}, nil
	}
	return pacer, opts, d.anchor.Add(offset), nil
}

// stopUnit stops dispatching at once, deletes the unit's series, and drains
// its in-flight requests in the background (cut at the drain timeout).
func (d *Daemon) stopUnit(k unitKey, u *unit) {
	delete(d.units, k)
	d.unregister(u)
	u.stopping.Store(true)
	u.gate.close() // no late call recreates the series deleted next
	d.coll.Forget(k.workload, k.target)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		u.workload.Stop(d.drainTimeout)
		<-u.done
		u.client.Close()
	}()
	level.Info(d.logger).Log("msg", "replay stopped by reload", "workload", k.workload, "target", k.target)
}

// applyEmulators starts the emulated engines the configuration asks for and
// stops those it no longer does (or asks for differently).
func (d *Daemon) applyEmulators(unitCtx context.Context, cfg *config.Config) error {
	for name, e := range d.emulators {
		t, ok := cfg.Target(name)
		if !ok || t.Emulate == nil || cfg.Fingerprint("target", name) != e.fingerprint {
			// Its units go first, so that none of their requests fails
			// against a stopped engine and is counted as an error.
			for k, u := range d.units {
				if k.target == name {
					d.stopUnit(k, u)
				}
			}
			e.cancel()
			if err := e.wait(); err != nil {
				level.Warn(d.logger).Log("msg", "emulator stopped with an error", "target", name, "err", err)
			}
			delete(d.emulators, name)
		}
	}
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		if t.Emulate == nil || d.emulators[t.Name] != nil {
			continue
		}
		ecfg, err := emulateConfig(t)
		if err != nil {
			return fmt.Errorf("target %s: emulate: %w", t.Name, err)
		}
		eng, err := emulate.New(ecfg)
		if err != nil {
			return fmt.Errorf("target %s: emulate: %w", t.Name, err)
		}
		if err := eng.BindKVEvents(); err != nil {
			return fmt.Errorf("target %s: %w", t.Name, err)
		}
		ctx, cancel := context.WithCancel(unitCtx)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			cancel()
			return fmt.Errorf("target %s: emulate: %w", t.Name, err)
		}
		done := make(chan error, 1)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			done <- eng.Serve(ctx, l)
		}()
		var once sync.Once
		var werr error
		d.emulators[t.Name] = &emulated{
			fingerprint: cfg.Fingerprint("target", t.Name),
			url:         "http://" + l.Addr().String(),
			engine:      eng,
			cancel:      cancel,
			wait:        func() error { once.Do(func() { werr = <-done }); return werr },
		}
		started := []any{"msg", "emulated engine started", "target", t.Name, "url", "http://" + l.Addr().String()}
		if ep := eng.KVEventsEndpoint(); ep != "" {
			started = append(started, "kv_events", ep)
		}
		level.Info(d.logger).Log(started...)
		// A llama.cpp engine holds one prompt per slot: bounded whatever its
		// capacity_blocks (which it does not take).
		unbounded := ecfg.CapacityBlocks == 0 && ecfg.Engine != emulate.PersonalityLlamaCpp
		if w := freshWorkloadOf(cfg, t.Name); unbounded && w != "" {
			level.Warn(d.logger).Log("msg", "the emulated engine's prefix cache is unbounded and a workload sends it new prompts every pass: its memory grows every pass; set emulate.capacity_blocks for long runs", "target", t.Name, "workload", w)
		}
	}
	return nil
}

// emulateConfig converts t's emulate block for the emulator; an engine name
// the emulator does not know is its only error.
func emulateConfig(t *config.Target) (emulate.Config, error) {
	e := t.Emulate
	engine, err := emulate.ParsePersonality(e.Engine)
	if err != nil {
		return emulate.Config{}, err
	}
	return emulate.Config{
		Model:              cmp.Or(e.Model, t.Model),
		MaxModelLen:        e.MaxModelLen,
		MaxBodyBytes:       e.MaxBodyBytes,
		Engine:             engine,
		BlockSize:          e.BlockSize,
		CapacityBlocks:     e.CapacityBlocks,
		Slots:              e.Slots,
		CacheRAMTokens:     e.CacheRAMTokens,
		HideCacheConfig:    e.HideCacheConfig,
		BOS:                e.BOS,
		DisablePrefixCache: e.DisablePrefixCache,
		OmitCachedTokens:   e.OmitCachedTokens,
		MaxRunning:         e.MaxRunning,
		Overhead:           e.Overhead,
		PrefillPerToken:    e.PrefillPerToken,
		InterToken:         e.InterToken,
		Faults:             emulate.Faults(e.Faults),
		Seed:               e.Seed,
		KVEvents:           e.KVEvents,
		KVEventsTopic:      e.KVEventsTopic,
		KVEventsFormat:     emulate.KVEventsFormat(e.KVEventsFormat),

		MetricsDoubleCountHits: e.MetricsDoubleCountHits,
	}, nil
}

// freshWorkloadOf names a workload that replays forever against target
// with loop: fresh, or returns "".
func freshWorkloadOf(cfg *config.Config, target string) string {
	for _, w := range cfg.Workloads {
		if w.Loop == replay.LoopFresh && slices.Contains(w.Targets, target) {
			return w.Name
		}
	}
	return ""
}

func (d *Daemon) emulatorURL(target string) string {
	if e := d.emulators[target]; e != nil {
		return e.url
	}
	return ""
}

func (d *Daemon) publishTargets(cfg *config.Config) {
	seen := map[string]bool{}
	targets := make([]Target, 0, len(cfg.Targets))
	for _, t := range cfg.Targets {
		d.coll.SetTarget(t.Name, t.Model, t.API, t.Dialect)
		d.truth.SetTarget(t.Name, t.Dialect, t.Cache.Observed)
		seen[t.Name] = true
		tc := d.caches[t.Name]
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

// register adds a unit about to run to those halt stops; false once the
// shutdown began, when it must not run.
func (d *Daemon) register(u *unit) bool {
	d.haltMu.Lock()
	defer d.haltMu.Unlock()
	if d.halted {
		return false
	}
	d.live[u] = struct{}{}
	return true
}

func (d *Daemon) unregister(u *unit) {
	d.haltMu.Lock()
	delete(d.live, u)
	d.haltMu.Unlock()
}

// halt ends every unit's dispatch and starts its drain, from any
// goroutine, without waiting; no unit starts after it. The owner goroutine
// then finishes what it was doing and waits for the drains (shutdown).
func (d *Daemon) halt() {
	d.haltMu.Lock()
	defer d.haltMu.Unlock()
	d.halted = true
	d.ready.Store(false)
	for u := range d.live {
		u.stopping.Store(true)
		u.workload.Halt(d.drainTimeout)
	}
}

// shutdown stops every unit, letting in-flight requests finish for up to the
// drain timeout (their results are still counted), then the emulators.
func (d *Daemon) shutdown() {
	close(d.stopping) // every later reload request sees it
	d.halt()          // done already unless the first load failed
	var wg sync.WaitGroup
	for _, u := range d.units {
		u.stopping.Store(true)
		wg.Add(1)
		go func() {
			defer wg.Done()
			u.workload.Stop(d.drainTimeout)
			<-u.done
			u.client.Close()
		}()
	}
	wg.Wait()
	d.stopWatches(nil)
	d.stopScrapers(nil)
	d.stopKVEvents(nil)
	if d.explainStop != nil {
		d.explainStop()
		<-d.explainDone
	}
	for _, e := range d.emulators {
		e.cancel()
		_ = e.wait() // a server cancelled at shutdown has nothing to report
	}
	d.wg.Wait()
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
