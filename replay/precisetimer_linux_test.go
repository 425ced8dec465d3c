package replay

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/openai"
)

// These tests sleep for real. What they judge holds however late a loaded
// machine runs them: a sleep never ends before its time (a lower bound),
// and a sleep armed for an hour ends only if something woke it; a missing
// wake shows as the test's own timeout, never as a band.

// sleepOn arms p for d and sleeps; it returns how long from just before
// the arming.
func sleepOn(t *testing.T, p *preciseTimer, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if !p.Arm(d) {
		t.Fatal("Arm = false: no timerfd")
	}
	p.Sleep()
	return time.Since(start)
}

// TestSleeperEndsNotBefore: armed for d, a sleep ends no earlier than d,
// whichever of the timerfd and the read deadline ends it, and also after
// an expiry nobody read (the poller remembers the fd as ready).
func TestSleeperEndsNotBefore(t *testing.T) {
	for _, tc := range []struct {
		name  string
		d     time.Duration
		setup func(p *preciseTimer) // after the first Arm, before the measured one
	}{
		{"200µs", 200 * time.Microsecond, nil},
		{"1ms", time.Millisecond, nil},
		{"5ms", 5 * time.Millisecond, nil},
		{"after an unread expiry", 20 * time.Millisecond, func(p *preciseTimer) {
			p.Arm(100 * time.Microsecond)
			time.Sleep(2 * time.Millisecond) // the stimulus: the fd expires unread
		}},
		{"after a Stop", 5 * time.Millisecond, func(p *preciseTimer) {
			p.Arm(time.Hour)
			p.Stop() // closes the fd; the next Arm opens another
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPreciseTimer().(*preciseTimer)
			defer p.Stop()
			if tc.setup != nil {
				tc.setup(p)
			}
			if got := sleepOn(t, p, tc.d); got < tc.d {
				t.Errorf("slept %v, armed for %v", got, tc.d)
			}
		})
	}
}

// TestSleeperEachWayEnds: the timerfd alone ends a sleep (an idle
// process), and so does the read deadline alone (a busy one, which nobody
// polls).
func TestSleeperEachWayEnds(t *testing.T) {
	const d = 3 * time.Millisecond
	for _, tc := range []struct {
		name string
		only func(p *preciseTimer) error // leaves one of the two armed for d
	}{
		{"timerfd", func(p *preciseTimer) error { return p.file.SetReadDeadline(time.Time{}) }},
		{"read deadline", func(p *preciseTimer) error {
			p.Arm(time.Hour) // the fd now expires in an hour
			return p.file.SetReadDeadline(time.Now().Add(d))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPreciseTimer().(*preciseTimer)
			defer p.Stop()
			start := time.Now()
			if !p.Arm(d) {
				t.Fatal("Arm = false: no timerfd")
			}
			if err := tc.only(p); err != nil {
				t.Fatal(err)
			}
			p.Sleep()
			if got := time.Since(start); got < d {
				t.Errorf("slept %v, armed for %v", got, d)
			}
		})
	}
}

// TestSleeperWake: Wake ends a sleep armed for an hour, whether it comes
// before the sleep or during it; an Arm forgets a Wake before it.
func TestSleeperWake(t *testing.T) {
	t.Run("before the sleep", func(t *testing.T) {
		p := newPreciseTimer().(*preciseTimer)
		defer p.Stop()
		p.Arm(time.Hour)
		p.Wake()
		p.Sleep()
	})
	t.Run("from another goroutine", func(t *testing.T) {
		p := newPreciseTimer().(*preciseTimer)
		defer p.Stop()
		p.Arm(time.Hour)
		woke := make(chan struct{})
		go func() {
			defer close(woke)
			p.Wake()
		}()
		p.Sleep()
		<-woke
	})
	t.Run("arm forgets an earlier wake", func(t *testing.T) {
		p := newPreciseTimer().(*preciseTimer)
		defer p.Stop()
		p.Arm(time.Hour)
		p.Wake()
		const d = 20 * time.Millisecond
		if got := sleepOn(t, p, d); got < d {
			t.Errorf("slept %v, armed for %v after the wake: the wake was kept", got, d)
		}
	})
	t.Run("after stop", func(t *testing.T) {
		p := newPreciseTimer().(*preciseTimer)
		p.Arm(time.Hour)
		p.Stop()
		p.Wake()  // no fd: nothing to do
		p.Sleep() // no fd: returns at once
	})
}

// sleepSpyTimer is the precise timer telling when the dispatcher goes to
// sleep on it, so that a test wakes a sleep under way, not one to come.
type sleepSpyTimer struct {
	*preciseTimer
	sleeping chan<- struct{}
}

func (s sleepSpyTimer) Sleep() {
	select {
	case s.sleeping <- struct{}{}:
	default:
	}
	s.preciseTimer.Sleep()
}

type sleepSpyClock struct{ sleeping chan struct{} }

func (sleepSpyClock) Now() time.Time { return time.Now() }
func (c sleepSpyClock) NewTimer() DispatchTimer {
	return sleepSpyTimer{newPreciseTimer().(*preciseTimer), c.sleeping}
}

// TestWorkloadWakesItsSleeper: a dispatcher asleep on the system clock
// until a row an hour away wakes for what cannot wait: the next turn of a
// conversation whose turn just finished, Stop, and a canceled context.
func TestWorkloadWakesItsSleeper(t *testing.T) {
	const hour = 3600 * 1000 // ms
	for _, tc := range []struct {
		name string
		rows []pacerTestRow
		wake func(w *Workload, cancel context.CancelFunc, release chan<- struct{}, obs *wlTestObserver)
		want error
	}{
		{"a finished turn", []pacerTestRow{{ts: 0, sid: "a"}, {ts: -1, sid: "a"}, {ts: hour, sid: "b"}},
			func(w *Workload, _ context.CancelFunc, release chan<- struct{}, obs *wlTestObserver) {
				close(release) // turn 0 ends; turn 1 is due at once
				obs.waitUntil(obs.finishedRow(1))
				w.Halt(0)
			}, nil},
		{"stop", []pacerTestRow{{ts: 0}, {ts: hour}},
			func(w *Workload, _ context.CancelFunc, release chan<- struct{}, _ *wlTestObserver) {
				close(release)
				w.Halt(0)
			}, nil},
		{"canceled context", []pacerTestRow{{ts: 0}, {ts: hour}},
			func(_ *Workload, cancel context.CancelFunc, release chan<- struct{}, _ *wlTestObserver) {
				close(release)
				cancel()
			}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := pacerTestRecords(tc.rows...)
			release := make(chan struct{})
			send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) {
				if row, _ := wlTestRow(req); row == 0 {
					<-release
				}
				res.Outcome = openai.OutcomeSuccess
			}}
			obs := newWLTestObserver()
			p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
			if err != nil {
				t.Fatal(err)
			}
			clock := sleepSpyClock{make(chan struct{}, 1)}
			w, err := NewWorkload(WorkloadConfig{Name: "sleep", Target: "fake", MaxInFlight: 4, Clock: clock},
				p, send, newWLTestBuilder(recs), obs)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := wlTestRun(ctx, w)
			testutil.Wait(t, "the dispatcher asleep until the row an hour away", clock.sleeping)
			tc.wake(w, cancel, release, obs)
			if err := testutil.Wait(t, fmt.Sprintf("Run's end after %s", tc.name), done); !errors.Is(err, tc.want) {
				t.Errorf("Run = %v, want %v", err, tc.want)
			}
		})
	}
}
