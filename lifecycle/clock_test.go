package lifecycle

import (
	"sync"
	"time"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// manualClock is a dispatch clock that moves only through Advance: a row
// of the replay is due when the test says, never because the machine was
// slow.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	c     *manualClock
	ch    chan time.Time
	when  time.Time
	armed bool
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) NewTimer() replay.DispatchTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock on by d and fires the timers that came due.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		t.fireLocked()
	}
}

func (t *manualTimer) C() <-chan time.Time { return t.ch }

// Reset arms the timer d from now; a value from an earlier arming is
// discarded, as with Go 1.23 timers.
func (t *manualTimer) Reset(d time.Duration) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.drainLocked()
	t.when, t.armed = t.c.now.Add(d), true
	t.fireLocked()
}

func (t *manualTimer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.drainLocked()
	t.armed = false
}

func (t *manualTimer) drainLocked() {
	select {
	case <-t.ch:
	default:
	}
}

func (t *manualTimer) fireLocked() {
	if t.armed && !t.when.After(t.c.now) {
		t.armed = false
		t.ch <- t.when
	}
}
