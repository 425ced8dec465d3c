package testutil

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Clock is a fake clock: time moves only through Advance and Sleep or, for
// a jumping clock, whenever a timer is armed, so a test says when
// something is due and a slow machine never makes it so. Its Now and NewTimer have
// the shape of the clocks the code under test takes; a package whose clock
// interface returns its own timer type wraps Clock in a one-method adapter,
// since this kit imports no package of the module.
type Clock struct {
	mu     sync.Mutex
	armed  *sync.Cond // broadcast whenever a timer is armed
	now    time.Time
	timers []*Timer
	jump   bool
	slept  []time.Duration
}

// Timer is a timer of a Clock with the Go 1.23 guarantee: after Reset or
// Stop no value from an earlier arming is received.
type Timer struct {
	c     *Clock
	ch    chan time.Time
	when  time.Time
	armed bool
}

// clockStart is where every Clock starts: a fixed time, so that what a
// test reads off the clock does not depend on the day it runs.
var clockStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewClock returns a clock that moves only through Advance.
func NewClock() *Clock { return newClock(false) }

// NewJumpingClock returns a clock that also leaps to a timer's deadline
// as the timer is armed, so that a whole schedule runs as fast as the CPU
// allows, in order.
func NewJumpingClock() *Clock { return newClock(true) }

func newClock(jump bool) *Clock {
	c := &Clock{now: clockStart, jump: jump}
	c.armed = sync.NewCond(&c.mu)
	return c
}

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a stopped timer.
func (c *Clock) NewTimer() *Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &Timer{c: c, ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock on by d and fires the timers that came due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

// Sleep is a sleep on the clock for code that takes a sleep function: it
// records d and moves the clock on by it (not back, for d < 0), at once,
// and returns ctx's error.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	if d > 0 {
		c.now = c.now.Add(d)
		c.fireLocked()
	}
	return ctx.Err()
}

// Slept lists the durations Sleep was called with, in order.
func (c *Clock) Slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slept)
}

// WaitArmed blocks until some timer is armed to fire at when: the code
// under test has reached the wait the test means to end.
func (c *Clock) WaitArmed(when time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !slices.ContainsFunc(c.timers, func(t *Timer) bool { return t.armed && t.when.Equal(when) }) {
		c.armed.Wait()
	}
}

// fireLocked sends the clock's time on every armed timer that is due, as
// a runtime timer sends the time it fired.
func (c *Clock) fireLocked() {
	for _, t := range c.timers {
		if t.armed && !t.when.After(c.now) {
			t.armed = false
			select {
			case t.ch <- c.now:
			default:
			}
		}
	}
}

// C is the channel the timer fires on.
func (t *Timer) C() <-chan time.Time { return t.ch }

// Reset arms the timer d from now, discarding a value from an earlier
// arming; a jumping clock moves to the deadline at once.
func (t *Timer) Reset(d time.Duration) {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	t.drainLocked()
	t.when, t.armed = c.now.Add(d), true
	if c.jump && t.when.After(c.now) {
		c.now = t.when
	}
	c.armed.Broadcast()
	c.fireLocked()
}

// Stop disarms the timer, discarding a value it already sent.
func (t *Timer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.armed = false
	t.drainLocked()
}

func (t *Timer) drainLocked() {
	select {
	case <-t.ch:
	default:
	}
}
