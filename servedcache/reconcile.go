package servedcache

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// ReconcileState is what the comparison of a target's engine counters with
// its responses says: a label value of kvload_cache_reconcile_state.
type ReconcileState string

// Reconciliation states, in the order they are decided: the first that
// holds is the state.
const (
	// ReconcileNoEngineCounter: no read of the engine's counters in the
	// window (the page is absent, unreachable, or lacks the counter).
	ReconcileNoEngineCounter ReconcileState = "no_engine_counter"
	// ReconcileNoQueryCounter: the engine counts its hits but not the
	// prompt tokens it looked up, so whose traffic the hits are cannot
	// be told.
	ReconcileNoQueryCounter ReconcileState = "no_query_counter"
	// ReconcileNothingCounted: the engine counted no prompt tokens in the
	// window (an idle engine, or a page that is not this target's).
	ReconcileNothingCounted ReconcileState = "nothing_counted"
	// ReconcileEngineUndercounted: the engine counted fewer prompt tokens
	// than this exporter's requests had (a canary share above
	// MaxCanaryShare): the page read is not this target's engine, or the
	// engine does not count every prompt it processes.
	ReconcileEngineUndercounted ReconcileState = "engine_undercounted"
	// ReconcileNotReported: no response of the window carried a
	// cached-token count.
	ReconcileNotReported ReconcileState = "not_reported"
	// ReconcileSharedEngine: this exporter sent under MinCanaryShare of
	// the prompt tokens the engine counted; its counters hold other
	// clients' traffic.
	ReconcileSharedEngine ReconcileState = "shared_engine"
	// ReconcileTooFewHits: under minReconcileHitRate of the responses'
	// prompt tokens were cached: too few for a ratio.
	ReconcileTooFewHits ReconcileState = "too_few_hits"
	// ReconcileCompared: the ratios are exported.
	ReconcileCompared ReconcileState = "compared"
)

// ReconcileStates lists every state, for the state series.
var ReconcileStates = [...]ReconcileState{ReconcileNoEngineCounter, ReconcileNoQueryCounter, ReconcileNothingCounted,
	ReconcileEngineUndercounted, ReconcileNotReported, ReconcileSharedEngine, ReconcileTooFewHits, ReconcileCompared}

// The comparison's thresholds: those of the recording rules and of
// KvloadCacheEngineMetricsDisagree (dashboards/rules).
const (
	// MinTheoreticalRate: below this theoretical hit rate, a rate over
	// the model's says little.
	MinTheoreticalRate = 0.05
	// ReconcileWindow is the time the exporter's own figures cover.
	ReconcileWindow = 5 * time.Minute
	// MinCanaryShare: the share of the engine's prompt tokens this
	// exporter must have sent for the engine's counter to be comparable
	// with its responses. Other traffic that hits more or less often
	// than the canary's moves the engine's hit rate by up to 1 −
	// MinCanaryShare.
	MinCanaryShare = 0.95
	// MaxCanaryShare: above it, this exporter sent more prompt tokens
	// than the engine counted by more than the noise of requests
	// straddling a read; the engine's counters are not of its traffic.
	MaxCanaryShare = 1.05
	// minReconcileHitRate: below this share of prompt tokens cached (in
	// the responses), a ratio of hit rates is mostly noise.
	minReconcileHitRate = 0.05
	// The engine's hit rate over the responses' outside these bounds is
	// a disagreement.
	ReconcileDisagreeBelow = 0.8
	ReconcileDisagreeAbove = 1.25
	// reconcileSettle: a request in flight for longer does not hold the
	// figures back (see figure).
	reconcileSettle = time.Minute
	// reconcileSendSlack is how long before its result's send time a
	// request may have been reported sent (the request is built between).
	reconcileSendSlack = time.Second
	// reconcileForget: a request in flight for longer is forgotten (its
	// result was dropped by a reload), beyond any request timeout.
	reconcileForget = 15 * time.Minute
)

// canarySums are what this exporter's successful requests to a target
// counted between two reads of the engine's counters.
type canarySums struct {
	prompt float64 // server prompt tokens (the trace's where usage has none)
	// Those of the requests whose usage carried a cached-token count, and
	// their cached tokens: the responses' side, whatever cache.observed.
	usagePrompt, usageCached float64
	// The trace's input_length of the requests whose theoretical cached
	// tokens are known, and those tokens: the model's side.
	trace, theoretical float64
}

func (s *canarySums) add(o canarySums) {
	s.prompt += o.prompt
	s.usagePrompt += o.usagePrompt
	s.usageCached += o.usageCached
	s.trace += o.trace
	s.theoretical += o.theoretical
}

// reconcileRead is one good read of the engine's counters: their increase
// since the read before, and what this exporter's requests sent in that
// time counted, added as they finish.
type reconcileRead struct {
	at                         time.Time
	engineCached, enginePrompt float64
	promptKnown                bool
	// engineRecomputed: the cached tokens the engine computed again, where
	// it counts them (recomputedKnown); in neither engineCached nor usage.
	engineRecomputed float64
	recomputedKnown  bool
	canary           canarySums
}

// reconcileTarget is what is kept of one reconciled target.
type reconcileTarget struct {
	since time.Time // reconciled since
	// baselineAt is when the scraper's first read took the counters'
	// values; zero before. Requests sent until then count on neither side.
	baselineAt time.Time
	// floor: a request sent at or before it counts in no read (the
	// baseline, or the last read that left the window).
	floor   time.Time
	pending canarySums // of the requests sent since the last good read
	// unposted: of the requests finished since the last good read, which
	// the counters take at the next.
	unposted canarySums
	reads    []reconcileRead
	// inFlight holds the send times of the requests in flight, in order.
	inFlight []time.Time
	// The last failed read, for the landing page.
	lastError   engine.ServerMetricsErrorReason
	lastErrorAt time.Time
}

// Reconciliation compares, per target, the engine's own counters with the
// responses' usage and the model. It adds up what it is handed: each
// finished request, and each read of the engine's counters; the figures
// are taken over the reads of the last ReconcileWindow (Status).
type Reconciliation struct {
	now func() time.Time

	mu      sync.Mutex
	targets map[string]*reconcileTarget
}

// NewReconciliation compares no target yet; now is the clock.
func NewReconciliation(now func() time.Time) *Reconciliation {
	return &Reconciliation{now: now, targets: map[string]*reconcileTarget{}}
}

// ReadIncrease is what one good read adds to a target's counters: the
// engine's increase, and what this exporter's requests finished since the
// read before counted. Stepped is false for a read that adds nothing: the
// baseline, one that finds the engine restarted, or one of a target not
// compared.
type ReadIncrease struct {
	Stepped                                bool
	EngineCached, EnginePrompt             float64
	CanaryPrompt, UsagePrompt, UsageCached float64
	// EngineRecomputed is the increase of the engine's recomputed-token
	// counter, where it has one (RecomputedKnown).
	EngineRecomputed float64
	RecomputedKnown  bool
}

// Start begins comparing target's engine counters with its responses: from
// now on its finished requests are added up between two reads (Read). It
// is false for a target already compared, which goes on.
func (r *Reconciliation) Start(target string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.targets[target] != nil {
		return false
	}
	r.targets[target] = &reconcileTarget{since: r.now()}
	return true
}

// Stop ends the comparison for target.
func (r *Reconciliation) Stop(target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.targets, target)
}

// Sent notes a request of a compared target going out now.
func (r *Reconciliation) Sent(target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.targets[target]; st != nil {
		now := r.now()
		i := sort.Search(len(st.inFlight), func(i int) bool { return st.inFlight[i].After(now) })
		st.inFlight = slices.Insert(st.inFlight, i, now)
	}
}

// Finished adds a finished request of a compared target to the read whose
// interval the engine counted its prompt in, about (admittedAbout). Only
// successes count: their prompt tokens are known. The responses' side takes every request whose usage carried a
// cached-token count, with cache.observed usage or server_metrics alike,
// the preamble included, as the engine's counter includes it.
//
// The engine counts a prompt when it schedules it, after its queue and
// before its prefill, so that a read's increase is of the prompts whose
// first tokens came since the read before, give or take a prefill, and
// the exporter's of the same prompts is known once those sent before the
// read have all finished (see sums). A request counted before the
// baseline was counted in the engine's baseline, and counts on neither
// side. The counters take the
// requests finished since the read before at each read, beside the
// engine's increase: both sides step together, and the requests in flight
// at either end of a few minutes' rate are about as many, for the
// recording rules.
func (r *Reconciliation) Finished(res *replay.Result) {
	var s canarySums
	if res.Outcome == openai.OutcomeSuccess {
		s.prompt = float64(promptOf(res))
		if res.CachedKnown {
			s.usagePrompt, s.usageCached = s.prompt, float64(res.CachedTokens)
		}
		if res.TheoreticalKnown {
			s.trace, s.theoretical = float64(res.TraceInputLength), float64(res.TheoreticalCachedTokens)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.targets[res.Target]
	if st == nil {
		return
	}
	st.landed(res.Sent)
	at := admittedAbout(res)
	if res.Outcome != openai.OutcomeSuccess || st.baselineAt.IsZero() || !at.After(st.floor) {
		return
	}
	st.unposted.add(s)
	if i := sort.Search(len(st.reads), func(i int) bool { return !st.reads[i].at.Before(at) }); i < len(st.reads) {
		st.reads[i].canary.add(s)
		return
	}
	st.pending.add(s)
}

// admittedAbout is about when the engine counted res's prompt: just
// before its first token (its prefill between), else when it was sent.
func admittedAbout(res *replay.Result) time.Time {
	if !res.FirstToken.IsZero() {
		return res.FirstToken
	}
	return res.Sent
}

// landed takes a finished request sent at sent off those in flight: the
// last noted at most reconcileSendSlack before it, if any.
func (st *reconcileTarget) landed(sent time.Time) {
	i := sort.Search(len(st.inFlight), func(i int) bool { return st.inFlight[i].After(sent) }) - 1
	if i >= 0 && sent.Sub(st.inFlight[i]) <= reconcileSendSlack {
		st.inFlight = slices.Delete(st.inFlight, i, i+1)
	}
}

// Read adds a read of target's engine counters and says what it adds to
// the target's counters. The first read only sets the baseline, and so
// does a read that finds the engine restarted: what the engine counted
// between the read before and its end is lost, and the exporter's requests
// of that time count on neither side. An implausible increase (not finite,
// negative, beyond 2^53) is refused, as a failed read, with its reason;
// reason is empty for a read taken.
func (r *Reconciliation) Read(target string, d engine.ServerCounts) (inc ReadIncrease, reason engine.ServerMetricsErrorReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.targets[target]
	if st == nil {
		return ReadIncrease{}, ""
	}
	now := r.now()
	if reason = implausibleRead(d); reason != "" {
		st.lastError, st.lastErrorAt = reason, now
		return ReadIncrease{}, reason
	}
	rd := reconcileRead{at: d.At, promptKnown: d.PromptKnown, recomputedKnown: d.RecomputedKnown}
	if rd.at.IsZero() || rd.at.After(now) {
		rd.at = now
	}
	// The first read of a target seen here is its baseline, whatever the
	// scraper's: with observed: server_metrics the scraper took its own
	// before the first request.
	if d.Baseline || d.Restarted || st.baselineAt.IsZero() {
		st.baselineAt, st.floor = rd.at, rd.at
	} else {
		rd.engineCached, rd.canary = d.Cached, st.pending
		if d.PromptKnown {
			rd.enginePrompt = d.Prompt
		}
		if d.RecomputedKnown {
			rd.engineRecomputed = d.Recomputed
		}
		inc = ReadIncrease{Stepped: true, EngineCached: rd.engineCached, EnginePrompt: rd.enginePrompt,
			CanaryPrompt: st.unposted.prompt, UsagePrompt: st.unposted.usagePrompt, UsageCached: st.unposted.usageCached,
			EngineRecomputed: rd.engineRecomputed, RecomputedKnown: d.RecomputedKnown}
	}
	st.pending, st.unposted = canarySums{}, canarySums{}
	st.reads = append(st.prune(now), rd)
	return inc, ""
}

// maxReadIncrease: above it a float64 no longer holds every whole number,
// and no counter of tokens can have risen that much between two reads.
const maxReadIncrease = 1 << 53

// implausibleRead is why a read's increases cannot be counted, or empty.
// The prompt-token and recomputed-token counters are held to the rules of
// the cached one: any poisons every rate once added to a counter.
func implausibleRead(d engine.ServerCounts) engine.ServerMetricsErrorReason {
	values := []float64{d.Cached}
	if d.PromptKnown {
		values = append(values, d.Prompt)
	}
	if d.RecomputedKnown {
		values = append(values, d.Recomputed)
	}
	for _, v := range values {
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			return engine.ServerErrorNotFinite
		case v < 0:
			return engine.ServerErrorNegative
		case v > maxReadIncrease:
			return engine.ServerErrorTooLarge
		}
	}
	return ""
}

// Failed notes a read of target's engine counters that failed, for the
// landing page; the next good read spans its time, on both sides. It is
// false for a target not compared.
func (r *Reconciliation) Failed(target string, reason engine.ServerMetricsErrorReason) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.targets[target]
	if st == nil {
		return false
	}
	st.lastError, st.lastErrorAt = reason, r.now()
	return true
}

// prune drops the reads older than the window ending at now, and the
// requests in flight for longer than reconcileForget.
func (st *reconcileTarget) prune(now time.Time) []reconcileRead {
	i := 0
	for i < len(st.reads) && now.Sub(st.reads[i].at) > ReconcileWindow {
		st.floor = st.reads[i].at
		i++
	}
	st.reads = append(st.reads[:0], st.reads[i:]...)
	j := sort.Search(len(st.inFlight), func(j int) bool { return now.Sub(st.inFlight[j]) <= reconcileForget })
	st.inFlight = append(st.inFlight[:0], st.inFlight[j:]...)
	return st.reads
}

// Status is every compared target's figures now, sorted by target.
func (r *Reconciliation) Status() []ReconcileStatus {
	now := r.now()
	r.mu.Lock()
	out := make([]ReconcileStatus, 0, len(r.targets))
	for name, st := range r.targets {
		st.prune(now)
		out = append(out, st.figure(name, now))
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out
}

// ReconcileStatus is the comparison of one target's engine counters with
// its responses and the model, over the window ending now.
type ReconcileStatus struct {
	Target string
	State  ReconcileState
	// Reason says in words why the state is what it is.
	Reason string
	// Window is the time the figures cover: ReconcileWindow, or since the
	// target is reconciled.
	Window time.Duration
	// CanaryShare is this exporter's prompt tokens over the engine's, where
	// the engine counted any (ShareKnown).
	CanaryShare float64
	ShareKnown  bool
	// The three hit rates: the engine's counters', the responses' (usage)
	// and the model's (theoretical over the trace's tokens).
	EngineHitRate, UsageHitRate, TheoreticalRate float64
	// EngineOverUsage is the engine's hit rate over the responses', in the
	// state compared; Disagree when it is outside the alert's bounds.
	EngineOverUsage float64
	Disagree        bool
	// The two rates over the model's, in the state compared where the
	// model's rate is minTheoretical or more (ModelKnown).
	UsageOverModel, EngineOverModel float64
	ModelKnown                      bool
	// EngineRecomputed is the tokens the engine found in its cache and
	// computed again over the window's reads, where it counts them
	// (RecomputedKnown): a reason of their own, on neither side of the
	// hit rates.
	EngineRecomputed float64
	RecomputedKnown  bool
	// LastError is the reason the last read failed, at LastErrorAt; empty
	// when none did.
	LastError   string
	LastErrorAt time.Time
}

// reconcileSums are a window's reads added up.
type reconcileSums struct {
	reads, promptKnownReads    int
	engineCached, enginePrompt float64
	engineRecomputed           float64
	recomputedKnown            bool // some read of them counted recomputed tokens
	canary                     canarySums
}

// sums adds up the window's reads whose requests have all finished: a
// read after the send of a request still in flight is left out, unless
// that request has been in flight for longer than reconcileSettle (a slow
// one, or one whose result a reload dropped).
func (st *reconcileTarget) sums(now time.Time) reconcileSums {
	var s reconcileSums
	j := sort.Search(len(st.inFlight), func(j int) bool { return now.Sub(st.inFlight[j]) <= reconcileSettle })
	for _, rd := range st.reads {
		if j < len(st.inFlight) && !rd.at.Before(st.inFlight[j]) {
			break
		}
		s.reads++
		if !rd.promptKnown {
			continue
		}
		// Only reads that tell the engine's prompt tokens are compared:
		// the share needs them.
		s.promptKnownReads++
		s.engineCached += rd.engineCached
		s.enginePrompt += rd.enginePrompt
		s.engineRecomputed += rd.engineRecomputed
		s.recomputedKnown = s.recomputedKnown || rd.recomputedKnown
		s.canary.add(rd.canary)
	}
	return s
}

// figure is the target's comparison now; its reads are pruned.
func (st *reconcileTarget) figure(target string, now time.Time) ReconcileStatus {
	f := ReconcileStatus{Target: target, Window: min(now.Sub(st.since), ReconcileWindow), LastError: string(st.lastError), LastErrorAt: st.lastErrorAt}
	s := st.sums(now)
	if s.enginePrompt > 0 {
		f.EngineHitRate = s.engineCached / s.enginePrompt
		f.CanaryShare, f.ShareKnown = s.canary.prompt/s.enginePrompt, true
	}
	if s.canary.usagePrompt > 0 {
		f.UsageHitRate = s.canary.usageCached / s.canary.usagePrompt
	}
	if s.canary.trace > 0 {
		f.TheoreticalRate = s.canary.theoretical / s.canary.trace
	}
	f.EngineRecomputed, f.RecomputedKnown = s.engineRecomputed, s.recomputedKnown
	f.State, f.Reason = reconcileState(s, f)
	if f.State != ReconcileCompared {
		return f
	}
	f.EngineOverUsage = f.EngineHitRate / f.UsageHitRate
	f.Disagree = f.EngineOverUsage < ReconcileDisagreeBelow || f.EngineOverUsage > ReconcileDisagreeAbove
	if f.TheoreticalRate >= MinTheoreticalRate {
		f.ModelKnown = true
		f.UsageOverModel, f.EngineOverModel = f.UsageHitRate/f.TheoreticalRate, f.EngineHitRate/f.TheoreticalRate
	}
	f.Reason = comparedReason(f)
	return f
}

// reconcileState is the state of a window's sums, with its reason.
func reconcileState(s reconcileSums, f ReconcileStatus) (ReconcileState, string) {
	switch {
	case s.reads == 0 && f.LastError != "":
		return ReconcileNoEngineCounter, fmt.Sprintf("no good read of the engine's counters in the last %v (the last failed: %s); the responses count as before", f.Window.Round(time.Second), f.LastError)
	case s.reads == 0:
		return ReconcileNoEngineCounter, "the engine's counters not read yet"
	case s.promptKnownReads == 0:
		return ReconcileNoQueryCounter, "the engine counts its cached tokens but not its prompt tokens: whose traffic they are cannot be told"
	case s.enginePrompt == 0 && s.canary.prompt > 0:
		return ReconcileNothingCounted, fmt.Sprintf("the engine counted no prompt tokens while this exporter's requests had %.0f: the page read is not this target's engine (cache.metrics_url)", s.canary.prompt)
	case s.enginePrompt == 0:
		return ReconcileNothingCounted, "no prompt tokens counted in the window"
	case f.CanaryShare > MaxCanaryShare:
		return ReconcileEngineUndercounted, fmt.Sprintf("the engine counted %.0f prompt tokens while this exporter's requests had %.0f (a share of %.2f): the page read is not this target's engine (cache.metrics_url), or the engine does not count every prompt", s.enginePrompt, s.canary.prompt, f.CanaryShare)
	case s.canary.usagePrompt == 0:
		return ReconcileNotReported, "no response of the window carried a cached-token count"
	case f.CanaryShare < MinCanaryShare:
		return ReconcileSharedEngine, fmt.Sprintf("this exporter sent %.1f%% of the prompt tokens the engine counted: other clients, or other replicas of a sharded workload, share it (the recording rules compare the fleet's sum)", 100*f.CanaryShare)
	case f.UsageHitRate < minReconcileHitRate:
		return ReconcileTooFewHits, fmt.Sprintf("the responses report %.1f%% of their prompt tokens cached, under %.0f%%: too few for a ratio", 100*f.UsageHitRate, 100*minReconcileHitRate)
	}
	return ReconcileCompared, ""
}

// comparedReason says what a compared window shows, and how many cached
// tokens the engine computed again where it counts them.
func comparedReason(f ReconcileStatus) string {
	reason := fmt.Sprintf("the engine's counters agree with its responses (%.2f)", f.EngineOverUsage)
	if f.Disagree {
		reason = fmt.Sprintf("the engine's metrics disagree with its responses: its counters read %.2f × the hit rate its responses report (outside %.2f to %.2f)",
			f.EngineOverUsage, ReconcileDisagreeBelow, ReconcileDisagreeAbove)
	}
	if f.RecomputedKnown && f.EngineRecomputed > 0 {
		reason += fmt.Sprintf("; recomputed: the engine found %.0f more tokens in its cache and computed them again, counted on neither side", f.EngineRecomputed)
	}
	return reason
}
