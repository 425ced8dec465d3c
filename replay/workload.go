package replay

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// Sender sends one request and fills in res: Sent (just before writing; the
// Workload presets it), FirstToken, LastToken, Outcome and the token counts.
// It must return once ctx is done, with Outcome canceled.
type Sender interface {
	Do(ctx context.Context, req openai.Request, res *Result)
}

// SendWith is the Sender that sends through c, an OpenAI-compatible
// streaming client.
func SendWith(c *openai.Client) Sender { return clientSender{c} }

type clientSender struct{ c *openai.Client }

func (s clientSender) Do(ctx context.Context, req openai.Request, res *Result) {
	s.c.Do(ctx, req, &res.Response)
}

// RequestBuilder turns a trace row into a request; row is its index in the
// pacer's rows and ns the pass's hash-id namespace. rec is the caller's to
// drop afterwards (it is unpacked from the compact rows for this request).
// It is called from many goroutines at once.
type RequestBuilder interface {
	Build(rec *trace.Record, row int, ns uint64) (openai.Request, error)
}

// GenerationalBuilder is a RequestBuilder whose requests depend on what it
// learns as the run goes (a chat template's size): Generation changes when
// a row's request would be built differently. A request the dispatcher
// built ahead under another generation is built again when it is due.
type GenerationalBuilder interface {
	RequestBuilder
	Generation() uint64
}

// SaturationPolicy says what happens to a due row when max_in_flight requests
// are already out.
type SaturationPolicy string

const (
	// SaturationDrop skips the row and counts it as dropped (max_in_flight).
	SaturationDrop SaturationPolicy = "drop"
	// SaturationQueue holds the row until a request finishes; the wait shows
	// up as schedule lag, and the rows behind it wait too.
	SaturationQueue SaturationPolicy = "queue"
)

// SaturationPolicies lists every saturation policy.
var SaturationPolicies = [...]SaturationPolicy{SaturationDrop, SaturationQueue}

// DispatchClock is the time source of a Workload, injected so that tests can
// run a schedule without waiting for it.
type DispatchClock interface {
	Now() time.Time
	// NewTimer returns a stopped timer.
	NewTimer() DispatchTimer
}

// DispatchTimer is a reusable timer with the Go 1.23 guarantee: after Reset
// or Stop no value from an earlier arming is received.
type DispatchTimer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

// SystemClock is the real clock.
func SystemClock() DispatchClock { return systemDispatchClock{} }

type systemDispatchClock struct{}

func (systemDispatchClock) Now() time.Time { return time.Now() }

// NewTimer returns a timer whose channel is the runtime's; on Linux the
// dispatcher sleeps on it directly instead, within tens of microseconds of
// its deadline where the runtime's timers may be a millisecond late
// (precisetimer.go).
func (systemDispatchClock) NewTimer() DispatchTimer { return newPreciseTimer() }

// WorkloadConfig configures one (workload, target) runner.
type WorkloadConfig struct {
	Name   string // workload label
	Target string // target label

	MaxInFlight  int              // at least 1
	OnSaturation SaturationPolicy // "" means drop
	// MaxQueueLag bounds, under SaturationQueue, how far behind its
	// schedule a row may still be sent: one still waiting for a slot then
	// is dropped (DropMaxLag), so that the lag cannot grow without bound.
	// 0 means DefaultMaxQueueLag.
	MaxQueueLag time.Duration

	Clock DispatchClock // nil means SystemClock
	// Start is the wall time of the pacer's Due 0 (see Pacer.SeekTime); the
	// zero value means when Run starts.
	Start time.Time
	// Cache, when set, computes each request's theoretical cached tokens
	// once its response is in (off the send path), and hears of the rows
	// the server never got. SetCache replaces it while the workload runs.
	Cache *CacheModel
	// OnBuildError, when set, hears why a row was dropped with
	// DropBuildError (the error names the trace line), e.g. to log it.
	OnBuildError func(error)
	// Abandon closes the stream of a seeded share of the requests early.
	Abandon Abandonment
}

// Workload replays one trace against one target: it sends first turns when
// the Pacer says they are due and later turns when session rules allow,
// each request in its own goroutine, never more than MaxInFlight at once.
//
// Sessions follow AIPerf: turn k+1 goes only after turn k finished; then at
// its own timestamp if it has one (at once if that is already past), else
// `delay` ms after turn k finished, else at once. A generated schedule
// (Schedule) places first turns at its own arrivals instead of the trace's
// timestamps, or, as a closed loop, when a user is free (closedloop.go). A
// turn that was dropped or failed to build counts as finished when that
// happened, so the rest of its conversation still runs. A later turn's Scheduled time is the moment the
// rules let it go (never before the previous turn's end), so schedule lag
// measures the exporter, not how long the server took on the previous turn.
//
// Every due row is either sent (Observer.Sent, then Finished) or dropped
// (Observer.Dropped): DropMaxInFlight when all slots are taken under
// SaturationDrop, DropBuildError when its request cannot be built (the
// RequestBuilder runs in the request's goroutine, so a slow build delays
// only its own send), DropShutdown when the run ends while the row waits
// for a slot under SaturationQueue or was due but not yet sent when the run
// ended. Rows not yet due when the run ends are neither. A pass is reported complete (Observer.PassCompleted) once every
// row of the pass in this shard has been dispatched, sent or dropped,
// without waiting for the answers: the count follows the schedule, not the
// server.
type Workload struct {
	cfg   WorkloadConfig
	pacer *Pacer
	rows  *trace.Table
	send  Sender
	build RequestBuilder
	obs   Observer
	clock DispatchClock

	slots    chan struct{} // one token per request in flight
	wg       sync.WaitGroup
	inflight atomic.Int64
	draining atomic.Bool             // request goroutines must wake the dispatcher on exit
	wake     chan struct{}           // capacity 1: "look at finished turns / in-flight count"
	sleeper  atomic.Pointer[sleeper] // what the dispatcher sleeps on, if its timer offers one; woken with wake

	mu       sync.Mutex
	finished []finishedTurn // completed turns whose conversation goes on
	pos      TracePosition  // next first turn not yet dispatched

	// cache is the model asked now (see SetCache); once cacheClosed is
	// set, Run has ended and a model set after is closed at once.
	cache       atomic.Pointer[CacheModel]
	cacheClosed atomic.Bool

	started  atomic.Bool
	stopOnce sync.Once
	stopCh   chan struct{}
	drain    time.Duration // set before stopCh is closed
	done     chan struct{} // closed when Run returns
}

type finishedTurn struct {
	it     PacerItem
	at     time.Time
	failed bool // the request failed (openai.Outcome.IsError) or could not be built
}

// NewWorkload returns a runner that replays pacer's records through send.
// The Workload owns pacer from now on.
func NewWorkload(cfg WorkloadConfig, pacer *Pacer, send Sender, build RequestBuilder, obs Observer) (*Workload, error) {
	if pacer == nil || send == nil || build == nil || obs == nil {
		return nil, errors.New("workload needs a pacer, a sender, a request builder and an observer")
	}
	if cfg.MaxInFlight < 1 {
		return nil, fmt.Errorf("workload %s: max_in_flight must be at least 1, got %d", cfg.Name, cfg.MaxInFlight)
	}
	if u := pacer.plan.sched.Users; u > cfg.MaxInFlight {
		return nil, fmt.Errorf("workload %s: %d closed-loop users need max_in_flight %d at least, got %d", cfg.Name, u, u, cfg.MaxInFlight)
	}
	switch cfg.OnSaturation {
	case "":
		cfg.OnSaturation = SaturationDrop
	case SaturationDrop, SaturationQueue:
	default:
		return nil, fmt.Errorf("workload %s: unknown on_saturation %q (want drop or queue)", cfg.Name, cfg.OnSaturation)
	}
	if cfg.MaxQueueLag <= 0 {
		cfg.MaxQueueLag = DefaultMaxQueueLag
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock()
	}
	w := &Workload{
		cfg:    cfg,
		pacer:  pacer,
		rows:   pacer.Rows(),
		send:   send,
		build:  build,
		obs:    obs,
		clock:  cfg.Clock,
		slots:  make(chan struct{}, cfg.MaxInFlight),
		wake:   make(chan struct{}, 1),
		stopCh: make(chan struct{}),
		done:   make(chan struct{}),
		pos:    pacer.Position(),
	}
	if cfg.Cache != nil {
		w.cache.Store(cfg.Cache)
	}
	return w, nil
}

// SetCache makes m the cache model from now on, from any goroutine, while
// the workload runs: the target's cache turned out to be another size.
// Every answer from now on is asked of m, also that of a request sent
// before; the model it replaces is closed. m should start where the
// replay stands (NewCacheModel on a pacer that Seek put at Position), so
// that the rows sent before are its warm-up: hits that rest on them are
// unknown, as after a restart.
func (w *Workload) SetCache(m *CacheModel) {
	if old := w.cache.Swap(m); old != nil {
		old.Close()
	}
	if w.cacheClosed.Load() {
		m.Close() // Run ended (see Run): nothing holds up its end
	}
}

// Cache is the cache model asked now, or nil.
func (w *Workload) Cache() *CacheModel { return w.cache.Load() }

// Position is the next first turn not yet dispatched, for resuming the
// replay in a new Workload (Pacer.Seek). Safe to call at any time.
func (w *Workload) Position() TracePosition {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pos
}

func (w *Workload) setPos(p TracePosition) {
	w.mu.Lock()
	w.pos = p
	w.mu.Unlock()
}

// Stop ends dispatching at once and lets requests in flight finish for up to
// drain; those still running then are canceled (their outcome is canceled).
// It returns when Run has returned, or at once if Run never started.
// Calling it again only waits. Do not call it from an Observer method: Run
// cannot return while its dispatcher waits on the observer.
func (w *Workload) Stop(drain time.Duration) {
	w.Halt(drain)
	if w.started.Load() {
		<-w.done
	}
}

// Halt is Stop without the wait: dispatching ends at once and the drain
// begins, and Halt returns without waiting for it. A shutdown halts every
// workload this way the moment it begins, whatever else is under way.
func (w *Workload) Halt(drain time.Duration) {
	w.stopOnce.Do(func() {
		w.drain = drain
		close(w.stopCh)
		w.wakeSleeper()
	})
}

type runEndReason int

const (
	runEndFinished runEndReason = iota // nothing left to send (loop once, empty share)
	runEndStopped                      // Stop was called
	runEndCanceled                     // ctx is done
)

// Run dispatches until ctx is done, Stop is called, or there is nothing left
// to send (after the single pass of loop once, or for an empty shard). It
// returns only after every request goroutine has exited: when ctx is done,
// requests in flight are canceled at once; after Stop they get the drain
// time; when the trace simply ran out, they finish on their own. The error is
// ctx's cause when ctx ended the run, else nil. Run may be called once.
func (w *Workload) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return fmt.Errorf("workload %s/%s: Run called twice", w.cfg.Name, w.cfg.Target)
	}
	defer close(w.done)

	// Requests get their own cancel so that the drain deadline can cut
	// them without touching the caller's context.
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	timer := w.clock.NewTimer()
	defer timer.Stop()
	// Stored before the dispatcher looks at stopCh, so that Halt either
	// finds it to wake or is seen by the dispatcher's own check.
	sl, _ := timer.(sleeper)
	if sl != nil {
		w.sleeper.Store(&sl)
	}

	reason := w.dispatch(ctx, reqCtx, timer, sl)
	w.draining.Store(true)

	// Wait for the requests in flight, within the drain time once Stop
	// has been called.
	var deadline <-chan time.Time
	stop := w.stopCh
	if reason == runEndStopped {
		stop = nil
		timer.Reset(w.drain)
		deadline = timer.C()
	}
wait:
	for w.inflight.Load() > 0 {
		select {
		case <-w.wake:
			w.mu.Lock()
			w.finished = w.finished[:0] // no more turns will be sent
			w.mu.Unlock()
		case <-stop:
			stop = nil
			timer.Reset(w.drain)
			deadline = timer.C()
		case <-deadline:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	cancel()
	// No request is answered after this: a model still warming up must
	// not hold up the end of the run. A model set from now on is closed
	// by SetCache: one of the two sees the other.
	w.cacheClosed.Store(true)
	if m := w.cache.Load(); m != nil {
		m.Close()
	}
	w.wg.Wait()
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// workloadDispatcher is the state of Run's loop; only Run's goroutine touches it.
type workloadDispatcher struct {
	w        *Workload
	reqCtx   context.Context
	start    time.Time
	head     PacerItem // next first turn from the pacer, if headOK
	headOK   bool
	turns    pendingTurns // later turns whose time is known
	pending  int          // dispatched turns whose next turn (or user) waits for them
	passLeft map[int]int  // rows of a pass not yet dispatched
	users    *userPool    // a closed loop's free users; nil in an open loop
	// failStreak: the closed loop's requests that failed in a row, all
	// users together (see failurePause).
	failStreak int

	// prepared is the next row's request, built while the dispatcher had
	// time to spare before it (see prepareAhead); buildCost is what the
	// last such build took, halved each time it kept one from being made.
	prepared  *preparedRequest
	buildCost time.Duration
}

// preparedRequest is a row unpacked and its request built, by the
// dispatcher ahead of the row's send time or by the request's goroutine.
type preparedRequest struct {
	it   PacerItem
	gen  uint64  // the builder's generation before the dispatcher built it
	res  *Result // its Request set; nil when err is set
	err  error
	line int // the row's trace line, for err
}

// prepareSlack is the least spare time, beyond twice the last build's
// cost, for which the dispatcher builds the next request ahead.
const prepareSlack = 20 * time.Microsecond

func (w *Workload) dispatch(ctx, reqCtx context.Context, timer DispatchTimer, sl sleeper) runEndReason {
	if sl != nil {
		defer context.AfterFunc(ctx, sl.Wake)()
	}
	start := w.cfg.Start
	if start.IsZero() {
		start = w.clock.Now()
	}
	d := &workloadDispatcher{w: w, reqCtx: reqCtx, start: start, passLeft: map[int]int{}}
	if sched := w.pacer.plan.sched; sched.Closed() {
		d.users = newUserPool(sched.Users, start)
	}
	d.advance()
	for {
		d.absorb()
		select {
		case <-ctx.Done():
			return d.shutdown(runEndCanceled)
		case <-w.stopCh:
			return d.shutdown(runEndStopped)
		default:
		}

		at, fromHeap, have := d.earliest()
		if !have {
			if d.pending == 0 {
				return runEndFinished
			}
			select { // only finished turns can bring more work
			case <-w.wake:
			case <-ctx.Done():
				return d.shutdown(runEndCanceled)
			case <-w.stopCh:
				return d.shutdown(runEndStopped)
			}
			continue
		}

		now := w.clock.Now()
		if at.After(now) && d.prepareAhead(fromHeap, at.Sub(now)) {
			continue // building took time: look again
		}
		if at.After(now) {
			if sl != nil && d.sleepsPrecisely(at.Sub(now)) && sl.Arm(at.Sub(now)) {
				// Armed first: a wake from now on ends the sleep, and one
				// before it is seen here.
				select {
				case <-w.wake:
				case <-ctx.Done():
					return d.shutdown(runEndCanceled)
				case <-w.stopCh:
					return d.shutdown(runEndStopped)
				default:
					sl.Sleep()
				}
				continue
			}
			timer.Reset(at.Sub(now))
			select {
			case <-timer.C():
			case <-w.wake:
			case <-ctx.Done():
				return d.shutdown(runEndCanceled)
			case <-w.stopCh:
				return d.shutdown(runEndStopped)
			}
			continue
		}

		// Due: send it now, then loop straight back for anything else due.
		if r := d.launch(ctx, d.take(fromHeap), at); r >= 0 {
			return r
		}
	}
}

// shortWait is the longest wait the dispatcher leaves to the runtime's
// timers while requests are in flight. Their network activity keeps the
// runtime scheduling, and it checks its timers whenever it schedules, so
// such a wait ends on time; a timerfd would cost two system calls and a
// wake-up of its own per send. At 5,000/s (waits under 200 µs) the timerfd
// put the sink's p99 lag at 81–330 ms against 28–39 ms without it
// (docs/benchmarks.md). A longer wait, or any wait with nothing in flight,
// can find the process idle, when the runtime's timers are late by up to
// a millisecond (precisetimer.go): there the timerfd is worth its cost.
const shortWait = 250 * time.Microsecond

// sleepsPrecisely reports whether a wait of d goes on the timerfd sleeper
// rather than the runtime's timers (see shortWait).
func (d *workloadDispatcher) sleepsPrecisely(wait time.Duration) bool {
	return wait >= shortWait || d.w.inflight.Load() == 0
}

// earliest returns the send time of the next row, from the pacer or the
// later turns, and where it comes from; have is false when there is none.
// In a closed loop the pacer's next first turn goes when a user is free.
func (d *workloadDispatcher) earliest() (at time.Time, fromHeap, have bool) {
	switch {
	case !d.headOK:
	case d.users == nil:
		at, have = d.start.Add(d.head.Due), true
	default:
		at, have = d.users.next()
	}
	if len(d.turns) > 0 && (!have || !d.turns[0].at.After(at)) {
		at, fromHeap, have = d.turns[0].at, true, true
	}
	return at, fromHeap, have
}

// prepareAhead builds the request of the row earliest named, with spare
// time before it is due: its send then starts with the request ready, and
// the building (unpacking the row, the prompt) is not in its lag. It
// reports whether it built one. The request's goroutine builds instead
// when the dispatcher has no time to spare: a row already due, one due
// sooner than the last build took twice, or one already prepared.
func (d *workloadDispatcher) prepareAhead(fromHeap bool, spare time.Duration) bool {
	if d.prepared != nil {
		return false
	}
	if spare < 2*d.buildCost+prepareSlack {
		d.buildCost /= 2 // a slow build once must not stop preparing for good
		return false
	}
	it := d.head
	if fromHeap {
		it = d.turns[0].it
	}
	var gen uint64 // read before the build, so that a change during it counts
	if g, ok := d.w.build.(GenerationalBuilder); ok {
		gen = g.Generation()
	}
	t0 := time.Now()
	d.prepared = d.w.prepare(it)
	d.buildCost = time.Since(t0)
	d.prepared.gen = gen
	return true
}

// preparedFor hands over the request prepared for it, if any and still
// what the builder would make; one prepared for another row (a later turn
// came due first) is kept.
func (d *workloadDispatcher) preparedFor(it PacerItem) *preparedRequest {
	p := d.prepared
	if p == nil || p.it != it {
		return nil
	}
	d.prepared = nil
	if g, ok := d.w.build.(GenerationalBuilder); ok && g.Generation() != p.gen {
		return nil
	}
	return p
}

// take removes the row earliest named, a later turn or the pacer's next
// first turn (and in a closed loop the user that sends it).
func (d *workloadDispatcher) take(fromHeap bool) PacerItem {
	if fromHeap {
		return heap.Pop(&d.turns).(pendingTurn).it
	}
	it := d.head
	if d.users != nil {
		d.users.take()
	}
	d.advance()
	return it
}

// advance takes the next first turn from the pacer and records where the
// replay stands, for Position.
func (d *workloadDispatcher) advance() {
	d.head, d.headOK = d.w.pacer.Next()
	if d.headOK {
		d.w.setPos(TracePosition{Pass: d.head.Pass, Conv: d.head.Conv})
	} else {
		d.w.setPos(d.w.pacer.Position())
	}
}

// shutdown reports the rows that were due but not sent when the run ended
// as dropped, so that every due row is accounted for whatever the moment of
// the stop. They do not count towards their pass: a cut pass is not
// complete.
func (d *workloadDispatcher) shutdown(r runEndReason) runEndReason {
	w := d.w
	now := w.clock.Now()
	for {
		at, fromHeap, have := d.earliest()
		if !have || at.After(now) {
			return r
		}
		w.drop(d.take(fromHeap), DropShutdown, at)
	}
}

// launch sends it (scheduled at the given time) or drops it. It returns a
// stop reason when the run ended while it waited for a slot, else -1.
func (d *workloadDispatcher) launch(ctx context.Context, it PacerItem, scheduled time.Time) runEndReason {
	w := d.w
	prepared := d.preparedFor(it)
	acquired := false
	select {
	case w.slots <- struct{}{}:
		acquired = true
	default:
	}
	if !acquired && w.cfg.OnSaturation == SaturationDrop {
		w.drop(it, DropMaxInFlight, scheduled)
		d.countRow(it.Pass)
		d.follow(it, w.clock.Now())
		return -1
	}
	// Queue: wait for a slot, but not past MaxQueueLag behind schedule.
	var giveUp <-chan time.Time
	if !acquired {
		wait := w.cfg.MaxQueueLag - w.clock.Now().Sub(scheduled)
		if wait <= 0 {
			d.dropLate(it, scheduled)
			return -1
		}
		t := w.clock.NewTimer()
		t.Reset(wait)
		defer t.Stop()
		giveUp = t.C()
	}
	for !acquired {
		select {
		case w.slots <- struct{}{}:
			acquired = true
		case <-giveUp:
			d.dropLate(it, scheduled)
			return -1
		case <-w.wake:
			d.absorb()
		case <-ctx.Done():
			w.drop(it, DropShutdown, scheduled)
			return d.shutdown(runEndCanceled)
		case <-w.stopCh:
			w.drop(it, DropShutdown, scheduled)
			return d.shutdown(runEndStopped)
		}
	}

	_, _, more := w.pacer.NextTurn(it)
	notify := more || d.users != nil // a closed loop's user waits for every end
	if notify {
		d.pending++
	}
	w.inflight.Add(1)
	w.wg.Add(1)
	go w.request(d.reqCtx, it, scheduled, notify, prepared)
	d.countRow(it.Pass)
	return -1
}

// dropLate drops a row that waited for a slot past MaxQueueLag; its
// conversation goes on as after any dropped turn.
func (d *workloadDispatcher) dropLate(it PacerItem, scheduled time.Time) {
	w := d.w
	w.drop(it, DropMaxLag, scheduled)
	d.countRow(it.Pass)
	d.follow(it, w.clock.Now())
}

// countRow notes that a row of pass was dispatched and reports the pass
// once all of its rows were.
func (d *workloadDispatcher) countRow(pass int) {
	left, ok := d.passLeft[pass]
	if !ok {
		left = d.w.pacer.PassRows(pass)
	}
	left--
	if left > 0 {
		d.passLeft[pass] = left
		return
	}
	delete(d.passLeft, pass)
	d.w.obs.PassCompleted(d.w.cfg.Name, d.w.cfg.Target, pass)
}

// absorb schedules the next turns of conversations whose turn finished.
func (d *workloadDispatcher) absorb() {
	w := d.w
	w.mu.Lock()
	done := w.finished
	w.finished = nil
	w.mu.Unlock()
	for _, f := range done {
		d.pending--
		d.follow(f.it, f.at.Add(d.pauseAfter(f.failed)))
	}
}

// A closed loop's user whose request failed waits failurePause before its
// next request (on top of any delay or think time): 100 ms after the
// first failure in a row, twice as long after each further one, at most
// 5 s; a success ends the row. Its answer comes back at once from a
// target that is down or refusing (a refused connection, a 503 from a
// full queue), and without the pause one user sent about 1,500 requests
// a second at a dead port, most of a core, and made a struggling target's
// load worse. The row is the workload's, all users together: a target
// fails them all alike, and 64 users facing a dead one send 64 requests
// every 5 s.
const (
	failurePauseFirst = 100 * time.Millisecond
	failurePauseMax   = 5 * time.Second
)

// failurePause is the pause after the streak-th failure in a row.
func failurePause(streak int) time.Duration {
	if streak <= 0 {
		return 0
	}
	if streak > 16 { // past the cap long before the shift could overflow
		return failurePauseMax
	}
	return min(failurePauseFirst<<(streak-1), failurePauseMax)
}

// pauseAfter counts a finished request of a closed loop into the row of
// failures and returns its user's pause; an open loop keeps its schedule.
func (d *workloadDispatcher) pauseAfter(failed bool) time.Duration {
	if d.users == nil {
		return 0
	}
	if !failed {
		d.failStreak = 0
		return 0
	}
	d.failStreak++
	return failurePause(d.failStreak)
}

// follow queues the turn after it, which finished (or was given up) at end;
// in a closed loop, a conversation's end frees its user.
func (d *workloadDispatcher) follow(it PacerItem, end time.Time) {
	next, timed, ok := d.w.pacer.NextTurn(it)
	if !ok {
		if d.users != nil {
			d.users.free(end.Add(d.w.pacer.plan.sched.ThinkTime))
		}
		return
	}
	delay, hasDelay := d.w.pacer.plan.delayOf(next.Index)
	if !hasDelay && d.users != nil {
		delay = d.w.pacer.plan.sched.ThinkTime
	}
	at := end.Add(delay)
	if timed {
		at = d.start.Add(next.Due)
		if at.Before(end) {
			at = end // its time has passed: go at once
		}
	}
	heap.Push(&d.turns, pendingTurn{at: at, it: next})
}

// prepare unpacks the row of it, for its request only (the trace stays
// compact), and builds the request and the result it will fill.
func (w *Workload) prepare(it PacerItem) *preparedRequest {
	p := &preparedRequest{it: it}
	rec := w.rows.Record(it.Index)
	p.line = rec.Line
	req, err := w.build.Build(&rec, it.Index, it.Namespace)
	if err != nil {
		p.err = err
		return p
	}
	if w.cfg.Abandon.Picks(it.Index) {
		req.Abandon = w.cfg.Abandon.When
	}
	p.res = &Result{
		Workload:          w.cfg.Name,
		Target:            w.cfg.Target,
		TraceInputLength:  rec.ISL(),
		TraceHashIDs:      rec.HashIDs,
		TraceNamespace:    it.Namespace,
		PromptBuiltTokens: req.BuiltTokens,
		Request:           req,
	}
	return p
}

// request is the goroutine of one request; p is its request when the
// dispatcher built it ahead, else nil.
func (w *Workload) request(ctx context.Context, it PacerItem, scheduled time.Time, notify bool, p *preparedRequest) {
	defer w.wg.Done()
	if p == nil {
		p = w.prepare(it)
	}
	res := p.res
	if p.err != nil {
		w.drop(it, DropBuildError, scheduled)
		if w.cfg.OnBuildError != nil {
			w.cfg.OnBuildError(fmt.Errorf("workload %s: trace line %d: %w", w.cfg.Name, p.line, p.err))
		}
	} else {
		res.Scheduled = scheduled
		res.Sent = w.clock.Now()
		w.obs.Sent(w.cfg.Name, w.cfg.Target, scheduled, res.Sent)
		w.send.Do(ctx, res.Request, res)
		if res.Outcome == "" && ctx.Err() != nil {
			res.Outcome = openai.OutcomeCanceled
		}
	}

	// The slot and the session go on before the observer hears of the
	// result: the server is done, and observers may be slow.
	end := w.clock.Now()
	<-w.slots
	if notify {
		w.mu.Lock()
		w.finished = append(w.finished, finishedTurn{it: it, at: end, failed: res == nil || res.Outcome.IsError()})
		w.mu.Unlock()
	}
	if res != nil {
		if m := w.cache.Load(); m != nil {
			switch {
			case res.Outcome.ServerNeverGotIt(),
				res.Outcome == openai.OutcomeAbandoned && res.FirstToken.IsZero():
				// An abandoned request keeps its prompt in the engine only
				// once prefilled, which its first token shows.
				m.Reject(it)
			case res.Outcome == openai.OutcomeSuccess && res.CachedKnown:
				res.TheoreticalCachedTokens, res.TheoreticalKnown, res.TheoreticalByCapacity = m.AcceptObservedProfile(it, res.CachedTokens)
			default:
				res.TheoreticalCachedTokens, res.TheoreticalKnown, res.TheoreticalByCapacity = m.AcceptProfile(it)
			}
		}
		w.obs.Finished(res)
	}
	// Decrement before reading draining: Run sets draining before it
	// reads the count, so one of the two sides always sees the other.
	w.inflight.Add(-1)
	if notify || w.draining.Load() {
		select {
		case w.wake <- struct{}{}:
		default:
		}
		if notify {
			w.wakeSleeper()
		}
	}
}

// wakeSleeper ends the dispatcher's sleep, if it sleeps on a sleeper; the
// reason (a finished turn, Halt) is set before.
func (w *Workload) wakeSleeper() {
	if p := w.sleeper.Load(); p != nil {
		(*p).Wake()
	}
}

// drop reports a row that was never sent; the model forgets its blocks.
func (w *Workload) drop(it PacerItem, reason DropReason, scheduled time.Time) {
	if m := w.cache.Load(); m != nil {
		m.Reject(it)
	}
	w.obs.Dropped(w.cfg.Name, w.cfg.Target, reason, scheduled)
}

// pendingTurns orders pending later turns by send time.
type pendingTurns []pendingTurn

type pendingTurn struct {
	at time.Time
	it PacerItem
}

func (h pendingTurns) Len() int           { return len(h) }
func (h pendingTurns) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h pendingTurns) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pendingTurns) Push(x any)        { *h = append(*h, x.(pendingTurn)) }
func (h *pendingTurns) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
