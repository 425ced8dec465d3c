package replay

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// arrivalsTestDues is every first turn's due time over one pass.
func arrivalsTestDues(t *testing.T, recs []trace.Record, s Schedule) ([]time.Duration, *Pacer) {
	t.Helper()
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce, Schedule: s})
	if err != nil {
		t.Fatal(err)
	}
	var dues []time.Duration
	for it, ok := p.Next(); ok; it, ok = p.Next() {
		dues = append(dues, it.Due)
	}
	return dues, p
}

// TestScheduleRate: 2,000 rows without timestamps get arrivals at the rate
// asked, over the pass and (for a Poisson process) with exponential gaps;
// the same seed gives the same arrivals, another seed others.
// runScheduledOnce replays recs once on schedule s against a sender that
// answers at once, on a fake clock, and returns the clock's start and the
// results in the order they finished.
func runScheduledOnce(t *testing.T, recs []trace.Record, s Schedule, maxInFlight int) (time.Time, []*Result) {
	t.Helper()
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce, Schedule: s})
	if err != nil {
		t.Fatal(err)
	}
	clock := newWLTestClock(true)
	t0 := clock.Now()
	obs := newWLTestObserver()
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) { res.Outcome = openai.OutcomeSuccess }}
	w, err := NewWorkload(WorkloadConfig{Name: "scheduled", Target: "fake", MaxInFlight: maxInFlight, Clock: clock}, p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	return t0, obs.finished
}

func TestScheduleRate(t *testing.T) {
	const rows, rate = 2000, 5.0
	recs := pacerTestRecords(make([]pacerTestRow, rows)...)
	for i := range recs {
		recs[i].Timestamp = nil
	}
	mean := time.Duration(1e9 / rate)
	for _, tc := range []struct {
		arrivals     Arrivals
		cvLow, cvHi  float64 // the gaps' coefficient of variation
		medLo, medHi float64 // the share of gaps under the mean times ln 2
	}{
		{ArrivalsConstant, 0, 1e-6, 0, 0},
		{ArrivalsPoisson, 0.95, 1.05, 0.47, 0.53}, // exponential: 1, and 1/2
	} {
		t.Run(string(tc.arrivals), func(t *testing.T) {
			s := Schedule{Rate: rate, Arrivals: tc.arrivals, Seed: 1}
			dues, p := arrivalsTestDues(t, recs, s)
			if len(dues) != rows {
				t.Fatalf("%d arrivals, want %d", len(dues), rows)
			}
			if got := float64(rows) / p.Period().Seconds(); math.Abs(got-rate)/rate > 0.02 {
				t.Errorf("%d requests a pass of %v: %.4f/s, want %v/s within 2%%", rows, p.Period(), got, rate)
			}
			gaps := make([]float64, rows)
			for i := range rows {
				next := p.Period()
				if i+1 < rows {
					next = dues[i+1]
				}
				gaps[i] = float64(next - dues[i])
			}
			sum, sq, under := 0.0, 0.0, 0
			for _, g := range gaps {
				sum += g
				if g < float64(mean)*math.Ln2 {
					under++
				}
			}
			avg := sum / rows
			for _, g := range gaps {
				sq += (g - avg) * (g - avg)
			}
			cv := math.Sqrt(sq/rows) / avg
			if math.Abs(avg-float64(mean))/float64(mean) > 0.02 || cv < tc.cvLow || cv > tc.cvHi {
				t.Errorf("gaps: mean %v (want %v), coefficient of variation %.3f (want %v to %v)", time.Duration(avg), mean, cv, tc.cvLow, tc.cvHi)
			}
			if share := float64(under) / rows; tc.medHi > 0 && (share < tc.medLo || share > tc.medHi) {
				t.Errorf("%.3f of the gaps under the mean × ln 2, want %v to %v", share, tc.medLo, tc.medHi)
			}
			again, _ := arrivalsTestDues(t, recs, s)
			s.Seed = 2
			other, _ := arrivalsTestDues(t, recs, s)
			if !slices.Equal(again, dues) || (tc.arrivals == ArrivalsPoisson) == slices.Equal(other, dues) {
				t.Errorf("same seed same arrivals: %v; another seed same arrivals: %v", slices.Equal(again, dues), slices.Equal(other, dues))
			}
		})
	}
}

// TestScheduleSessions: under a rate a conversation takes an arrival per
// turn, conversations keep the trace's order (by timestamp where every
// first turn has one), and no later turn keeps its timestamp.
func TestScheduleSessions(t *testing.T) {
	s := Schedule{Rate: 10, Arrivals: ArrivalsConstant}
	tick := 100 * time.Millisecond
	for _, tc := range []struct {
		name  string
		recs  []trace.Record
		order []int // rows of the first turns, in schedule order
		due   []time.Duration
	}{
		{
			name: "timestamps order the conversations",
			recs: pacerTestRecords(
				pacerTestRow{ts: 50, sid: "a"},
				pacerTestRow{ts: 10, sid: "b"},
				pacerTestRow{ts: 60, sid: "a"},
				pacerTestRow{ts: 70, sid: "a", delay: 30},
				pacerTestRow{ts: 20},
			),
			order: []int{1, 4, 0},
			due:   []time.Duration{0, tick, 2 * tick},
		},
		{
			name: "without them, the file does",
			recs: pacerTestRecords(
				pacerTestRow{ts: 50, sid: "a"},
				pacerTestRow{ts: -1, sid: "b"},
				pacerTestRow{ts: -1, sid: "a"},
				pacerTestRow{ts: 5},
			),
			order: []int{0, 1, 3},
			due:   []time.Duration{0, 2 * tick, 3 * tick},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPacer(tc.recs, PacerOptions{Loop: LoopOnce, Schedule: s})
			if err != nil {
				t.Fatal(err)
			}
			var order []int
			var due []time.Duration
			for it, ok := p.Next(); ok; it, ok = p.Next() {
				order, due = append(order, it.Index), append(due, it.Due)
				for next, timed, more := p.NextTurn(it); more; next, timed, more = p.NextTurn(next) {
					if timed || next.Due != 0 {
						t.Errorf("row %d, a later turn, is timed (%v, due %v)", next.Index, timed, next.Due)
					}
				}
			}
			if !slices.Equal(order, tc.order) || !slices.Equal(due, tc.due) {
				t.Errorf("first turns %v due %v, want %v due %v", order, due, tc.order, tc.due)
			}
			if want := time.Duration(len(tc.recs)) * tick; p.Period() != want {
				t.Errorf("period %v, want %v: one arrival per row", p.Period(), want)
			}
			if d := p.Delay(3); len(tc.recs) > 4 && d != 30*time.Millisecond {
				t.Errorf("delay of row 3 = %v, want 30ms", d)
			}
		})
	}
}

func TestScheduleErrors(t *testing.T) {
	untimed := pacerTestRecords(pacerTestRow{ts: -1})
	for _, tc := range []struct {
		recs []trace.Record
		s    Schedule
		want string
	}{
		{untimed, Schedule{}, "a fixed schedule needs one"},
		{untimed, Schedule{Rate: MaxRate * 2}, "rate must be from"},
		{untimed, Schedule{Rate: 1, Users: 2}, "schedule rate (an open loop) and users (a closed loop) exclude each other"},
		{untimed, Schedule{Users: -1}, "users must be from 0 to 65536, got -1"},
		{untimed, Schedule{Users: MaxUsers + 1}, "users must be from 0 to 65536, got 65537"},
		{untimed, Schedule{Rate: 1, Arrivals: "bursty"}, `arrivals "bursty" is not one of poisson, constant`},
		{untimed, Schedule{Arrivals: ArrivalsConstant}, "arrivals applies only with a rate"},
		{untimed, Schedule{Users: 1, ThinkTime: -time.Second}, "think_time must not be negative"},
		{untimed, Schedule{Rate: 1, ThinkTime: time.Second}, "think_time applies only with users"},
	} {
		_, err := NewPacer(tc.recs, PacerOptions{Schedule: tc.s})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want %q", tc.s, err, tc.want)
		}
	}
	recs := pacerTestRecords(pacerTestRow{ts: -1})
	if _, err := NewPacer(recs, PacerOptions{Schedule: Schedule{Users: 4}}); err != nil {
		t.Errorf("users on a trace without timestamps: %v", err)
	}
	p, _ := NewPacer(recs, PacerOptions{Schedule: Schedule{Users: 4}})
	if _, err := NewWorkload(WorkloadConfig{Name: "w", MaxInFlight: 3}, p, &wlTestSender{}, newWLTestBuilder(recs), newWLTestObserver()); err == nil {
		t.Error("4 users with max_in_flight 3 accepted")
	}
}

// TestWorkloadRateSchedule: an open-loop rate schedules each row at its
// generated arrival and measures its lag from there.
func TestWorkloadRateSchedule(t *testing.T) {
	recs := pacerTestRecords(make([]pacerTestRow, 50)...)
	for i := range recs {
		recs[i].Timestamp = nil
	}
	s := Schedule{Rate: 20, Arrivals: ArrivalsPoisson, Seed: 3}
	dues, _ := arrivalsTestDues(t, recs, s)
	t0, finished := runScheduledOnce(t, recs, s, 50)
	var got []time.Duration
	for _, r := range finished {
		got = append(got, r.Scheduled.Sub(t0))
		if r.ScheduleLag() < 0 {
			t.Errorf("negative schedule lag %v", r.ScheduleLag())
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, dues) {
		t.Errorf("scheduled at %v, want the arrivals %v", got, dues)
	}
}

// arrivalsTestHold is a server that holds every request until the test
// releases one, and records how many were out at once.
type arrivalsTestHold struct {
	mu       sync.Mutex
	changed  *sync.Cond
	inflight int
	peak     int
	release  chan struct{}
}

func newArrivalsTestHold() *arrivalsTestHold {
	h := &arrivalsTestHold{release: make(chan struct{})}
	h.changed = sync.NewCond(&h.mu)
	return h
}

func (h *arrivalsTestHold) Do(ctx context.Context, req openai.Request, res *Result) {
	h.mu.Lock()
	h.inflight++
	h.peak = max(h.peak, h.inflight)
	h.changed.Broadcast()
	h.mu.Unlock()
	select {
	case <-h.release:
		res.Outcome = openai.OutcomeSuccess
	case <-ctx.Done():
		res.Outcome = openai.OutcomeCanceled
	}
	h.mu.Lock()
	h.inflight--
	h.changed.Broadcast()
	h.mu.Unlock()
}

// waitOut blocks until n requests (or more) are out.
func (h *arrivalsTestHold) waitOut(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.inflight < n {
		h.changed.Wait()
	}
}

// TestWorkloadClosedLoop: 3 users on 20 rows keep 3 requests out until
// the rows run out, never more, each sent the moment its user is free
// (no lag), although max_in_flight would allow 20.
func TestWorkloadClosedLoop(t *testing.T) {
	const rows, users = 20, 3
	recs := pacerTestRecords(make([]pacerTestRow, rows)...)
	for i := range recs {
		recs[i].Timestamp = nil
	}
	p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce, Schedule: Schedule{Users: users}})
	if err != nil {
		t.Fatal(err)
	}
	hold := newArrivalsTestHold()
	obs := newWLTestObserver()
	w, err := NewWorkload(WorkloadConfig{Name: "closed", Target: "fake", MaxInFlight: rows, Clock: newWLTestClock(false)},
		p, hold, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	done := wlTestRun(t.Context(), w)
	for left := rows; left > 0; left-- {
		// Once users are out, the next request waits for one to end:
		// the peak tells whether one went early.
		hold.waitOut(min(users, left))
		hold.release <- struct{}{}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if hold.peak != users || len(obs.finished) != rows || len(obs.dropped) != 0 {
		t.Errorf("peak %d in flight (want %d), %d finished (want %d), %d dropped", hold.peak, users, len(obs.finished), rows, len(obs.dropped))
	}
	for _, r := range obs.finished {
		if r.ScheduleLag() != 0 {
			t.Errorf("lag %v on a clock that never moved", r.ScheduleLag())
		}
	}
}

// TestWorkloadClosedLoopPausesAfterFailures: one user whose requests fail
// at once pauses 100 ms after the first failure in a row, twice as long
// after each further one (on top of the think time), and not after a
// success, which ends the row; a request that could not be built counts
// as failed. (An open loop never pauses: pauseAfter returns at once
// without users.)
func TestWorkloadClosedLoopPausesAfterFailures(t *testing.T) {
	const ms = time.Millisecond
	// Rows 0-4 fail (row 3 cannot be built), 5 succeeds, 6 fails, 7 succeeds.
	fails := map[int]bool{0: true, 1: true, 2: true, 4: true, 6: true}
	outcome := func(row int) openai.Outcome {
		if fails[row] {
			return openai.OutcomeConnectionError
		}
		return openai.OutcomeSuccess
	}
	recs := pacerTestRecords(make([]pacerTestRow, 8)...)
	for i := range recs {
		recs[i].Timestamp = nil
	}
	for _, tc := range []struct {
		name  string
		sched Schedule
		want  []time.Duration // each request's scheduled time; row 3 has none
	}{
		{"users", Schedule{Users: 1}, []time.Duration{0, 100 * ms, 300 * ms, 1500 * ms, 3100 * ms, 3100 * ms, 3200 * ms}},
		// 10 ms of think time after each row, the pause on top.
		{"users with think time", Schedule{Users: 1, ThinkTime: 10 * ms}, []time.Duration{0, 110 * ms, 320 * ms, 1540 * ms, 3150 * ms, 3160 * ms, 3270 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce, Schedule: tc.sched})
			if err != nil {
				t.Fatal(err)
			}
			clock := newWLTestClock(true)
			t0 := clock.Now()
			obs := newWLTestObserver()
			send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) {
				row, _ := wlTestRow(req)
				res.Outcome = outcome(row)
			}}
			build := newWLTestBuilder(recs)
			build.fail[3] = true
			w, err := NewWorkload(WorkloadConfig{Name: "failing", Target: "fake", MaxInFlight: 1, Clock: clock}, p, send, build, obs)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Run(t.Context()); err != nil {
				t.Fatal(err)
			}
			var got []time.Duration
			for _, r := range obs.finished {
				got = append(got, r.Scheduled.Sub(t0))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("scheduled at %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFailurePause(t *testing.T) {
	for _, tc := range []struct {
		streak int
		want   time.Duration
	}{
		{-1, 0}, {0, 0}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond},
		{6, 3200 * time.Millisecond}, {7, 5 * time.Second}, {17, 5 * time.Second}, {1 << 40, 5 * time.Second},
	} {
		if got := failurePause(tc.streak); got != tc.want {
			t.Errorf("failurePause(%d) = %v, want %v", tc.streak, got, tc.want)
		}
	}
}

// TestWorkloadClosedLoopThinkTime: with one user and instant answers, a
// later turn waits its delay, or the think time when it has none, and the
// next conversation waits the think time after the last turn. (One user:
// the fake clock jumps to each timer, which only a single request out at a
// time cannot race.)
func TestWorkloadClosedLoopThinkTime(t *testing.T) {
	recs := pacerTestRecords(
		pacerTestRow{ts: -1, sid: "a"},
		pacerTestRow{ts: 500, sid: "a", delay: 50}, // its timestamp is not used
		pacerTestRow{ts: -1, sid: "a"},
		pacerTestRow{ts: -1, sid: "b"},
		pacerTestRow{ts: -1},
	)
	think := 100 * pacerTestTick
	t0, finished := runScheduledOnce(t, recs, Schedule{Users: 1, ThinkTime: think}, 4)
	var got []time.Duration
	for _, r := range finished {
		got = append(got, r.Scheduled.Sub(t0))
	}
	want := []time.Duration{0, 50 * pacerTestTick, 150 * pacerTestTick, 250 * pacerTestTick, 350 * pacerTestTick}
	if !slices.Equal(got, want) {
		t.Errorf("scheduled at %v, want %v", got, want)
	}
}
