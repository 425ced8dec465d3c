package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/rowrequest"
	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// promptCacheBytes bounds each workload's block cache of prompt text. It
// saves rebuilding a block (5 µs for 512 tokens) only while the block is
// reused soon; 8 MiB holds some 2,400 such blocks, a million tokens.
const promptCacheBytes = 8 << 20

// workloadData is a workload's trace, read and synthesized once and shared
// by all its targets (and by other workloads of the same trace and knobs).
type workloadData struct {
	trace   *tracePlan
	builder *prompt.Builder
	// notes are warnings about the trace that the daemon logs once and
	// --config.check prints, one line each.
	notes []string
}

// rows is the number of rows the workload replays.
func (wd *workloadData) rows() int { return wd.trace.plan.Rows().Len() }

// loadWorkload returns a workload's trace, reshaped, from traces (which
// reads the file only if prev does not hold it already). Errors name the
// file and line.
func loadWorkload(ctx context.Context, cfg *config.Config, w *config.Workload, traces, prev *traceCache) (*workloadData, error) {
	k := w.Knobs()
	path := cfg.TracePath(w)
	g := w.SharedPrefix()
	if g != nil {
		path = generatedName(g)
	}
	tp, err := traces.plan(ctx, prev, path, w, k)
	if ae := (*traceAccessError)(nil); errors.As(err, &ae) {
		// The file could not be read at all: name the YAML key and line,
		// and where relative paths resolve.
		return nil, cfg.TraceError(w, ae.err)
	}
	if errors.Is(err, trace.ErrTooFewHashIDs) {
		return nil, fmt.Errorf("%w; %s is %d tokens: it must be the block size the trace's hash_ids were made with",
			err, blockSizeKey(cfg, w), w.BlockSize)
	}
	if err != nil {
		return nil, err
	}
	builder, err := prompt.NewBuilder(prompt.Options{BlockSize: w.BlockSize, Seed: w.Seed, CacheBytes: promptCacheBytes})
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", w.Name, err)
	}
	wd := &workloadData{trace: tp, builder: builder}
	if sp := tp.file.surplus; sp.Rows > 0 {
		wd.notes = append(wd.notes, fmt.Sprintf("workload %s: %s: %s; their prompts use the ids that fit. Is %s (%d) the block size the trace was made with?",
			w.Name, path, sp, blockSizeKey(cfg, w), w.BlockSize))
	}
	if cr := tp.reuse; cr.reusing > 0 {
		where := "a generated row"
		if cr.firstLine > 0 {
			where = fmt.Sprintf("line %d", cr.firstLine)
		}
		wd.notes = append(wd.notes, fmt.Sprintf("workload %s: %s: %s", w.Name, path, synth.ChainReuseNote(cr.reusing, cr.rows, where)))
	}
	if g != nil {
		if note := g.UnsharedPrefixWarning(blockSizeKey(cfg, w)); note != "" {
			wd.notes = append(wd.notes, fmt.Sprintf("workload %s: generate: %s", w.Name, note))
		}
	}
	return wd, nil
}

// blockSizeKey is the YAML path of w's block_size, for messages.
func blockSizeKey(cfg *config.Config, w *config.Workload) string {
	for i := range cfg.Workloads {
		if &cfg.Workloads[i] == w {
			return fmt.Sprintf("workloads[%d].block_size", i)
		}
	}
	return "block_size"
}

// ctxReader fails its reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// maxRequestTokens bounds a row's input and output lengths: above any
// model's context, below what building the prompt text could allocate.
const maxRequestTokens = 1 << 24

// checkSendable rejects a row no request can be built for.
func checkSendable(rows *trace.Table, i int) error {
	if n := rows.ISL(i); n > maxRequestTokens {
		return fmt.Errorf("input_length %d is more than the %d tokens a request may have", n, maxRequestTokens)
	}
	if n := rows.OSL(i); n > maxRequestTokens {
		return fmt.Errorf("output_length %d is more than the %d tokens a request may have", n, maxRequestTokens)
	}
	return nil
}

// fileKind describes a file that is not a regular one.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "is a directory"
	case m&os.ModeNamedPipe != 0:
		return "is a named pipe"
	case m&os.ModeDevice != 0:
		return "is a device"
	case m&os.ModeSocket != 0:
		return "is a socket"
	default:
		return "is special"
	}
}

// unitKey names a unit.
type unitKey struct{ workload, target string }

// unit is one running (workload, target).
type unit struct {
	fingerprint string
	workload    *replay.Workload
	client      *openai.Client
	gate        *gatedObserver
	template    *templateOverhead // nil: no chat template to learn
	misses      bool              // its missed hits are classified
	plan        *replay.Plan      // the trace it replays, shared with the other units of the trace
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

// start builds the unit of workload w on target t and starts its
// replay.
func (s *unitSet) start(ctx context.Context, w *config.Workload, t *config.Target, wd *workloadData, rb *rowrequest.Builder, fp string) (*unit, error) {
	u, err := s.newUnit(w, t, wd, rb, fp)
	if err != nil {
		return nil, err
	}
	if !s.register(u) {
		u.client.Close()
		return nil, ErrShuttingDown
	}
	logger := log.With(s.logger, "workload", w.Name, "target", t.Name)
	s.coll.Start(w.Name, t.Name)
	s.coll.SLOs().Set(w.Name, t.Name, collectorSLO(w.SLO))
	if u.misses {
		s.coll.KVEvents().StartMissedHits(w.Name, t.Name)
	}
	if tpl := u.template; tpl != nil {
		s.coll.ChatTemplate().Start(w.Name, t.Name)
		tpl.start()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(u.done)
		if err := u.workload.Run(ctx); err != nil {
			level.Error(logger).Log("msg", "replay stopped", "err", err)
		} else if w.Loop == replay.LoopOnce && !u.stopping.Load() {
			// Run returned by itself: the single pass is sent and drained.
			level.Info(logger).Log("msg", "replay finished: its single pass is done and drained", "rows", wd.rows())
			if s.replayFinished != nil {
				s.replayFinished(w.Name, t.Name)
			}
		}
	}()
	level.Info(logger).Log("msg", "replay started", "rows", wd.rows(), "schedule", wd.trace.plan.Schedule())
	return u, nil
}

// newUnit assembles a unit from its request builder: its pacer over the
// trace's shared plan, its cache model, and its client, which it closes
// again when a later part cannot be built.
func (s *unitSet) newUnit(w *config.Workload, t *config.Target, wd *workloadData, rb *rowrequest.Builder, fp string) (_ *unit, err error) {
	pacer, popts, start, err := s.pacer(w, wd)
	if err != nil {
		return nil, err
	}
	logger := log.With(s.logger, "workload", w.Name, "target", t.Name)
	salt, empty := s.salt(w, t, logger)
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
	// The side jobs each result goes through after the cache-truth step,
	// in this order.
	var chain []resultObserver
	kv := s.kv.following[t.Name]
	if kv != nil {
		chain = append(chain, missedHits{offer: kv.offer, salt: salt})
	}
	if watch := s.layouts.watches[t.Name]; watch != nil {
		chain = append(chain, watch)
	}
	var template *templateOverhead
	if t.API == openai.APIChat && !rb.TokenIDs {
		// A chat template wraps the built prompt: its size, measured at
		// the (re)load where the target can say, or learnt from answers.
		tc := s.layouts.caches[t.Name]
		template = newTemplateOverhead(logger, tc.chatTemplate, tc.chatTemplateKnown, s.templatePublisher(w.Name, t.Name))
		rb.TemplateRoom = template.get
		chain = append(chain, template)
	}
	chain = append(chain, newFailureLog(logger))
	if s.resultObserved != nil {
		chain = append(chain, resultHook(s.resultObserved))
	}
	gate := &gatedObserver{obs: s.truth, chain: chain}
	url := t.URL
	if t.Emulate != nil {
		url = s.emulators.url(t.Name)
	}
	tc := targetConfig(t, url)
	tc.CacheSalt = salt
	tc.Tracer = s.tracer
	tc.Workload = w.Name
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
		Clock:        s.clock,
		Start:        start,
		Cache:        newModel(pacer, s.layouts.caches[t.Name].params),
		OnBuildError: func(err error) { level.Warn(logger).Log("msg", "request not built, counted as dropped", "err", err) },
		Abandon:      abandonment(w),
	}, pacer, replay.SendWith(client), rb, gate)
	if err != nil {
		return nil, err
	}
	return &unit{fingerprint: fp, workload: wl, client: client, gate: gate, template: template, misses: kv != nil, plan: wd.trace.plan,
		pacerOpts: popts, newModel: newModel, done: make(chan struct{})}, nil
}

// collectorSLO is a workload's slo key as the collector judges it; nil
// without one.
func collectorSLO(s *config.SLO) *collector.SLO {
	if s == nil {
		return nil
	}
	return &collector.SLO{TTFT: time.Duration(s.TTFT), InterToken: time.Duration(s.InterToken), Request: time.Duration(s.Request), Objective: s.Objective}
}

// abandonment is a workload's abandon key as the replay takes it.
func abandonment(w *config.Workload) replay.Abandonment {
	a := w.Abandon
	if a == nil {
		return replay.Abandonment{}
	}
	return replay.Abandonment{Share: a.Share, Seed: w.Seed, When: openai.Abandon{AfterTokens: a.AfterTokens, After: time.Duration(a.After)}}
}

// templatePublisher exports the chat template size of workload w on
// target t as its unit settles it.
func (s *unitSet) templatePublisher(w, t string) templatePublisher {
	return func(tokens int, source collector.TemplateSource, corrected bool) {
		s.coll.ChatTemplate().Set(w, t, tokens, source)
		if corrected {
			s.coll.ChatTemplate().Corrected(w, t)
		}
	}
}

// unitRequestBuilder is the request builder of workload w on target t:
// the workload's prompts, or with token-id prompts a builder with t's
// tokenizer (loaded once per reload into tokenizers).
func unitRequestBuilder(w *config.Workload, t *config.Target, wd *workloadData, tokenizers map[string]tokenizer.Tokenizer) (*rowrequest.Builder, error) {
	rb := &rowrequest.Builder{Prompts: wd.builder, Sessions: t.SessionHeader != ""}
	if t.PromptFormat != openai.PromptFormatTokenIDs {
		return rb, nil
	}
	rb.TokenIDs = true
	tok := tokenizers[t.Tokenizer]
	if tok == nil {
		var err error
		if tok, err = tokenizer.Load(t.Tokenizer); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		tokenizers[t.Tokenizer] = tok
	}
	var err error
	rb.Prompts, err = prompt.NewBuilder(prompt.Options{BlockSize: w.BlockSize, Seed: w.Seed, CacheBytes: promptCacheBytes, Tokenizer: tok})
	return rb, err
}

// pacer is the unit's cursor over the trace's shared plan, the
// options it was made with, and the time its grid starts (zero for a
// single pass, which starts from the top now).
func (s *unitSet) pacer(w *config.Workload, wd *workloadData) (*replay.Pacer, replay.PacerOptions, time.Time, error) {
	shard := w.Shard
	if s.shard != nil {
		shard = *s.shard
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
	offset, err := pacer.SeekTime(now.Sub(s.anchor))
	if err != nil {
		return nil, opts, time.Time{}, err
	}
	if wd.trace.plan.Schedule().Closed() {
		// Users start now, where the grid stands: its pass numbers keep a
		// restart's prompts apart from the last run's.
		return pacer, opts, time.Time{}, nil
	}
	return pacer, opts, s.anchor.Add(offset), nil
}

// unitSet is the part that runs the replay units, one per (workload,
// target).
type unitSet struct {
	*common
	emulators *emulatorSet
	layouts   *layoutSet
	kv        *kvSet
	// anchor is the origin of every looping workload's pass grid: replicas
	// and restarts agree on pass numbers, positions and prompts.
	anchor time.Time
	// shard, when set (--shard), replaces every workload's own shard.
	shard *config.Shard
	// clock paces the replay; nil is the system clock (a seam for tests).
	// resultObserved, when set, hears each result last; replayFinished
	// hears the end of a loop: once unit's pass (Options).
	clock          replay.DispatchClock
	resultObserved func(*replay.Result)
	replayFinished func(workload, target string)
	// epoch makes the cache salts of targets that isolate without an
	// isolation_epoch: this daemon's own (see salt).
	epoch     string
	saltsSent map[string]bool // the cache salts units were given

	byKey map[unitKey]*unit
	// stopped are the workloads a unit of which a reload stopped: one none
	// of whose units survive starts over (see apply).
	stopped map[string]bool

	// Every running unit, for halt: the owner goroutine may be busy (a slow
	// reload) when the shutdown begins, and dispatch must end at once.
	haltMu sync.Mutex
	halted bool
	live   map[*unit]struct{}
}

func newUnitSet(c *common, shard *config.Shard, emulators *emulatorSet) *unitSet {
	return &unitSet{common: c, emulators: emulators, anchor: time.Unix(0, 0), shard: shard, epoch: newEpoch(),
		saltsSent: map[string]bool{}, byKey: map[unitKey]*unit{}, stopped: map[string]bool{}, live: map[*unit]struct{}{}}
}

// fingerprint is what the unit of workload w on target tn is restarted
// on a change of.
func (s *unitSet) fingerprint(next *nextConfig, w *config.Workload, tn string) string {
	cfg := next.cfg
	return cfg.Fingerprint("workload", w.Name) + "\x00" + cfg.Fingerprint("target", tn) + "\x00" +
		next.workloads[w.Name].trace.file.hash + "\x00" + s.emulators.url(tn)
}

// build makes the request builders of the units next starts (those not
// running as next asks), loading each tokenizer once.
func (s *unitSet) build(next *nextConfig) (map[unitKey]*rowrequest.Builder, error) {
	builders := map[unitKey]*rowrequest.Builder{}
	tokenizers := map[string]tokenizer.Tokenizer{}
	var errs []error
	for i := range next.cfg.Workloads {
		w := &next.cfg.Workloads[i]
		for _, tn := range w.Targets {
			k := unitKey{w.Name, tn}
			if u := s.byKey[k]; u != nil && u.fingerprint == s.fingerprint(next, w, tn) {
				continue
			}
			rb, err := unitRequestBuilder(w, next.target(tn), next.workloads[w.Name], tokenizers)
			if err != nil {
				errs = append(errs, fmt.Errorf("workload %s, target %s: %w", w.Name, tn, err))
				continue
			}
			builders[k] = rb
		}
	}
	return builders, errors.Join(errs...)
}

// stop stops the units next no longer has or has otherwise. With next
// nil (the shutdown) every unit stops and drains, its series kept for the
// last scrape, and stop returns once all have drained.
func (s *unitSet) stop(next *nextConfig) {
	if next == nil {
		s.drainAll()
		return
	}
	want := map[unitKey]string{}
	for i := range next.cfg.Workloads {
		w := &next.cfg.Workloads[i]
		for _, tn := range w.Targets {
			want[unitKey{w.Name, tn}] = s.fingerprint(next, w, tn)
		}
	}
	for k, u := range s.byKey {
		if want[k] != u.fingerprint {
			s.stopOne(k, u)
		}
	}
}

// apply stops the units next changed or removed and starts those it adds
// or changed; each that cannot start is reported, and the others run.
func (s *unitSet) apply(_, unitCtx context.Context, next *nextConfig) error {
	s.stop(next)
	// A workload none of whose units survived starts over from pass 0: its
	// pass count must too, or kvload_trace_loops_total stalls until the new
	// units catch up with the old count.
	for k := range s.byKey {
		delete(s.stopped, k.workload)
	}
	for w := range s.stopped {
		s.coll.ForgetWorkload(w)
	}
	clear(s.stopped)
	var errs []error
	for i := range next.cfg.Workloads {
		w := &next.cfg.Workloads[i]
		for _, tn := range w.Targets {
			k := unitKey{w.Name, tn}
			if _, running := s.byKey[k]; running {
				continue
			}
			t := next.target(tn)
			rb := next.builders[k]
			if rb == nil {
				errs = append(errs, fmt.Errorf("workload %s, target %s: no request builder was built", w.Name, tn))
				continue
			}
			u, err := s.start(unitCtx, w, t, next.workloads[w.Name], rb, s.fingerprint(next, w, tn))
			if err != nil {
				errs = append(errs, fmt.Errorf("workload %s, target %s: %w", w.Name, tn, err))
				continue
			}
			s.byKey[k] = u
		}
	}
	return errors.Join(errs...)
}

// stopOne stops dispatching at once, deletes the unit's series, and drains
// its in-flight requests in the background (cut at the drain timeout).
func (s *unitSet) stopOne(k unitKey, u *unit) {
	delete(s.byKey, k)
	s.stopped[k.workload] = true
	s.unregister(u)
	u.stopping.Store(true)
	u.gate.close() // no late call recreates the series deleted next
	s.coll.Forget(k.workload, k.target)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		u.workload.Stop(s.drainTimeout)
		<-u.done
		u.client.Close()
	}()
	level.Info(s.logger).Log("msg", "replay stopped by reload", "workload", k.workload, "target", k.target)
}

// stopTarget stops the units of target, as stopOne does.
func (s *unitSet) stopTarget(target string) {
	for k, u := range s.byKey {
		if k.target == target {
			s.stopOne(k, u)
		}
	}
}

// drainAll stops every unit, letting in-flight requests finish for up to
// the drain timeout (their results are still counted), and waits for them.
func (s *unitSet) drainAll() {
	var wg sync.WaitGroup
	for _, u := range s.byKey {
		u.stopping.Store(true)
		wg.Go(func() {
			u.workload.Stop(s.drainTimeout)
			<-u.done
			u.client.Close()
		})
	}
	wg.Wait()
}

// register adds a unit about to run to those halt stops; false once the
// shutdown began, when it must not run.
func (s *unitSet) register(u *unit) bool {
	s.haltMu.Lock()
	defer s.haltMu.Unlock()
	if s.halted {
		return false
	}
	s.live[u] = struct{}{}
	return true
}

func (s *unitSet) unregister(u *unit) {
	s.haltMu.Lock()
	delete(s.live, u)
	s.haltMu.Unlock()
}

// halt ends every unit's dispatch and starts its drain, from any
// goroutine, without waiting; no unit starts after it. also runs last,
// under the same lock as unlessHalted: whoever sees its effect knows that
// every unit was told to stop dispatching.
func (s *unitSet) halt(also func()) {
	s.haltMu.Lock()
	defer s.haltMu.Unlock()
	s.halted = true
	for u := range s.live {
		u.stopping.Store(true)
		u.workload.Halt(s.drainTimeout)
	}
	also()
}

// unlessHalted runs f unless halt has begun, and keeps halt from
// beginning while it runs.
func (s *unitSet) unlessHalted(f func()) {
	s.haltMu.Lock()
	defer s.haltMu.Unlock()
	if !s.halted {
		f()
	}
}

// followCache gives every unit of target a model of params, from the row
// it sends next: the rows it sent before are the new model's warm-up.
func (s *unitSet) followCache(target string, params replay.CacheParams) {
	for k, u := range s.byKey {
		if k.target != target {
			continue
		}
		if err := u.followCache(params); err != nil {
			// The pacer's options and position are the unit's own: this
			// cannot fail unless they are broken.
			level.Error(s.logger).Log("msg", "the unit's model could not follow the target's cache", "workload", k.workload, "target", target, "err", err)
		}
	}
}

// followCache makes u's model stand for params from the row it sends next.
func (u *unit) followCache(params replay.CacheParams) error {
	pacer, err := u.plan.NewPacer(u.pacerOpts)
	if err != nil {
		return fmt.Errorf("cache model: %w", err)
	}
	if err := pacer.Seek(u.workload.Position()); err != nil {
		return fmt.Errorf("cache model: %w", err)
	}
	u.workload.SetCache(u.newModel(pacer, params))
	return nil
}

// salt is the cache salt of workload w on target t, "" when t does not
// isolate; fresh says that no request can have carried it before: its
// epoch is this daemon's own and no unit of this daemon sent it yet, so
// the engine holds nothing of it. Owner goroutine only.
func (s *unitSet) salt(w *config.Workload, t *config.Target, logger log.Logger) (salt string, fresh bool) {
	if !t.Cache.Isolate {
		return "", false
	}
	epoch, from := s.epoch, "drawn at this start"
	if t.Cache.IsolationEpoch != "" {
		epoch, from = t.Cache.IsolationEpoch, "configured"
	}
	salt = cacheSalt(epoch, w.Name, t.Name)
	fresh = t.Cache.IsolationEpoch == "" && !s.saltsSent[salt]
	s.saltsSent[salt] = true
	level.Info(logger).Log("msg", "requests carry a cache salt of their own: the engine shares their prefixes with no other client", "epoch", from, "engine_holds_nothing_yet", fresh)
	return salt, fresh
}

// targetConfig converts a configured target for the client; url is the
// emulator's when the target is emulated.
func targetConfig(t *config.Target, url string) openai.TargetConfig {
	return openai.TargetConfig{
		Name:             t.Name,
		URL:              url,
		Model:            t.Model,
		API:              t.API,
		Dialect:          t.Dialect,
		PromptFormat:     t.PromptFormat,
		RequestTimeout:   time.Duration(t.RequestTimeout),
		HTTPClientConfig: *t.HTTPClientConfig,
		ExtraBody:        t.ExtraBody,
		SessionHeader:    t.SessionHeader,
	}
}
