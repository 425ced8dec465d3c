package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// wlTestClock is the kit's fake clock as a DispatchClock: time moves only
// through Advance, or, in jump mode, whenever a timer is armed.
type wlTestClock struct{ *testutil.Clock }

func newWLTestClock(jump bool) wlTestClock {
	if jump {
		return wlTestClock{testutil.NewJumpingClock()}
	}
	return wlTestClock{testutil.NewClock()}
}

// NewTimer returns a stopped timer.
func (c wlTestClock) NewTimer() DispatchTimer { return c.Clock.NewTimer() }

// wlTestBuilder encodes the row index and namespace into the prompt, and
// fails for the rows in fail.
type wlTestBuilder struct {
	rows int
	fail map[int]bool
}

func newWLTestBuilder(recs []trace.Record) *wlTestBuilder {
	return &wlTestBuilder{rows: len(recs), fail: map[int]bool{}}
}

func (b *wlTestBuilder) Build(rec *trace.Record, i int, ns uint64) (openai.Request, error) {
	if i < 0 || i >= b.rows {
		return openai.Request{}, errors.New("row is not one of the pacer's")
	}
	if b.fail[i] {
		return openai.Request{}, fmt.Errorf("row %d: inconsistent input_length", i)
	}
	return openai.Request{Prompt: fmt.Sprintf("%d/%d", i, ns), MaxTokens: rec.OSL()}, nil
}

func wlTestRow(req openai.Request) (row int, ns uint64) {
	a, b, _ := strings.Cut(req.Prompt, "/")
	r, _ := strconv.Atoi(a)
	n, _ := strconv.ParseUint(b, 10, 64)
	return r, n
}

// wlTestSender hands each request to do.
type wlTestSender struct {
	do func(ctx context.Context, req openai.Request, res *Result)
}

func (s *wlTestSender) Do(ctx context.Context, req openai.Request, res *Result) { s.do(ctx, req, res) }

// wlTestObserver records everything; waitUntil blocks on a condition over
// what it recorded.
type wlTestObserver struct {
	mu       sync.Mutex
	changed  *sync.Cond
	sent     int
	finished []*Result
	dropped  []wlTestDrop
	passes   []int
	onPass   func(pass int)
}

type wlTestDrop struct {
	reason    DropReason
	scheduled time.Time
}

func newWLTestObserver() *wlTestObserver {
	o := &wlTestObserver{}
	o.changed = sync.NewCond(&o.mu)
	return o
}

func (o *wlTestObserver) Sent(_, _ string, scheduled, sent time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sent++
	o.changed.Broadcast()
}

func (o *wlTestObserver) Finished(r *Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finished = append(o.finished, r)
	o.changed.Broadcast()
}

func (o *wlTestObserver) Dropped(_, _ string, reason DropReason, scheduled time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropped = append(o.dropped, wlTestDrop{reason, scheduled})
	o.changed.Broadcast()
}

func (o *wlTestObserver) PassCompleted(_, _ string, pass int) {
	o.mu.Lock()
	o.passes = append(o.passes, pass)
	o.changed.Broadcast()
	f := o.onPass
	o.mu.Unlock()
	if f != nil {
		f(pass)
	}
}

func (o *wlTestObserver) waitUntil(cond func(o *wlTestObserver) bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for !cond(o) {
		o.changed.Wait()
	}
}

// finishedRow reports whether a result for hash id row has been recorded.
func (o *wlTestObserver) finishedRow(row int64) func(*wlTestObserver) bool {
	return func(o *wlTestObserver) bool {
		return slices.ContainsFunc(o.finished, func(r *Result) bool { return r.TraceHashIDs[0] == row })
	}
}

// wlTestRun starts w.Run and returns a channel with its result.
func wlTestRun(ctx context.Context, w *Workload) <-chan error {
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return done
}

// wlTestReadSlice reads the first n rows of the conversation trace.
func wlTestReadSlice(t testing.TB, n int) []trace.Record {
	t.Helper()
	recs, err := trace.ReadFile("../testdata/mooncake/conversation_trace.jsonl", trace.ReadOptions{BlockSize: 512})
	if err != nil {
		t.Fatalf("the Mooncake traces are missing from testdata/mooncake: %v", err)
	}
	if len(recs) < n {
		t.Fatalf("trace has %d rows, want at least %d", len(recs), n)
	}
	return recs[:n:n]
}

// wlTestSessionGuard is a Sender that checks session rules: turns of a
// conversation go in order, never while the previous turn is running, and
// a turn with a delay not before the previous one finished plus the delay.
type wlTestSessionGuard struct {
	t      *testing.T
	clock  DispatchClock
	recs   []trace.Record
	sessOf func(row int) (conv, turn int)

	mu    sync.Mutex
	state map[[2]uint64]*wlTestSessionState // (namespace, conv)
	sends map[[2]uint64]int                 // (namespace, row) → times sent
}

type wlTestSessionState struct {
	done    int // turns finished
	running bool
	end     time.Time
}

func (g *wlTestSessionGuard) Do(ctx context.Context, req openai.Request, res *Result) {
	row, ns := wlTestRow(req)
	conv, turn := g.sessOf(row)
	key := [2]uint64{ns, uint64(conv)}
	g.mu.Lock()
	g.sends[[2]uint64{ns, uint64(row)}]++
	st := g.state[key]
	if st == nil {
		st = &wlTestSessionState{}
		g.state[key] = st
	}
	switch {
	case st.running:
		g.t.Errorf("row %d (conversation %d, turn %d) started while turn %d was running", row, conv, turn, st.done)
	case st.done != turn:
		g.t.Errorf("row %d is turn %d of conversation %d, but %d turns finished before it", row, turn, conv, st.done)
	case turn > 0 && g.recs[row].Delay != nil && g.recs[row].Timestamp == nil:
		if earliest := st.end.Add(time.Duration(*g.recs[row].Delay * 1e6)); res.Scheduled.Before(earliest) {
			g.t.Errorf("row %d scheduled at %v, before previous turn end + delay %v", row, res.Scheduled, earliest)
		}
	}
	st.running = true
	g.mu.Unlock()

	runtime.Gosched() // give a wrongly released next turn a chance to overlap

	g.mu.Lock()
	st.running = false
	st.done++
	st.end = g.clock.Now()
	g.mu.Unlock()
	res.Outcome = openai.OutcomeSuccess
	res.OutputTokens = 1
}

// TestWorkloadTraceSlice replays 2,000 rows of the conversation trace at 50×
// on a jumping fake clock, with synthetic sessions of three turns: the
// second turn keeps its timestamp, the third has none and waits 500 ms (or,
// in every other session, follows at once).
func TestWorkloadTraceSlice(t *testing.T) {
	const rows = 2000
	recs := wlTestReadSlice(t, rows)
	for i := range recs {
		recs[i].SessionID = trace.Ptr(fmt.Sprintf("s%d", i/3))
		if i%3 == 2 {
			recs[i].Timestamp = nil
			if (i/3)%2 == 0 {
				recs[i].Delay = trace.Ptr(500.0)
			}
		}
	}
	sessOf := func(row int) (int, int) { return row / 3, row % 3 }

	for _, count := range []int{1, 2} {
		t.Run(fmt.Sprintf("shards=%d", count), func(t *testing.T) {
			clock := newWLTestClock(true)
			guard := &wlTestSessionGuard{
				t: t, clock: clock, recs: recs, sessOf: sessOf,
				state: map[[2]uint64]*wlTestSessionState{}, sends: map[[2]uint64]int{},
			}
			drops := 0
			for index := range count {
				p, err := NewPacer(recs, PacerOptions{SpeedupRatio: 50, Loop: LoopOnce, Shard: Shard{index, count}})
				if err != nil {
					t.Fatal(err)
				}
				obs := newWLTestObserver()
				// The jumping clock lets the dispatcher run ahead of the
				// request goroutines: room for all rows means no drops.
				w, err := NewWorkload(WorkloadConfig{Name: "slice", Target: "fake", MaxInFlight: rows, Clock: clock},
					p, guard, newWLTestBuilder(recs), obs)
				if err != nil {
					t.Fatal(err)
				}
				if err := w.Run(t.Context()); err != nil {
					t.Fatalf("shard %d: Run = %v", index, err)
				}
				drops += len(obs.dropped)
				if obs.sent+len(obs.dropped) != p.PassRows(0) {
					t.Errorf("shard %d: %d sent + %d dropped, want %d rows", index, obs.sent, len(obs.dropped), p.PassRows(0))
				}
				if !slices.Equal(obs.passes, []int{0}) {
					t.Errorf("shard %d: passes completed %v, want [0]", index, obs.passes)
				}
				for _, r := range obs.finished {
					if r.ScheduleLag() < 0 {
						t.Errorf("negative schedule lag %v", r.ScheduleLag())
					}
				}
				if got, want := w.Position(), (TracePosition{Pass: 1}); got != want {
					t.Errorf("shard %d: Position() = %+v after the pass, want %+v", index, got, want)
				}
			}
			if drops != 0 {
				t.Errorf("%d rows dropped with room for all", drops)
			}
			for i := range rows {
				if n := guard.sends[[2]uint64{0, uint64(i)}]; n != 1 {
					t.Errorf("row %d sent %d times over %d shards, want 1", i, n, count)
				}
			}
		})
	}
}

// TestWorkloadSaturation drives four rows 10 ms apart through a single slot
// while the server holds each request until the test releases it.
func TestWorkloadSaturation(t *testing.T) {
	for _, tc := range []struct {
		policy    SaturationPolicy
		wantRows  []int64         // rows sent, in order
		wantLags  []time.Duration // their schedule lags
		wantDrops []time.Duration // scheduled offsets of dropped rows
	}{
		{SaturationDrop, []int64{0, 3}, []time.Duration{0, 0}, []time.Duration{10 * pacerTestTick, 20 * pacerTestTick}},
		{SaturationQueue, []int64{0, 1, 2, 3}, []time.Duration{0, 10 * pacerTestTick, 0, 0}, nil},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			recs := pacerTestTimestamps(0, 10, 20, 30)
			clock := newWLTestClock(false)
			t0 := clock.Now()
			release := make([]chan struct{}, len(recs))
			for i := range release {
				release[i] = make(chan struct{})
			}
			send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) {
				row, _ := wlTestRow(req)
				<-release[row]
				res.Outcome = openai.OutcomeSuccess
			}}
			obs := newWLTestObserver()
			p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
			if err != nil {
				t.Fatal(err)
			}
			w, err := NewWorkload(WorkloadConfig{Name: "sat", Target: "fake", MaxInFlight: 1, OnSaturation: tc.policy, Clock: clock},
				p, send, newWLTestBuilder(recs), obs)
			if err != nil {
				t.Fatal(err)
			}
			done := wlTestRun(t.Context(), w)
			drop := tc.policy == SaturationDrop

			obs.waitUntil(func(o *wlTestObserver) bool { return o.sent == 1 })
			clock.Advance(10 * pacerTestTick)
			if drop {
				obs.waitUntil(func(o *wlTestObserver) bool { return len(o.dropped) == 1 })
			}
			clock.Advance(10 * pacerTestTick) // now 20 ms
			if drop {
				obs.waitUntil(func(o *wlTestObserver) bool { return len(o.dropped) == 2 })
			}
			for row := range 3 {
				close(release[row])
				if slices.Contains(tc.wantRows, int64(row)) {
					obs.waitUntil(obs.finishedRow(int64(row)))
				}
			}
			clock.Advance(10 * pacerTestTick) // now 30 ms: row 3 is due
			obs.waitUntil(func(o *wlTestObserver) bool { return o.sent == len(tc.wantRows) })
			close(release[3])
			if err := <-done; err != nil {
				t.Fatalf("Run = %v", err)
			}

			var rows []int64
			var lags []time.Duration
			for _, r := range obs.finished {
				rows = append(rows, r.TraceHashIDs[0])
				lags = append(lags, r.ScheduleLag())
			}
			if !slices.Equal(rows, tc.wantRows) || !slices.Equal(lags, tc.wantLags) {
				t.Errorf("sent rows %v with lags %v, want %v with %v", rows, lags, tc.wantRows, tc.wantLags)
			}
			var drops []time.Duration
			for _, d := range obs.dropped {
				if d.reason != DropMaxInFlight {
					t.Errorf("drop reason %q, want %q", d.reason, DropMaxInFlight)
				}
				drops = append(drops, d.scheduled.Sub(t0))
			}
			if !slices.Equal(drops, tc.wantDrops) {
				t.Errorf("dropped rows scheduled at %v, want %v", drops, tc.wantDrops)
			}
			if !slices.Equal(obs.passes, []int{0}) {
				t.Errorf("passes completed %v, want [0]", obs.passes)
			}
		})
	}
}

// TestWorkloadSessionTiming checks the three ways a later turn is placed.
func TestWorkloadSessionTiming(t *testing.T) {
	recs := pacerTestRecords(
		pacerTestRow{ts: 0, sid: "a"},
		pacerTestRow{ts: -1, sid: "a", delay: 500}, // 500 ms after turn 0 ends
		pacerTestRow{ts: 100, sid: "a"},            // its time is long past: at once
		pacerTestRow{ts: 5000, sid: "a"},           // at its own time
		pacerTestRow{ts: -1, sid: "a"},             // at once
	)
	clock := newWLTestClock(false)
	t0 := clock.Now()
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) {
		if row, _ := wlTestRow(req); row == 0 {
			clock.Advance(200 * pacerTestTick) // the server takes 200 ms
		}
		res.Outcome = openai.OutcomeSuccess
	}}
	obs := newWLTestObserver()
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(WorkloadConfig{Name: "sess", Target: "fake", MaxInFlight: 4, Clock: clock},
		p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	done := wlTestRun(t.Context(), w)
	obs.waitUntil(obs.finishedRow(0))
	clock.WaitArmed(t0.Add(700 * pacerTestTick))
	clock.Advance(500 * pacerTestTick)
	obs.waitUntil(obs.finishedRow(2))
	clock.WaitArmed(t0.Add(5000 * pacerTestTick))
	clock.Advance(4300 * pacerTestTick)
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	want := []time.Duration{0, 700 * pacerTestTick, 700 * pacerTestTick, 5000 * pacerTestTick, 5000 * pacerTestTick}
	var got []time.Duration
	for _, r := range obs.finished {
		got = append(got, r.Scheduled.Sub(t0))
	}
	if !slices.Equal(got, want) {
		t.Errorf("turns scheduled at %v, want %v", got, want)
	}
}

// TestWorkloadStopDrain stops a workload with two requests in flight: one
// finishes within the drain time, the other is canceled at its end.
func TestWorkloadStopDrain(t *testing.T) {
	recs := pacerTestTimestamps(0, 0, 10000)
	clock := newWLTestClock(false)
	finishB := make(chan struct{})
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) {
		if row, _ := wlTestRow(req); row == 1 {
			<-finishB
			res.Outcome = openai.OutcomeSuccess
			return
		}
		<-ctx.Done() // a request that would run forever
		res.Outcome = openai.OutcomeCanceled
	}}
	obs := newWLTestObserver()
	p, err := NewPacer(recs, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(WorkloadConfig{Name: "drain", Target: "fake", MaxInFlight: 8, Clock: clock},
		p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	done := wlTestRun(t.Context(), w)
	obs.waitUntil(func(o *wlTestObserver) bool { return o.sent == 2 })
	if got, want := w.Position(), (TracePosition{Pass: 0, Conv: 2}); got != want {
		t.Errorf("Position() = %+v, want %+v", got, want)
	}

	const drain = 30 * time.Second
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		w.Stop(drain)
	}()
	clock.WaitArmed(clock.Now().Add(drain))
	close(finishB)
	obs.waitUntil(obs.finishedRow(1))
	clock.Advance(drain) // past row 2's time too: it must not go out
	<-stopped
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after Stop", err)
	}
	if obs.sent != 2 {
		t.Errorf("%d requests sent, want 2 (none after Stop)", obs.sent)
	}
	outcomes := map[int64]openai.Outcome{}
	for _, r := range obs.finished {
		outcomes[r.TraceHashIDs[0]] = r.Outcome
	}
	if want := map[int64]openai.Outcome{0: openai.OutcomeCanceled, 1: openai.OutcomeSuccess}; !maps.Equal(outcomes, want) {
		t.Errorf("outcomes %v, want %v", outcomes, want)
	}
	w.Stop(drain) // again: returns at once
}

// TestWorkloadCancel cancels the run's context: in-flight requests are cut at
// once and reported canceled.
func TestWorkloadCancel(t *testing.T) {
	recs := pacerTestTimestamps(0, 0, 50)
	clock := newWLTestClock(false)
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) {
		<-ctx.Done() // leaves Outcome empty: the Workload must fill it in
	}}
	obs := newWLTestObserver()
	p, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(WorkloadConfig{Name: "cancel", Target: "fake", MaxInFlight: 8, Clock: clock},
		p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := wlTestRun(ctx, w)
	obs.waitUntil(func(o *wlTestObserver) bool { return o.sent == 2 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if len(obs.finished) != 2 {
		t.Fatalf("%d results, want 2", len(obs.finished))
	}
	for _, r := range obs.finished {
		if r.Outcome != openai.OutcomeCanceled {
			t.Errorf("row %d: outcome %q, want canceled", r.TraceHashIDs[0], r.Outcome)
		}
	}
	if err := w.Run(t.Context()); err == nil {
		t.Error("a second Run succeeded")
	}
}

// TestWorkloadLoop runs three passes of a three-row trace and checks that
// each pass sends every row once, in the namespace of its loop mode.
func TestWorkloadLoop(t *testing.T) {
	const passes = 3
	for _, tc := range []struct {
		loop LoopMode
		ns   func(pass int) uint64
	}{
		{LoopFresh, func(pass int) uint64 { return uint64(pass) }},
		{LoopRepeat, func(int) uint64 { return 0 }},
	} {
		t.Run(string(tc.loop), func(t *testing.T) {
			recs := pacerTestTimestamps(0, 10, 20) // period 30 ms
			clock := newWLTestClock(true)
			t0 := clock.Now()
			send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) { res.Outcome = openai.OutcomeSuccess }}
			obs := newWLTestObserver()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			obs.onPass = func(pass int) {
				if pass == passes-1 {
					cancel()
				}
			}
			p, err := NewPacer(recs, PacerOptions{Loop: tc.loop})
			if err != nil {
				t.Fatal(err)
			}
			// The jumping clock lets the dispatcher run ahead of the request
			// goroutines: leave room for every request of the three passes.
			w, err := NewWorkload(WorkloadConfig{Name: "loop", Target: "fake", MaxInFlight: 16, Clock: clock},
				p, send, newWLTestBuilder(recs), obs)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Run(ctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run = %v, want context.Canceled", err)
			}
			if !slices.Equal(obs.passes, []int{0, 1, 2}) {
				t.Errorf("passes completed %v, want [0 1 2]", obs.passes)
			}
			// A row's pass follows from its scheduled time: 30 ms a pass.
			seen := map[[2]int]int{}
			for _, r := range obs.finished {
				off := r.Scheduled.Sub(t0)
				pass, row := int(off/(30*pacerTestTick)), int(off%(30*pacerTestTick)/(10*pacerTestTick))
				if int64(row) != r.TraceHashIDs[0] {
					t.Errorf("row %d scheduled at %v", r.TraceHashIDs[0], off)
				}
				if want := tc.ns(pass); r.TraceNamespace != want {
					t.Errorf("pass %d row %d: namespace %d, want %d", pass, row, r.TraceNamespace, want)
				}
				seen[[2]int{pass, row}]++
			}
			for pass := range passes {
				for row := range len(recs) {
					if n := seen[[2]int{pass, row}]; n != 1 {
						t.Errorf("pass %d row %d sent %d times, want 1", pass, row, n)
					}
				}
			}
		})
	}
}

// TestWorkloadBuildError: a row whose request cannot be built is counted as
// dropped with DropBuildError and the run goes on; loop once then ends.
func TestWorkloadBuildError(t *testing.T) {
	recs := pacerTestTimestamps(0, 10, 20)
	clock := newWLTestClock(true)
	t0 := clock.Now()
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) { res.Outcome = openai.OutcomeSuccess }}
	obs := newWLTestObserver()
	build := newWLTestBuilder(recs)
	build.fail[1] = true
	var mu sync.Mutex
	var buildErrs []error
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(WorkloadConfig{
		Name: "build", Target: "fake", MaxInFlight: 8, Clock: clock,
		OnBuildError: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			buildErrs = append(buildErrs, err)
		},
	}, p, send, build, obs)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if want := []wlTestDrop{{DropBuildError, t0.Add(10 * pacerTestTick)}}; !slices.Equal(obs.dropped, want) {
		t.Errorf("dropped %v, want %v", obs.dropped, want)
	}
	if obs.sent != 2 || len(obs.finished) != 2 {
		t.Errorf("%d sent, %d finished, want 2 and 2", obs.sent, len(obs.finished))
	}
	if len(buildErrs) != 1 || !strings.Contains(buildErrs[0].Error(), "trace line 2: row 1: inconsistent input_length") {
		t.Errorf("build errors %v, want one naming trace line 2", buildErrs)
	}
	if !slices.Equal(obs.passes, []int{0}) {
		t.Errorf("passes completed %v, want [0]", obs.passes)
	}
}

func TestNewWorkloadErrors(t *testing.T) {
	recs := pacerTestTimestamps(0)
	p, err := NewPacer(recs, PacerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	send := &wlTestSender{}
	build := newWLTestBuilder(recs)
	obs := newWLTestObserver()
	for _, tc := range []struct {
		name string
		cfg  WorkloadConfig
		p    *Pacer
		want string
	}{
		{"max in flight", WorkloadConfig{Name: "w"}, p, "max_in_flight must be at least 1"},
		{"saturation", WorkloadConfig{Name: "w", MaxInFlight: 1, OnSaturation: "block"}, p, `unknown on_saturation "block"`},
		{"no pacer", WorkloadConfig{Name: "w", MaxInFlight: 1}, nil, "needs a pacer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewWorkload(tc.cfg, tc.p, send, build, obs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestWorkloadStopBeforeRun: Stop on a Workload that never ran returns at
// once, and a later Run returns without sending anything.
func TestWorkloadStopBeforeRun(t *testing.T) {
	recs := pacerTestTimestamps(0)
	p, err := NewPacer(recs, PacerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obs := newWLTestObserver()
	w, err := NewWorkload(WorkloadConfig{Name: "w", MaxInFlight: 1, Clock: newWLTestClock(false)},
		p, &wlTestSender{}, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	w.Stop(time.Second)
	if err := w.Run(t.Context()); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if obs.sent != 0 {
		t.Errorf("%d sent after Stop", obs.sent)
	}
}

// wlTestSSEServer answers every request with an SSE stream of 32 one-token
// chunks, a usage chunk and [DONE]. The stream is written in one go: the
// benchmark measures the dispatcher, and flushing every chunk would spend the
// two cores on write syscalls instead.
func wlTestSSEServer() *httptest.Server {
	const chunk = `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n"
	const tail = `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}],` +
		`"usage":{"prompt_tokens":8,"completion_tokens":32,"total_tokens":40}}` + "\n\ndata: [DONE]\n\n"
	body := strings.Repeat(chunk, 32) + tail
	return httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(rw, body)
	}))
}

// wlTestLagObserver keeps the schedule lag of every finished request.
type wlTestLagObserver struct {
	mu      sync.Mutex
	lags    []time.Duration
	dropped int
	failed  int
}

func (o *wlTestLagObserver) Sent(_, _ string, _, _ time.Time) {}
func (o *wlTestLagObserver) Finished(r *Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lags = append(o.lags, r.ScheduleLag())
	if r.Outcome != openai.OutcomeSuccess {
		o.failed++
	}
}
func (o *wlTestLagObserver) Dropped(_, _ string, _ DropReason, _ time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropped++
}
func (o *wlTestLagObserver) PassCompleted(_, _ string, _ int) {}

type wlTestPromptBuilder struct{}

func (wlTestPromptBuilder) Build(rec *trace.Record, _ int, _ uint64) (openai.Request, error) {
	return openai.Request{Prompt: "hello", MaxTokens: rec.OSL()}, nil
}

// BenchmarkDispatchLag replays two seconds of evenly spaced requests per
// iteration, on the real clock, through the OpenAI client against a local SSE
// server, and reports the schedule lag (Sent − Scheduled) percentiles.
func BenchmarkDispatchLag(b *testing.B) {
	for _, rate := range []int{200, 1000, 5000} {
		b.Run(fmt.Sprintf("rps=%d", rate), func(b *testing.B) {
			srv := wlTestSSEServer()
			defer srv.Close()
			client, err := openai.New(openai.TargetConfig{Name: "bench", URL: srv.URL, Model: "m"})
			if err != nil {
				b.Fatal(err)
			}
			defer client.Close()

			n := 2 * rate
			recs := make([]trace.Record, n)
			for i := range recs {
				recs[i] = trace.Record{
					Timestamp:    trace.Ptr(float64(i) * 1000 / float64(rate)),
					InputLength:  trace.Ptr(8),
					OutputLength: trace.Ptr(32),
					Line:         i + 1,
				}
			}
			obs := &wlTestLagObserver{}
			b.ResetTimer()
			for range b.N {
				p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
				if err != nil {
					b.Fatal(err)
				}
				w, err := NewWorkload(WorkloadConfig{Name: "bench", Target: "bench", MaxInFlight: 1024},
					p, SendWith(client), wlTestPromptBuilder{}, obs)
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Run(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			slices.Sort(obs.lags)
			pct := func(q float64) float64 {
				if len(obs.lags) == 0 {
					return 0
				}
				return float64(obs.lags[int(q*float64(len(obs.lags)-1))]) / float64(time.Microsecond)
			}
			b.ReportMetric(pct(0.50), "p50-lag-µs")
			b.ReportMetric(pct(0.99), "p99-lag-µs")
			b.ReportMetric(pct(1), "max-lag-µs")
			b.ReportMetric(float64(obs.dropped), "dropped")
			b.ReportMetric(float64(obs.failed), "failed")
		})
	}
}

// TestWorkloadStopWhileQueued: a row waiting for a slot when the run stops
// is dropped with DropShutdown; with no drain time the request in flight is
// canceled at once.
func TestWorkloadStopWhileQueued(t *testing.T) {
	recs := pacerTestTimestamps(0, 0)
	clock := newWLTestClock(false)
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) {
		<-ctx.Done()
		res.Outcome = openai.OutcomeCanceled
	}}
	obs := newWLTestObserver()
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(WorkloadConfig{Name: "q", Target: "fake", MaxInFlight: 1, OnSaturation: SaturationQueue, Clock: clock},
		p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	done := wlTestRun(t.Context(), w)
	obs.waitUntil(func(o *wlTestObserver) bool { return o.sent == 1 })
	w.Stop(0)
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if want := []wlTestDrop{{DropShutdown, clock.Now()}}; !slices.Equal(obs.dropped, want) {
		t.Errorf("dropped %v, want %v", obs.dropped, want)
	}
	if len(obs.finished) != 1 || obs.finished[0].Outcome != openai.OutcomeCanceled {
		t.Errorf("finished %v, want one canceled request", obs.finished)
	}
	if len(obs.passes) != 0 {
		t.Errorf("passes completed %v, want none", obs.passes)
	}
}

// TestWorkloadQueueLagBounded: under on_saturation queue, a row still
// waiting for a slot MaxQueueLag behind its schedule is dropped as
// max_lag, so the lag of what is sent never exceeds the bound, however long
// the server holds its slot.
func TestWorkloadQueueLagBounded(t *testing.T) {
	ts := make([]float64, 30)
	for i := range ts {
		ts[i] = float64(i) * 1000 // a row a second
	}
	recs := pacerTestTimestamps(ts...)
	clock := newWLTestClock(true)
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) {
		<-ctx.Done() // holds the only slot until the run ends
		res.Outcome = openai.OutcomeCanceled
	}}
	obs := newWLTestObserver()
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
	if err != nil {
		t.Fatal(err)
	}
	const bound = 5 * time.Second
	w, err := NewWorkload(WorkloadConfig{Name: "q", Target: "fake", MaxInFlight: 1, OnSaturation: SaturationQueue,
		MaxQueueLag: bound, Clock: clock}, p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	done := wlTestRun(t.Context(), w)
	obs.waitUntil(func(o *wlTestObserver) bool { return len(o.dropped) == len(recs)-1 })
	w.Stop(0)
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if obs.sent != 1 {
		t.Errorf("%d requests sent, want the one holding the slot", obs.sent)
	}
	for _, d := range obs.dropped {
		if d.reason != DropMaxLag {
			t.Errorf("dropped %v, want every waiting row dropped as %s", d, DropMaxLag)
		}
	}
	if late := clock.Now().Sub(obs.dropped[len(obs.dropped)-1].scheduled); late > bound {
		t.Errorf("the last row was given up %v after its time, more than the bound %v", late, bound)
	}
}

// Every goroutine the package starts must have ended when its tests end:
// a dispatcher or request left behind would keep a connection open.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// BenchmarkDispatchClock replays two seconds of evenly spaced 32-token
// requests per iteration against a local SSE server, as
// BenchmarkDispatchLag does, once on the runtime's timers and once on
// preciseTimer (SystemClock), and reports the schedule lag percentiles and
// the process's CPU per request: the accuracy preciseTimer buys and what
// it costs.
func BenchmarkDispatchClock(b *testing.B) {
	for _, rate := range []int{1000, 5000} {
		for _, clk := range []struct {
			name  string
			clock DispatchClock
		}{{"runtime", runtimeDispatchClock{}}, {"precise", SystemClock()}} {
			b.Run(fmt.Sprintf("rps=%d/clock=%s", rate, clk.name), func(b *testing.B) {
				benchDispatch(b, rate, clk.clock)
			})
		}
	}
}

func benchDispatch(b *testing.B, rate int, clock DispatchClock) {
	srv := wlTestSSEServer()
	defer srv.Close()
	client, err := openai.New(openai.TargetConfig{Name: "bench", URL: srv.URL, Model: "m"})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	n := 2 * rate
	recs := make([]trace.Record, n)
	for i := range recs {
		recs[i] = trace.Record{
			Timestamp:    trace.Ptr(float64(i) * 1000 / float64(rate)),
			InputLength:  trace.Ptr(8),
			OutputLength: trace.Ptr(32),
			Line:         i + 1,
		}
	}
	obs := &wlTestLagObserver{}
	cpu0, cpuOK := testutil.ProcessCPUSeconds()
	b.ResetTimer()
	for range b.N {
		p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
		if err != nil {
			b.Fatal(err)
		}
		w, err := NewWorkload(WorkloadConfig{Name: "bench", Target: "bench", MaxInFlight: 1024, Clock: clock},
			p, SendWith(client), wlTestPromptBuilder{}, obs)
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Run(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu1, cpuOK1 := testutil.ProcessCPUSeconds()
	slices.Sort(obs.lags)
	pct := func(q float64) float64 {
		if len(obs.lags) == 0 {
			return 0
		}
		return float64(obs.lags[int(q*float64(len(obs.lags)-1))]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-lag-µs")
	b.ReportMetric(pct(0.99), "p99-lag-µs")
	b.ReportMetric(pct(1), "max-lag-µs")
	b.ReportMetric(float64(obs.dropped), "dropped")
	if cpuOK && cpuOK1 && len(obs.lags) > 0 {
		b.ReportMetric((cpu1-cpu0)/float64(len(obs.lags))*1e6, "cpu-µs/req")
	}
}

// goroutinesCreated is the number of goroutines the process has started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// BenchmarkWorkloadRequest runs b.N requests through a Workload, the
// OpenAI client and a local SSE server of 32-token answers, as fast as 16
// slots allow, and reports the process's heap allocations and goroutines
// started per request (client and server), figures the machine's load
// does not change, and its CPU time per request.
func BenchmarkWorkloadRequest(b *testing.B) {
	srv := wlTestSSEServer()
	defer srv.Close()
	client, err := openai.New(openai.TargetConfig{Name: "bench", URL: srv.URL, Model: "m"})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	recs := pacerTestTimestamps(make([]float64, b.N)...)
	for i := range recs {
		recs[i].OutputLength = trace.Ptr(32)
	}
	obs := &wlTestLagObserver{}
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
	if err != nil {
		b.Fatal(err)
	}
	w, err := NewWorkload(WorkloadConfig{Name: "bench", Target: "bench", MaxInFlight: 16, OnSaturation: SaturationQueue, MaxQueueLag: time.Hour, Clock: newWLTestClock(false)},
		p, SendWith(client), wlTestPromptBuilder{}, obs)
	if err != nil {
		b.Fatal(err)
	}
	g0 := goroutinesCreated()
	cpu0, cpuOK := testutil.ProcessCPUSeconds()
	b.ReportAllocs()
	b.ResetTimer()
	if err := w.Run(b.Context()); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	created := goroutinesCreated() - g0
	if cpu1, ok := testutil.ProcessCPUSeconds(); cpuOK && ok {
		b.ReportMetric((cpu1-cpu0)/float64(b.N)*1e6, "cpu-µs/op")
	}
	if obs.failed > 0 || obs.dropped > 0 {
		b.Fatalf("%d failed, %d dropped", obs.failed, obs.dropped)
	}
	b.ReportMetric(float64(created)/float64(b.N), "goroutines/op")
}

// wlTestTimedBuilder records the clock's time at each row's build.
type wlTestTimedBuilder struct {
	*wlTestBuilder
	clock wlTestClock
	mu    sync.Mutex
	at    map[int]time.Time
}

func (b *wlTestTimedBuilder) Build(rec *trace.Record, i int, ns uint64) (openai.Request, error) {
	b.mu.Lock()
	b.at[i] = b.clock.Now()
	b.mu.Unlock()
	return b.wlTestBuilder.Build(rec, i, ns)
}

// wlTestRunOnce replays recs once through send and build, with room for
// every row, and returns what the observer saw.
func wlTestRunOnce(t *testing.T, recs []trace.Record, clock wlTestClock, send Sender, build RequestBuilder) *wlTestObserver {
	t.Helper()
	obs := newWLTestObserver()
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(WorkloadConfig{Name: "once", Target: "fake", MaxInFlight: len(recs), Clock: clock}, p, send, build, obs)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatalf("Run = %v", err)
	}
	return obs
}

// TestWorkloadBuildsAhead: with time to spare before a row, the dispatcher
// builds its request before it is due, so that the send starts with it
// ready; a row due at once is built by its own goroutine. Each request is
// still its own row's.
func TestWorkloadBuildsAhead(t *testing.T) {
	recs := pacerTestTimestamps(0, 10, 20, 30)
	clock := newWLTestClock(true)
	t0 := clock.Now()
	build := &wlTestTimedBuilder{wlTestBuilder: newWLTestBuilder(recs), clock: clock, at: map[int]time.Time{}}
	var mu sync.Mutex
	sentRow := map[int]int{} // the row each send's request was built for, by its scheduled row
	send := &wlTestSender{do: func(_ context.Context, req openai.Request, res *Result) {
		row, _ := wlTestRow(req)
		mu.Lock()
		sentRow[int(res.Scheduled.Sub(t0)/(10*pacerTestTick))] = row
		mu.Unlock()
		res.Outcome = openai.OutcomeSuccess
	}}
	obs := wlTestRunOnce(t, recs, clock, send, build)
	for i := range recs {
		due := t0.Add(time.Duration(i) * 10 * pacerTestTick)
		at, ok := build.at[i]
		switch {
		case !ok:
			t.Errorf("row %d was never built", i)
		case i == 0 && at.Before(due):
			t.Errorf("row 0 built at %v, before its send time: nothing was to be done ahead of it", at.Sub(t0))
		case i > 0 && !at.Before(due):
			t.Errorf("row %d built at %v, not ahead of its send time %v", i, at.Sub(t0), due.Sub(t0))
		}
		if sentRow[i] != i {
			t.Errorf("the send scheduled for row %d carried row %d's request", i, sentRow[i])
		}
	}
	if obs.sent != len(recs) || len(obs.finished) != len(recs) {
		t.Errorf("%d sent, %d finished, want %d", obs.sent, len(obs.finished), len(recs))
	}
}

// wlTestLearningBuilder learns something new while it first builds row 1:
// its generation moves on.
type wlTestLearningBuilder struct {
	*wlTestTimedBuilder
	gen    atomic.Uint64
	builds [4]atomic.Int32
}

func (b *wlTestLearningBuilder) Generation() uint64 { return b.gen.Load() }

func (b *wlTestLearningBuilder) Build(rec *trace.Record, i int, ns uint64) (openai.Request, error) {
	if n := b.builds[i].Add(1); i == 1 && n == 1 {
		b.gen.Add(1)
	}
	return b.wlTestTimedBuilder.Build(rec, i, ns)
}

// TestWorkloadRebuildsStale: a request built ahead under a generation the
// builder has since left is built again when it is due.
func TestWorkloadRebuildsStale(t *testing.T) {
	recs := pacerTestTimestamps(0, 10, 20, 30)
	clock := newWLTestClock(true)
	t0 := clock.Now()
	build := &wlTestLearningBuilder{wlTestTimedBuilder: &wlTestTimedBuilder{wlTestBuilder: newWLTestBuilder(recs), clock: clock, at: map[int]time.Time{}}}
	send := &wlTestSender{do: func(_ context.Context, req openai.Request, res *Result) { res.Outcome = openai.OutcomeSuccess }}
	obs := wlTestRunOnce(t, recs, clock, send, build)
	want := [4]int32{1, 2, 1, 1}
	for i := range want {
		if got := build.builds[i].Load(); got != want[i] {
			t.Errorf("row %d built %d times, want %d", i, got, want[i])
		}
	}
	if due := t0.Add(10 * pacerTestTick); build.at[1].Before(due) {
		t.Errorf("row 1 last built at %v, before it was due at %v: the stale request was sent", build.at[1].Sub(t0), due.Sub(t0))
	}
	if obs.sent != len(recs) {
		t.Errorf("%d sent, want %d", obs.sent, len(recs))
	}
}

// wlTestArmClock is a fake clock whose timers offer the dispatcher a
// sleeper that records each Arm and declines it, so the wait goes on the
// timer's channel.
type wlTestArmClock struct {
	wlTestClock
	mu   sync.Mutex
	arms []time.Duration
}

func (c *wlTestArmClock) NewTimer() DispatchTimer {
	return wlTestArmTimer{c.wlTestClock.NewTimer(), c}
}

type wlTestArmTimer struct {
	DispatchTimer
	c *wlTestArmClock
}

func (t wlTestArmTimer) Arm(d time.Duration) bool {
	t.c.mu.Lock()
	t.c.arms = append(t.c.arms, d)
	t.c.mu.Unlock()
	return false
}
func (wlTestArmTimer) Sleep() {}
func (wlTestArmTimer) Wake()  {}

// TestWorkloadShortWaitsOnRuntimeTimers: the dispatcher offers a wait to
// its sleeper (the timerfd) when the wait is long or nothing is in flight,
// and leaves a short wait with a request in flight to the runtime's
// timers.
func TestWorkloadShortWaitsOnRuntimeTimers(t *testing.T) {
	short := shortWait / 2
	long := 40 * shortWait
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	// Row 0 is due short after the start, with nothing in flight; row 1
	// short after row 0, which is still in flight; row 2 long after row 1.
	recs := pacerTestTimestamps(0, ms(short), ms(short+long))
	clock := &wlTestArmClock{wlTestClock: newWLTestClock(true)}
	hold := make(chan struct{})
	send := &wlTestSender{do: func(_ context.Context, req openai.Request, res *Result) {
		switch row, _ := wlTestRow(req); row {
		case 0:
			<-hold // in flight until row 2 is sent
		case 2:
			close(hold)
		}
		res.Outcome = openai.OutcomeSuccess
	}}
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
	if err != nil {
		t.Fatal(err)
	}
	obs := newWLTestObserver()
	cfg := WorkloadConfig{Name: "waits", Target: "fake", MaxInFlight: len(recs), Clock: clock, Start: clock.Now().Add(short)}
	w, err := NewWorkload(cfg, p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatalf("Run = %v", err)
	}
	want := []time.Duration{short, long}
	if !slices.Equal(clock.arms, want) {
		t.Errorf("the sleeper was armed for %v, want %v: row 0's short wait with nothing in flight and row 2's long one, not row 1's short one with row 0 in flight", clock.arms, want)
	}
	if len(obs.finished) != len(recs) {
		t.Errorf("%d finished, want %d", len(obs.finished), len(recs))
	}
}
