package testutil

import (
	"fmt"
	"testing"
	"time"
)

// Ceiling bounds a wait only when the test binary has no deadline (go test
// -timeout 0): a wait is for something that will happen, and how long it
// takes is the machine's business, so the binary's -timeout is the limit.
const Ceiling = 2 * time.Minute

// reportGrace is kept before the test binary's deadline, so that a wait
// that runs out fails with its own message rather than the binary's panic.
const reportGrace = 5 * time.Second

// Polling starts at firstInterval and doubles up to maxInterval: a
// condition that holds soon is seen soon, and a long wait does not take
// the CPU from what it waits for.
const (
	firstInterval = 10 * time.Millisecond
	maxInterval   = 100 * time.Millisecond
)

// deadliner is the part of *testing.T that tells the binary's deadline;
// testing.TB lacks it.
type deadliner interface {
	Deadline() (time.Time, bool)
}

// deadline is when a wait that began now gives up: just before the test
// binary's own deadline, or after Ceiling where the binary has none.
func deadline(t testing.TB) time.Time {
	if d, ok := t.(deadliner); ok {
		if td, ok := d.Deadline(); ok {
			return td.Add(-reportGrace)
		}
	}
	return time.Now().Add(Ceiling)
}

// Eventually polls cond until it holds. detail says what cond last saw:
// when the wait runs out (the test binary's deadline), the test fails with
// what and the last detail.
func Eventually(t testing.TB, what string, cond func() (ok bool, detail string)) {
	t.Helper()
	end := deadline(t)
	interval := firstInterval
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if !time.Now().Before(end) {
			t.Fatalf("%s: not reached; last seen: %s", what, detail)
		}
		timer.Reset(min(interval, time.Until(end)))
		<-timer.C
		interval = min(2*interval, maxInterval)
	}
}

// Wait receives from ch (a closed channel answers at once) and returns the
// value; when the wait runs out the test fails with what.
func Wait[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	return WaitShowing(t, what, ch, nil)
}

// WaitShowing is Wait that shows show (a log, say) when the wait runs out.
func WaitShowing[T any](t testing.TB, what string, ch <-chan T, show fmt.Stringer) T {
	t.Helper()
	timer := time.NewTimer(time.Until(deadline(t)))
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		if show != nil {
			t.Fatalf("%s: did not happen:\n%s", what, show)
		}
		t.Fatalf("%s: did not happen", what)
	}
	var zero T
	return zero // unreached: Fatalf ends the goroutine
}
