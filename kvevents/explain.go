package kvevents

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// UnclassifiedReason is why a request's missed hit was not classified: a
// label value of kvload_cache_missed_hit_unclassified_requests_total.
type UnclassifiedReason string

// The reasons of kvload_cache_missed_hit_unclassified_requests_total.
const (
	// UnclassifiedNoStream: a stream of the target was not followed (not
	// connected, or it lost batches) at the request's send time.
	UnclassifiedNoStream UnclassifiedReason = "no_stream"
	// UnclassifiedTokenize: the prompt's token ids, as the engine sees
	// them, could not be read from the engine.
	UnclassifiedTokenize UnclassifiedReason = "tokenize"
	// UnclassifiedQueueFull: more missed requests waited than the
	// classifier holds.
	UnclassifiedQueueFull UnclassifiedReason = "queue_full"
	// UnclassifiedRequestForm: the request's prompt is not one the
	// exporter can tokenize as the engine does (a trace row's own
	// messages or payload, or an engine without such a tokenize route).
	UnclassifiedRequestForm UnclassifiedReason = "request_form"
	// UnclassifiedBlockSize: no stream told its block size, and the
	// target's is unknown.
	UnclassifiedBlockSize UnclassifiedReason = "block_size"
)

// UnclassifiedReasons lists every reason, for initialising series.
var UnclassifiedReasons = [...]UnclassifiedReason{UnclassifiedNoStream, UnclassifiedTokenize, UnclassifiedQueueFull,
	UnclassifiedRequestForm, UnclassifiedBlockSize}

// Sink hears the classifications.
type Sink interface {
	MissedHitTokens(workload, target string, class Class, tokens int)
	MissedHitUnclassified(workload, target string, reason UnclassifiedReason)
}

// Job is one request to classify.
type Job struct {
	Workload, Target string
	Streams          []*Stream
	// From is what follows Streams: once it has stopped, the job reports
	// nothing, and its waits end. nil in tests of Classify's callers.
	From *Target
	// Tokens returns the prompt's ids as the engine saw them: from the
	// request, or asked of the engine's tokenize route.
	Tokens func(ctx context.Context) ([]uint32, error)
	// Miss, Tokens left out.
	Miss Miss
	// Done is when the request finished: events are given until
	// Done+Grace to arrive.
	Done time.Time
	// Bytes is what the job holds until it is classified: its prompt's
	// token ids, or its text.
	Bytes int
}

const (
	// queueLen bounds the requests waiting, and maxQueuedBytes what their
	// prompts hold together (a row may have 2^24 tokens, 64 MiB of ids).
	queueLen       = 256
	maxQueuedBytes = 64 << 20
	// Grace is how long after a request ends its events are waited for:
	// the engine publishes each step's events at its end, and they travel
	// apart from the response.
	Grace = 200 * time.Millisecond
	// A classification waits for the streams to catch up with the
	// request's end: until a batch of after it came, or none came for
	// catchUpQuiet, at most catchUpMax (a stream that stays behind longer
	// is classified as far as it got), looking every catchUpPoll.
	catchUpQuiet = 2 * time.Second
	catchUpMax   = 10 * time.Second
	catchUpPoll  = 20 * time.Millisecond
	// tokenizeTimeout bounds one read of a prompt's token ids.
	tokenizeTimeout = 10 * time.Second
)

// Explainer classifies missed hits off the request path: Offer queues a
// job, Run's workers (at most workers at once, each asking the engine
// for a prompt's token ids at most once at a time) classify it and tell
// the Sink.
type Explainer struct {
	sink    Sink
	workers int
	jobs    chan Job
	now     func() time.Time
	queued  atomic.Int64 // Job.Bytes of the jobs queued or being classified
}

// NewExplainer returns an explainer that tells sink, with workers
// classifying at once.
func NewExplainer(sink Sink, workers int) *Explainer {
	return &Explainer{sink: sink, workers: max(workers, 1), jobs: make(chan Job, queueLen), now: time.Now}
}

// Offer queues j; a full queue, or one whose prompts hold maxQueuedBytes,
// counts it as unclassified (queue_full).
func (e *Explainer) Offer(j Job) {
	if e.queued.Add(int64(j.Bytes)) <= maxQueuedBytes {
		select {
		case e.jobs <- j:
			return
		default:
		}
	}
	e.queued.Add(-int64(j.Bytes))
	j.tell(func() { e.sink.MissedHitUnclassified(j.Workload, j.Target, UnclassifiedQueueFull) })
}

// tell runs report unless the job's target has stopped.
func (j *Job) tell(report func()) {
	if j.From == nil {
		report()
		return
	}
	j.From.Report(report)
}

// Run classifies queued jobs until ctx ends, then returns once its workers
// have; jobs still queued are dropped.
func (e *Explainer) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range e.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-e.jobs:
					e.classify(ctx, j)
					e.queued.Add(-int64(j.Bytes))
				}
			}
		}()
	}
	wg.Wait()
}

// classify does one job, until ctx or its target's stop ends it.
func (e *Explainer) classify(ctx context.Context, j Job) {
	if j.From != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(j.From.ctx, cancel)()
	}
	unclassified := func(reason UnclassifiedReason) {
		j.tell(func() { e.sink.MissedHitUnclassified(j.Workload, j.Target, reason) })
	}
	if !following(j.Streams, j.Miss.Sent) {
		unclassified(UnclassifiedNoStream)
		return
	}
	tctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	tokens, err := j.Tokens(tctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		unclassified(UnclassifiedTokenize)
		return
	}
	if wait := j.Done.Add(Grace).Sub(e.now()); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	// A gap being filled from the engine's replay socket: its batches
	// may be of before the send.
	for _, s := range j.Streams {
		s.settled(ctx)
	}
	// A busy exporter takes batches late: the request's are still on
	// their way while batches of before its end keep coming.
	if !e.caughtUp(ctx, j.Streams, j.Done) {
		return
	}
	if ctx.Err() != nil {
		return
	}
	// Again: a batch lost meanwhile may have been of before the send.
	if !following(j.Streams, j.Miss.Sent) {
		unclassified(UnclassifiedNoStream)
		return
	}
	m := j.Miss
	m.Tokens = tokens
	tally, err := Classify(j.Streams, m)
	if err != nil {
		unclassified(UnclassifiedBlockSize)
		return
	}
	j.tell(func() {
		for _, c := range Classes {
			if n := tally[c]; n > 0 {
				e.sink.MissedHitTokens(j.Workload, j.Target, c, n)
			}
		}
	})
}

// following tells whether every stream has seen every batch since t.
// caughtUp waits until every stream has taken the batches its engine
// published by t (Stream.caughtUp: or none came for catchUpQuiet), at
// most catchUpMax, polling every catchUpPoll; false when ctx ended.
func (e *Explainer) caughtUp(ctx context.Context, streams []*Stream, t time.Time) bool {
	deadline := e.now().Add(catchUpMax)
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		now := e.now()
		behind := false
		for _, s := range streams {
			behind = behind || !s.caughtUp(t, now, catchUpQuiet)
		}
		if !behind || !now.Before(deadline) {
			return ctx.Err() == nil
		}
		if tick == nil {
			tick = time.NewTicker(catchUpPoll)
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

func following(streams []*Stream, t time.Time) bool {
	for _, s := range streams {
		if !s.Following(t) {
			return false
		}
	}
	return true
}

// Target follows the event streams of one target's engines, one
// goroutine each, until Stop; the classifications of its requests report
// until Stop too.
type Target struct {
	Streams []*Stream
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	// A classification reports under reporting's read lock, unless
	// stopped; Stop sets stopped under its write lock, so that no report
	// comes after it (and a target's series, once deleted, stay so).
	reporting sync.RWMutex
	stopped   bool
}

// StartTarget follows a stream at each endpoint, each holding at most
// maxBlocks blocks (0: DefaultMaxBlocks), reporting to r, until ctx ends
// or Stop. replays are the engines' replay sockets, in the order of
// endpoints ("" or none past its end for an engine without one).
func StartTarget(ctx context.Context, endpoints, replays []string, maxBlocks int, r Reporter) *Target {
	ctx, cancel := context.WithCancel(ctx)
	t := &Target{ctx: ctx, cancel: cancel}
	for i, ep := range endpoints {
		s := NewStream(ep)
		if i < len(replays) {
			s.Replay = replays[i]
		}
		if maxBlocks > 0 {
			s.maxAlive, s.maxHashIDs = maxBlocks, maxBlocks
		}
		t.Streams = append(t.Streams, s)
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			Follow(ctx, s, r)
		}()
	}
	return t
}

// WaitTried waits until every stream's first connection attempt has
// ended, or ctx has.
func (t *Target) WaitTried(ctx context.Context) {
	for _, s := range t.Streams {
		select {
		case <-s.Tried():
		case <-ctx.Done():
			return
		}
	}
}

// Stop ends the streams' goroutines and the classifications of the
// target's requests, and returns once they have: nothing is reported of
// the target after it.
func (t *Target) Stop() {
	t.cancel()
	t.wg.Wait()
	t.reporting.Lock()
	t.stopped = true
	t.reporting.Unlock()
}

// Report runs tell, a report of one of the target's requests, unless the
// target has stopped: what is told outside the explainer (a request it
// cannot classify) goes through here too.
func (t *Target) Report(tell func()) {
	t.reporting.RLock()
	defer t.reporting.RUnlock()
	if !t.stopped {
		tell()
	}
}
