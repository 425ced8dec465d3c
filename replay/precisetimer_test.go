package replay

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// runtimeDispatchClock is the real clock on the runtime's own timers, with
// no sleeper for the dispatcher: BenchmarkDispatchClock compares it with
// SystemClock.
type runtimeDispatchClock struct{}

func (runtimeDispatchClock) Now() time.Time          { return time.Now() }
func (runtimeDispatchClock) NewTimer() DispatchTimer { return newRuntimeTimer() }

// A timer is real time: these tests arm real timers and wait on them. What
// they judge holds however late a loaded machine runs them: a firing never
// before its deadline (a lower bound), and no value where none is due,
// looked for during a window that load can only lengthen, which makes a
// stray value likelier to be seen, never a correct timer fail.

// TestPreciseTimerFiresNotBefore: armed for d, the timer's channel fires
// once, never before d, also when re-armed after a Stop.
func TestPreciseTimerFiresNotBefore(t *testing.T) {
	for _, d := range []time.Duration{0, 200 * time.Microsecond, time.Millisecond, time.Millisecond + time.Millisecond, 5 * time.Millisecond} {
		t.Run(d.String(), func(t *testing.T) {
			pt := newPreciseTimer()
			defer pt.Stop()
			pt.Reset(time.Hour)
			pt.Stop()
			start := time.Now()
			pt.Reset(d)
			at := testutil.Wait(t, fmt.Sprintf("the firing of a timer armed for %v", d), pt.C())
			if got := at.Sub(start); got < d {
				t.Errorf("fired after %v, before its %v", got, d)
			}
			select {
			case <-pt.C():
				t.Error("fired twice for one arming")
			case <-time.After(d + 5*time.Millisecond): // the window for a second value
			}
		})
	}
}

// TestPreciseTimerResetAndStopVoidEarlier: after Reset or Stop no value of
// an earlier arming arrives, whether it was far from its deadline, close to
// it, or had fired unread.
func TestPreciseTimerResetAndStopVoidEarlier(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first time.Duration // the arming to void
		wait  time.Duration // how long it runs before being voided
		stop  bool          // Stop, else Reset to 50 ms
	}{
		{"reset while far", 10 * time.Millisecond, 0, false},
		{"reset when close", 2 * time.Millisecond, 1 * time.Millisecond, false},
		{"reset after firing unread", 100 * time.Microsecond, 5 * time.Millisecond, false},
		{"stop while far", 10 * time.Millisecond, 0, true},
		{"stop when close", 2 * time.Millisecond, 1 * time.Millisecond, true},
		{"stop after firing unread", 100 * time.Microsecond, 5 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pt := newPreciseTimer()
			defer pt.Stop()
			pt.Reset(tc.first)
			// The stimulus: the arming runs this long before it is voided.
			// A late wake-up turns "close" into "after firing unread",
			// another case of the same rule.
			time.Sleep(tc.wait)
			const second = 50 * time.Millisecond
			start := time.Now()
			if tc.stop {
				pt.Stop()
				select {
				case <-pt.C():
					t.Error("a stopped timer fired")
				case <-time.After(tc.first + 2*time.Millisecond): // past the voided deadline
				}
				return
			}
			pt.Reset(second)
			at := testutil.Wait(t, "the firing of the new arming", pt.C())
			if got := at.Sub(start); got < second {
				t.Errorf("fired %v after the Reset to %v: a value of the earlier arming", got, second)
			}
		})
	}
}
