package lifecycle

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/kvevents"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// untilSlack is added to a request's first token for the moment the
// engine had looked it up: a removal published with the step that
// scheduled it may arrive a little after the first token.
const untilSlack = 100 * time.Millisecond

// kvFollowing is one target's KV event streams, followed while it is
// configured.
type kvFollowing struct {
	fingerprint string
	streams     *kvevents.Target
	offer       *missOffer
}

// kvSet is the part that follows the KV event streams of the targets
// that have some, to classify their missed hits.
type kvSet struct {
	*common
	explainer *kvevents.Explainer
	emulators *emulatorSet
	layouts   *layoutSet // the targets' block sizes
	following map[string]*kvFollowing
}

func newKVSet(c *common, explainer *kvevents.Explainer, emulators *emulatorSet, layouts *layoutSet) *kvSet {
	return &kvSet{common: c, explainer: explainer, emulators: emulators, layouts: layouts, following: map[string]*kvFollowing{}}
}

// endpoints are the event streams of t: cache.kv_events, else those of
// its emulated engine when that publishes any.
func (k *kvSet) endpoints(t *config.Target) []string {
	if len(t.Cache.KVEvents) > 0 {
		return t.Cache.KVEvents
	}
	if e := k.emulators.running[t.Name]; e != nil {
		if ep := e.engine.KVEventsEndpoint(); ep != "" {
			return []string{ep}
		}
	}
	return nil
}

// fingerprint is what following t's streams restarts on a change of.
func (k *kvSet) fingerprint(cfg *config.Config, t *config.Target) string {
	return cfg.Fingerprint("target", t.Name) + "\x00" + k.emulators.url(t.Name) + "\x00" + strings.Join(k.endpoints(t), "\x00")
}

// stop stops following the streams of targets that next changed, removed
// or gave none (all when next is nil), and waits for their goroutines,
// before their series are deleted. Each stream's context is cancelled
// first: the wait is as long as a stream takes to see it.
func (k *kvSet) stop(next *nextConfig) {
	var stopped []string
	var ends sync.WaitGroup
	for name, f := range k.following {
		if t := next.target(name); t != nil && len(k.endpoints(t)) > 0 && k.fingerprint(next.cfg, t) == f.fingerprint {
			continue
		}
		// All at once: the stop takes as long as the slowest stream, not
		// the sum of them.
		ends.Go(f.streams.Stop)
		stopped = append(stopped, name)
	}
	ends.Wait()
	for _, name := range stopped {
		k.coll.KVEvents().Stop(name)
		delete(k.following, name)
	}
}

// apply follows the event streams of every target of next that has some
// and is not followed yet (stop stops those no longer wanted), under
// unitCtx until a reload or the shutdown stops them, and returns once
// each new stream connected or failed to, within discoverTimeout (and
// ctx, the shutdown's).
func (k *kvSet) apply(ctx, unitCtx context.Context, next *nextConfig) error {
	cfg := next.cfg
	k.stop(next)
	var started []*kvevents.Target
	defer func() {
		// A target's first requests are classified only once its streams
		// are followed: each gets one try (bounded) before units start.
		wctx, cancel := context.WithTimeout(ctx, discoverTimeout)
		defer cancel()
		for _, t := range started {
			t.WaitTried(wctx)
		}
	}()
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		endpoints := k.endpoints(t)
		if len(endpoints) == 0 || k.following[t.Name] != nil {
			continue
		}
		client, err := targetHTTPClient(t, "kvload_kv_events")
		if err != nil {
			return fmt.Errorf("target %s: kv events client: %w", t.Name, err)
		}
		k.coll.KVEvents().Start(t.Name, len(endpoints))
		logger := log.With(k.logger, "target", t.Name)
		var replays []string
		if len(t.Cache.KVEvents) > 0 {
			replays = t.Cache.KVEventsReplayEndpoint
		}
		streams := kvevents.StartTarget(unitCtx, endpoints, replays, t.Cache.KVEventsMaxBlocks, newKVReporter(k.coll, t.Name, logger))
		offer := &missOffer{target: t.Name, events: streams, streams: streams.Streams, explainer: k.explainer, sink: k.coll.KVEvents(),
			spec: engine.For(t.Dialect), client: client, base: k.emulators.baseURL(t), model: t.Model, chat: t.API == openai.APIChat,
			blockSize: k.layouts.caches[t.Name].params.ServerBlock}
		k.following[t.Name] = &kvFollowing{fingerprint: k.fingerprint(cfg, t), streams: streams, offer: offer}
		started = append(started, streams)
		level.Info(logger).Log("msg", "following the engine's KV cache events, to classify missed hits", "endpoints", strings.Join(endpoints, ","),
			"replay_endpoints", strings.Join(replays, ","))
	}
	return nil
}

// kvReporter counts and logs what a target's streams do. The log follows
// the failure-streak rule, stream by stream: the first line at once, then
// at most one every interval, saying how many problems it left out; the
// counts are in the metrics.
type kvReporter struct {
	coll     *collector.Collector
	target   string
	logger   log.Logger
	interval time.Duration
	now      func() time.Time

	mu    sync.Mutex
	lines map[*kvevents.Stream]*kvLines // a target's streams, configured
}

// kvLines is what one stream's log said.
type kvLines struct {
	last time.Time // of the last line; zero before one
	left int       // lines not written since
}

func newKVReporter(coll *collector.Collector, target string, logger log.Logger) *kvReporter {
	return &kvReporter{coll: coll, target: target, logger: logger, interval: failureLogInterval, now: time.Now,
		lines: map[*kvevents.Stream]*kvLines{}}
}

// log writes a line about s, kv starting with its message, unless one was
// written less than an interval ago, in which case it is only counted, for
// the next line to say.
func (r *kvReporter) log(s *kvevents.Stream, lvl func(log.Logger) log.Logger, kv ...any) {
	r.mu.Lock()
	l := r.lines[s]
	if l == nil {
		l = &kvLines{}
		r.lines[s] = l
	}
	now := r.now()
	if !l.last.IsZero() && now.Sub(l.last) < r.interval {
		l.left++
		r.mu.Unlock()
		return
	}
	left := l.left
	l.last, l.left = now, 0
	r.mu.Unlock()
	// After the message: its endpoint, and what was left out.
	line := append([]any{kv[0], kv[1], "endpoint", s.Endpoint}, kv[2:]...)
	if left > 0 {
		line = append(line, "lines_left_out", left)
	}
	lvl(r.logger).Log(line...)
}

func (r *kvReporter) Up(s *kvevents.Stream, up bool) {
	if up {
		r.coll.KVEvents().Connected(r.target, 1)
		r.log(s, level.Info, "msg", "KV event stream connected")
		return
	}
	r.coll.KVEvents().Connected(r.target, -1)
}

func (r *kvReporter) Batch(s *kvevents.Stream, a kvevents.Applied) {
	r.coll.KVEvents().Batch(r.target)
	if a.Missed > 0 {
		// At most MaxSequenceJump: a longer jump is a restart.
		r.coll.KVEvents().Error(r.target, kvevents.ReasonGap, int(a.Missed))
		r.log(s, level.Warn, "msg", "KV event batches lost: requests sent before now are not classified", "batches", a.Missed)
	}
	if a.Restarted {
		r.coll.KVEvents().Error(r.target, kvevents.ReasonRestart, 1)
		r.log(s, level.Info, "msg", "the engine's KV event sequence started again (went back, or jumped too far to be batches lost): a new engine, whose cache starts empty")
	}
	if a.Unlinked > 0 {
		r.coll.KVEvents().Error(r.target, kvevents.ReasonUnlinked, a.Unlinked)
	}
	if n := a.TooMany + a.Inconsistent; n > 0 {
		r.coll.KVEvents().Error(r.target, kvevents.ReasonOverflow, n)
	}
}

func (r *kvReporter) Error(s *kvevents.Stream, reason kvevents.ErrorReason, n int, err error) {
	r.coll.KVEvents().Error(r.target, reason, n)
	switch reason {
	case kvevents.ReasonUnreachable, kvevents.ReasonDisconnected, kvevents.ReasonTooLarge, kvevents.ReasonStalled:
		r.log(s, level.Warn, "msg", "KV event stream not followed: missed hits are not classified until it is; the exporter tries again", "reason", reason, "err", err)
	case kvevents.ReasonReplay:
		r.log(s, level.Warn, "msg", "KV event gap not filled from the engine's replay socket: requests sent before it are not classified", "reason", reason, "err", err)
	default:
		r.log(s, level.Warn, "msg", "KV event message not taken", "reason", reason, "err", err)
	}
}

// missOffer hands a target's requests whose hits the engine missed to the
// explainer.
type missOffer struct {
	target    string
	events    *kvevents.Target // nothing is told of the target once it stops
	streams   []*kvevents.Stream
	explainer *kvevents.Explainer
	sink      kvevents.Sink
	spec      *engine.Spec
	client    *http.Client
	base      string
	model     string
	chat      bool
	blockSize int // the target's, until a stream tells its own
}

// offer queues r, sent under cache salt salt ("" for none), when the
// engine served fewer cached tokens than the model said: the tokens from
// what it served to what the model said are the missed ones. Only a
// request whose response counted its cached tokens (observed: usage) says
// which.
func (m *missOffer) offer(r *replay.Result, salt string) {
	if !r.Counted.Reported || !r.Counted.UsageCached {
		return
	}
	missed := r.TheoreticalCachedTokens - (r.CachedTokens - r.Counted.LeftOut)
	if missed <= 0 {
		return
	}
	now := time.Now()
	until := now
	if !r.FirstToken.IsZero() {
		until = r.FirstToken.Add(untilSlack)
	}
	job := kvevents.Job{Workload: r.Workload, Target: r.Target, From: m.events, Streams: m.streams, Done: now,
		Miss: kvevents.Miss{From: r.CachedTokens, To: r.CachedTokens + missed, BlockSize: m.blockSize, Sent: r.Sent, Until: until,
			Salt: salt}}
	req := &r.Request
	switch {
	case req.PromptTokenIDs != nil:
		ids := make([]uint32, len(req.PromptTokenIDs))
		for i, id := range req.PromptTokenIDs {
			ids[i] = uint32(id) // the tokenizer's: within 32 bits
		}
		job.Tokens = func(context.Context) ([]uint32, error) { return ids, nil }
		job.Bytes = 4 * len(ids)
	case req.Payload == nil && req.Messages == nil && m.spec.CanTokenizePrompts():
		prompt := req.Prompt
		job.Tokens = func(ctx context.Context) ([]uint32, error) { return m.tokenize(ctx, prompt) }
		job.Bytes = len(prompt)
	default:
		m.events.Report(func() { m.sink.MissedHitUnclassified(r.Workload, r.Target, kvevents.UnclassifiedRequestForm) })
		return
	}
	m.explainer.Offer(job)
}

// tokenize asks the engine for the ids it makes of prompt.
func (m *missOffer) tokenize(ctx context.Context, prompt string) ([]uint32, error) {
	var ids []uint32
	bad := false
	_, err := m.spec.TokenizePrompt(ctx, m.client, m.base, m.model, prompt, m.chat, func(id int) {
		if id < 0 || id > math.MaxUint32 {
			bad = true
		}
		ids = append(ids, uint32(id))
	})
	if err == nil && bad {
		err = fmt.Errorf("target %s: a token id outside 32 bits", m.target)
	}
	return ids, err
}
