package replay

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// LoopMode says what happens after a pass over the trace.
type LoopMode string

// The loop modes of the contract.
const (
	// LoopFresh replays the trace forever; every pass gets its own hash-id
	// namespace, so no pass can hit blocks cached by an earlier one.
	LoopFresh LoopMode = "fresh"
	// LoopRepeat replays the trace forever with identical prompts.
	LoopRepeat LoopMode = "repeat"
	// LoopOnce replays the trace a single time.
	LoopOnce LoopMode = "once"
)

// LoopModes lists every loop mode.
var LoopModes = [...]LoopMode{LoopFresh, LoopRepeat, LoopOnce}

// degeneratePassPeriod is the pass length of a trace whose timestamps are all
// equal (or that has a single timed row): without it a looping workload would
// start passes back to back with no time in between.
const degeneratePassPeriod = time.Second

// PacerOptions configures a Pacer.
type PacerOptions struct {
	// SpeedupRatio divides the trace's time axis: 2 replays twice as fast.
	// 0 means 1. Leave it at 1 when synthesis has already rescaled the
	// timestamps, or the speedup is applied twice.
	SpeedupRatio float64
	Loop         LoopMode // "" means LoopFresh
	Shard        Shard    // the zero value means the whole trace
	// Trace names the trace file in errors ("file:line: ...").
	Trace string
	// OnceNamespace is the hash-id namespace of the single pass of
	// LoopOnce. LoopFresh uses the pass number and LoopRepeat 0.
	OnceNamespace uint64
	// Schedule, when not the zero value, replaces the trace's timestamps
	// (NewPacer only: a Plan has its own).
	Schedule Schedule
}

// PacerItem is one row in one pass: a conversation's first turn from Next,
// or a later turn from NextTurn.
type PacerItem struct {
	Pass      int           // 0-based pass over the trace
	Index     int           // row index into the records
	Due       time.Duration // offset from the run's origin (see Pacer.Seek)
	Namespace uint64        // hash-id namespace of the pass (LoopFresh: the pass number)
	Conv      int           // conversation ordinal in schedule order (all shards)
	Turn      int           // 0 for a first turn
}

// TracePosition is where a replay stands: the next conversation not yet
// started. Conv counts conversations in schedule order over the whole trace,
// not this shard's share, so a position survives a change of shard.
type TracePosition struct {
	Pass int
	Conv int
}

// Pacer turns trace rows into due times. It is pure: it never reads a clock,
// and every Due is an offset from an origin the caller maps to wall time.
//
// Semantics follow AIPerf's fixed schedule: rows sharing a session_id are
// the turns of one conversation in file order; a row without one is a
// conversation of its own. Conversations are ordered by their first turn's
// timestamp with a stable sort, so unsorted input is fine and ties keep file
// order. The zero point is the smallest first-turn timestamp. A row's due
// time within a pass is (timestamp − zero point) / speedup.
//
// The Pacer yields only first turns; the dispatcher asks it for the next turn
// of a conversation (NextTurn) once the previous turn has finished.
//
// Pass length: the latest due time of any timed row plus the mean gap between
// timed rows, so that looping keeps the trace's average rate rather than
// firing the last row of one pass and the first of the next together. A
// trace without spread in time (one timed row, or all equal) gets a pass a
// second. Pass p starts p pass lengths after pass 0, whatever happened in
// between: a slow pass does not push the next one back.
//
// Unlike AIPerf's synthesis, which truncates ts/speedup to whole
// milliseconds, the division here is exact (to the nanosecond).
//
// A Schedule replaces the timestamps with generated arrivals (see
// Schedule): the first turns' due times and the pass length then come
// from it, and no later turn is timed.
//
// A Pacer is not safe for concurrent use. Its schedule (the Plan) is
// shared: many pacers over one trace cost their cursors only.
type Pacer struct {
	plan   *Plan
	loop   LoopMode
	shard  Shard
	onceNS uint64

	shareRows int // rows of this shard's share in one whole pass

	// cursor
	seek   TracePosition // where the run started (Seek)
	origin time.Duration // absolute offset of seek; Due values are relative to it
	pass   int
	conv   int
	done   bool
}

// Plan is the schedule of a trace that does not depend on who replays it:
// conversations in due order, each turn's successor, the pass length. It
// is immutable, built once per trace and speedup, and shared by every
// Pacer and cache model of that trace, so that one more target does not
// cost one more copy of a schedule of millions of rows.
type Plan struct {
	rows    *trace.Table
	convs   []pacerConv // schedule order
	next    []int32     // per row: the next turn's row, or -1
	zero    float64     // the smallest first-turn timestamp, ms
	speedup float64
	period  time.Duration
	sched   Schedule

	fleetOnce sync.Once
	fleet     fleetOrder // built at the first FleetSchedule
}

type pacerConv struct {
	first int32 // row of the first turn
	turns int32
	due   time.Duration
}

// NewPacer prepares the schedule of records. It fails when a conversation's
// first turn has no timestamp (AIPerf does too: it could not be placed), when
// a delay is negative, or on bad options.
func NewPacer(records []trace.Record, opts PacerOptions) (*Pacer, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	if len(records) == 0 {
		return nil, fmt.Errorf("pacer: %w", trace.ErrEmpty)
	}
	rows, err := trace.TableOf(records)
	if err != nil {
		var le *trace.LineError
		if errors.As(err, &le) {
			le.File = opts.Trace
		}
		return nil, err
	}
	plan, err := NewScheduledPlan(rows, opts.SpeedupRatio, opts.Trace, opts.Schedule)
	if err != nil {
		return nil, err
	}
	return plan.NewPacer(opts)
}

func (o PacerOptions) check() error {
	if o.SpeedupRatio != 0 && (!(o.SpeedupRatio > 0) || math.IsInf(o.SpeedupRatio, 0)) {
		return fmt.Errorf("speedup ratio must be a positive number, got %v", o.SpeedupRatio)
	}
	switch o.Loop {
	case "", LoopFresh, LoopRepeat, LoopOnce:
	default:
		return fmt.Errorf("unknown loop mode %q (want fresh, repeat or once)", o.Loop)
	}
	return o.Shard.orWhole().Validate()
}

// NewPlan prepares the schedule of rows, with the time axis divided by
// speedup (0 means 1); file names the trace in errors. It fails as NewPacer
// does on rows that cannot be scheduled.
func NewPlan(rows *trace.Table, speedup float64, file string) (*Plan, error) {
	return NewScheduledPlan(rows, speedup, file, Schedule{})
}

// NewScheduledPlan is NewPlan with a schedule that replaces the trace's
// timestamps, unless it is the zero value. Rows need no timestamps then,
// and speedup changes nothing.
func NewScheduledPlan(rows *trace.Table, speedup float64, file string, sched Schedule) (*Plan, error) {
	if err := sched.Validate(); err != nil {
		return nil, fmt.Errorf("pacer: %w", err)
	}
	if speedup == 0 {
		speedup = 1
	}
	if !(speedup > 0) || math.IsInf(speedup, 0) {
		return nil, fmt.Errorf("speedup ratio must be a positive number, got %v", speedup)
	}
	n := rows.Len()
	if n == 0 {
		return nil, fmt.Errorf("pacer: %w", trace.ErrEmpty)
	}
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("pacer: %d rows is more than supported", n)
	}
	p := &Plan{rows: rows, next: make([]int32, n), speedup: speedup, sched: sched}
	if err := p.linkConversations(file); err != nil {
		return nil, err
	}
	if !sched.fixed() {
		return p, p.placeArrivals()
	}
	if err := p.placeOnTimeAxis(file); err != nil {
		return nil, err
	}
	return p, nil
}

// planLineErr places err at row i of rows, by its line in file where the
// table knows it and by its 1-based index otherwise.
func planLineErr(rows *trace.Table, file string, i int, err error) error {
	line := rows.Line(i)
	if line == 0 {
		line = i + 1
	}
	return &trace.LineError{File: file, Line: line, Err: err}
}

// linkConversations groups the rows into conversations in order of first
// appearance, linking each turn to the next one in file order. Sessions are
// looked up by the table's dense session numbers, not by their strings.
func (p *Plan) linkConversations(file string) error {
	rows := p.rows
	convOf := make([]int32, rows.Sessions()) // session → index into p.convs
	last := make([]int32, rows.Sessions())   // session → its last row so far
	for s := range convOf {
		convOf[s] = -1
	}
	for i := range rows.Len() {
		p.next[i] = -1
		if d, ok := rows.Delay(i); ok && d < 0 {
			return planLineErr(rows, file, i, fmt.Errorf("delay must not be negative, got %v", d))
		}
		sid, hasSession := rows.SessionID(i)
		if hasSession {
			s := rows.SessionOrdinal(i)
			if c := convOf[s]; c >= 0 {
				p.next[last[s]] = int32(i)
				last[s] = int32(i)
				p.convs[c].turns++
				continue
			}
			convOf[s] = int32(len(p.convs))
			last[s] = int32(i)
		}
		if _, ok := rows.Timestamp(i); !ok && p.sched.fixed() {
			if hasSession {
				return planLineErr(rows, file, i, fmt.Errorf("first turn of session %q has no timestamp; a fixed schedule needs one (a workload's schedule, a rate or users, needs none)", sid))
			}
			return planLineErr(rows, file, i, errors.New("row has no timestamp; a fixed schedule needs one on every conversation's first turn (a workload's schedule, a rate or users, needs none)"))
		}
		p.convs = append(p.convs, pacerConv{first: int32(i), turns: 1})
	}
	return nil
}

// placeOnTimeAxis sets the pass's zero (the earliest first turn), each
// conversation's due time and the schedule order, and the period of a pass:
// the last due time plus the mean gap between timed rows.
func (p *Plan) placeOnTimeAxis(file string) error {
	rows := p.rows
	p.zero = math.Inf(1)
	for _, c := range p.convs {
		ts, _ := rows.Timestamp(int(c.first))
		p.zero = min(p.zero, ts)
	}
	var lastDue time.Duration
	timed := 0
	for i := range rows.Len() {
		ts, ok := rows.Timestamp(i)
		if !ok {
			continue
		}
		ms := (ts - p.zero) / p.speedup
		if math.IsNaN(ms) || math.Abs(ms) > float64(math.MaxInt64/2)/1e6 {
			return planLineErr(rows, file, i, fmt.Errorf("timestamp %v is out of range", ts))
		}
		lastDue = max(lastDue, p.rowDue(i))
		timed++
	}
	for k := range p.convs {
		p.convs[k].due = p.rowDue(int(p.convs[k].first))
	}
	slices.SortStableFunc(p.convs, func(a, b pacerConv) int { return cmp.Compare(a.due, b.due) })

	p.period = lastDue + degeneratePassPeriod
	if timed > 1 && lastDue > 0 {
		p.period = lastDue + lastDue/time.Duration(timed-1)
	}
	return nil
}

// rowDue is a timed row's due time within a pass. It is computed rather
// than stored: 8 bytes a row, for millions of rows, against a division.
func (p *Plan) rowDue(i int) time.Duration {
	ts, _ := p.rows.Timestamp(i)
	return time.Duration(math.Round((ts - p.zero) / p.speedup * 1e6))
}

// Rows returns the rows the plan schedules.
func (p *Plan) Rows() *trace.Table { return p.rows }

// Schedule is what replaces the trace's timestamps; the zero value when
// nothing does.
func (p *Plan) Schedule() Schedule { return p.sched }

// Period is the length of one pass.
func (p *Plan) Period() time.Duration { return p.period }

// NewPacer returns a cursor over the plan. opts.SpeedupRatio and
// opts.Trace are the plan's and are not looked at.
func (p *Plan) NewPacer(opts PacerOptions) (*Pacer, error) {
	opts.SpeedupRatio = 0
	if err := opts.check(); err != nil {
		return nil, err
	}
	loop := opts.Loop
	if loop == "" {
		loop = LoopFresh
	}
	shard := opts.Shard.orWhole()
	pc := &Pacer{plan: p, loop: loop, shard: shard, onceNS: opts.OnceNamespace}
	for k, c := range p.convs {
		if shard.Owns(k) {
			pc.shareRows += int(c.turns)
		}
	}
	return pc, nil
}

// Rows returns the rows the pacer schedules.
func (p *Pacer) Rows() *trace.Table { return p.plan.rows }

// Period is the length of one pass.
func (p *Pacer) Period() time.Duration { return p.plan.period }

// Conversations is the number of conversations in the whole trace.
func (p *Pacer) Conversations() int { return len(p.plan.convs) }

// Loop is the pacer's loop mode.
func (p *Pacer) Loop() LoopMode { return p.loop }

// Seek moves the cursor to pos and makes it the origin: the first turn at pos
// becomes due at offset 0 and later ones keep their spacing. Call it before
// the first Next, typically to resume a replay after a reload. Turns of
// conversations started before pos are not replayed.
func (p *Pacer) Seek(pos TracePosition) error {
	if pos.Pass < 0 || pos.Conv < 0 || pos.Conv > len(p.plan.convs) {
		return fmt.Errorf("position %+v is outside the trace (%d conversations)", pos, len(p.plan.convs))
	}
	pos = p.normalize(pos)
	p.seek = pos
	p.pass, p.conv = pos.Pass, pos.Conv
	p.origin = p.absolute(pos.Pass, p.plan.convs[pos.Conv].due)
	p.done = p.loop == LoopOnce && pos.Pass > 0
	return nil
}

// FirstRow is the row Next would start with, in its pass: the first turn of
// the conversation at Position. An empty share still names a row.
func (p *Pacer) FirstRow() (pass, row int) {
	pos := p.Position()
	return pos.Pass, int(p.plan.convs[pos.Conv].first)
}

// Position returns the next conversation Next will consider.
func (p *Pacer) Position() TracePosition { return p.normalize(TracePosition{p.pass, p.conv}) }

func (p *Pacer) normalize(pos TracePosition) TracePosition {
	if pos.Conv >= len(p.plan.convs) {
		return TracePosition{Pass: pos.Pass + 1, Conv: 0}
	}
	return pos
}

func (p *Pacer) absolute(pass int, due time.Duration) time.Duration {
	return time.Duration(pass)*p.plan.period + due
}

// Namespace is the hash-id namespace of pass: the pass number with
// LoopFresh, so that replicas and restarts numbering passes from the same
// anchor build the same prompts; 0 with LoopRepeat; OnceNamespace with
// LoopOnce.
func (p *Pacer) Namespace(pass int) uint64 {
	switch p.loop {
	case LoopFresh:
		return uint64(pass)
	case LoopOnce:
		return p.onceNS
	}
	return 0
}

// SeekTime places the cursor on the pass grid that starts at an anchor in
// wall-clock time, elapsed after it: pass p covers [p·Period, (p+1)·Period)
// from the anchor, and the cursor goes to the first conversation due at or
// after elapsed. It returns that conversation's offset from the anchor: the
// wall time of Due 0 is the anchor plus that offset. Every replica and every
// restart that uses the same anchor agrees on pass numbers and positions.
func (p *Pacer) SeekTime(elapsed time.Duration) (time.Duration, error) {
	if elapsed < 0 {
		return 0, fmt.Errorf("pacer: %v before the anchor", -elapsed)
	}
	period, convs := p.plan.period, p.plan.convs
	pass := int(elapsed / period)
	within := elapsed % period
	c := sort.Search(len(convs), func(i int) bool { return convs[i].due >= within })
	if err := p.Seek(TracePosition{Pass: pass, Conv: c}); err != nil {
		return 0, err
	}
	return p.origin, nil
}

// Next returns the next first turn of this shard's share in due order, across
// passes. It returns false when there is nothing more: after the single pass
// of LoopOnce, or at once when the share is empty.
func (p *Pacer) Next() (PacerItem, bool) {
	if p.done || p.shareRows == 0 {
		return PacerItem{}, false
	}
	for {
		c := p.shard.firstOwned(p.conv)
		if c >= len(p.plan.convs) {
			if p.loop == LoopOnce {
				p.done = true
				p.conv = len(p.plan.convs)
				return PacerItem{}, false
			}
			p.pass++
			p.conv = 0
			continue
		}
		p.conv = c + 1
		conv := p.plan.convs[c]
		return PacerItem{
			Pass:      p.pass,
			Index:     int(conv.first),
			Due:       p.absolute(p.pass, conv.due) - p.origin,
			Namespace: p.Namespace(p.pass),
			Conv:      c,
		}, true
	}
}

// NextTurn returns the turn after it in its conversation. timed tells whether
// that turn has a timestamp, in which case its Due is set as for a first
// turn; otherwise Due is zero and the turn follows its predecessor's
// completion (after its delay, if any).
func (p *Pacer) NextTurn(it PacerItem) (next PacerItem, timed, ok bool) {
	n := p.plan.next[it.Index]
	if n < 0 {
		return PacerItem{}, false, false
	}
	next = it
	next.Index = int(n)
	next.Turn++
	next.Due = 0
	if p.plan.timedTurn(int(n)) {
		next.Due = p.absolute(it.Pass, p.plan.rowDue(int(n))) - p.origin
		timed = true
	}
	return next, timed, true
}

// Delay is the think time before row i after its predecessor finished; zero
// for rows without a delay.
func (p *Pacer) Delay(i int) time.Duration {
	return p.plan.delay(i)
}

func (p *Plan) delay(i int) time.Duration {
	d, _ := p.delayOf(i)
	return d
}

// delayOf is row i's delay, and whether it has one.
func (p *Plan) delayOf(i int) (time.Duration, bool) {
	d, ok := p.rows.Delay(i)
	if !ok {
		return 0, false
	}
	return time.Duration(math.Round(d * 1e6)), true
}

// PassRows is the number of rows this shard sends in pass: its whole share,
// or what is left of it for the pass a Seek landed in.
func (p *Pacer) PassRows(pass int) int {
	if pass < p.seek.Pass || (p.loop == LoopOnce && pass > 0) {
		return 0
	}
	if pass > p.seek.Pass || p.seek.Conv == 0 {
		return p.shareRows
	}
	n := 0
	for c := p.shard.firstOwned(p.seek.Conv); c < len(p.plan.convs); c += p.shard.Count {
		n += int(p.plan.convs[c].turns)
	}
	return n
}
