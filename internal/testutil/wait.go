package testutil

import (
	"fmt"
	"testing"
	"time"
)

// Ceiling bounds a wait of the kit when the test's own deadline (go test
// -timeout) is later or unset. It only guards against a hang: a test that
// needs longer for its work says so with EventuallyWithin.
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

// deadline is when a wait that began now gives up: after ceiling, or just
// before the test binary's own deadline if that comes first.
func deadline(t testing.TB, ceiling time.Duration) time.Time {
	end := time.Now().Add(ceiling)
	if d, ok := t.(deadliner); ok {
		if td, ok := d.Deadline(); ok && td.Add(-reportGrace).Before(end) {
			end = td.Add(-reportGrace)
		}
	}
	return end
}

// Eventually polls cond until it holds. detail says what cond last saw:
// when the wait runs out (Ceiling, or the test's deadline), the test fails
// with what and the last detail.
func Eventually(t testing.TB, what string, cond func() (ok bool, detail string)) {
	t.Helper()
	EventuallyWithin(t, what, Ceiling, cond)
}

// EventuallyWithin is Eventually for a condition that takes long to come
// about (a pass over a big trace): ceiling replaces Ceiling.
func EventuallyWithin(t testing.TB, what string, ceiling time.Duration, cond func() (ok bool, detail string)) {
	t.Helper()
	end := deadline(t, ceiling)
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
	timer := time.NewTimer(time.Until(deadline(t, Ceiling)))
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
