package testutil

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	msg := FatalMessage(t, func(tb testing.TB) {
		Eventually(tb, "third call", func() (bool, string) { return calls.Add(1) == 3, "" })
	})
	if msg != "" || calls.Load() != 3 {
		t.Errorf("failed %q after %d calls, want no failure after 3", msg, calls.Load())
	}
}

func TestEventuallyFailsWithTheLastDetail(t *testing.T) {
	var calls int
	msg := FatalMessage(t, func(tb testing.TB) {
		Eventually(fixedDeadline{tb, time.Now().Add(reportGrace + 50*time.Millisecond)}, "never", func() (bool, string) {
			calls++
			return false, fmt.Sprint("call ", calls)
		})
	})
	if want := fmt.Sprintf("never: not reached; last seen: call %d", calls); msg != want || calls < 2 {
		t.Errorf("failed with %q after %d calls, want %q", msg, calls, want)
	}
}

// TestDeadlineIsTheTests: a wait lasts until just before the test
// binary's deadline, however far, and only without one is it bounded by
// Ceiling.
func TestDeadlineIsTheTests(t *testing.T) {
	far := time.Now().Add(24 * time.Hour)
	if got := deadline(fixedDeadline{t, far}); !got.Equal(far.Add(-reportGrace)) {
		t.Errorf("deadline %v, want %v", got, far.Add(-reportGrace))
	}
	if got := deadline(noDeadline{t}); time.Until(got) > Ceiling {
		t.Errorf("deadline %v from now without the binary's, want Ceiling", time.Until(got))
	}
}

// noDeadline is a test binary run with -timeout 0.
type noDeadline struct{ testing.TB }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

type fixedDeadline struct {
	testing.TB
	at time.Time
}

func (f fixedDeadline) Deadline() (time.Time, bool) { return f.at, true }

func TestWait(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Wait(t, "a value", ch); got != 7 {
		t.Errorf("Wait: %d, want 7", got)
	}
	closed := make(chan struct{})
	close(closed)
	Wait(t, "closed", closed)
	never := make(chan struct{})
	if msg := FatalMessage(t, func(tb testing.TB) {
		Wait(fixedDeadline{tb, time.Now().Add(reportGrace)}, "the event", never)
	}); msg != "the event: did not happen" {
		t.Errorf("failed with %q", msg)
	}
	var log Buffer
	_, _ = log.Write([]byte("the log")) // a Buffer never fails
	if msg := FatalMessage(t, func(tb testing.TB) {
		WaitShowing(fixedDeadline{tb, time.Now().Add(reportGrace)}, "the event", never, &log)
	}); msg != "the event: did not happen:\nthe log" {
		t.Errorf("failed with %q", msg)
	}
}
