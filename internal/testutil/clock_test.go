package testutil

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestClockTimers: a timer fires once when the clock reaches its deadline,
// sending the clock's time; Reset and Stop discard an earlier arming's
// value; a jumping clock moves to the deadline as the timer is armed.
func TestClockTimers(t *testing.T) {
	type step struct {
		advance time.Duration // Advance by this, or
		reset   time.Duration // Reset the timer to this (with arm), or
		arm     bool
		stop    bool // Stop the timer
	}
	for _, tc := range []struct {
		name  string
		jump  bool
		steps []step
		fired time.Duration // the clock's time past its start that the timer sent; -1: nothing
		now   time.Duration // the clock's time past its start at the end
	}{
		{name: "never armed", steps: []step{{advance: time.Hour}}, fired: -1, now: time.Hour},
		{name: "not yet due", steps: []step{{arm: true, reset: time.Second}, {advance: time.Second - 1}}, fired: -1, now: time.Second - 1},
		{name: "due", steps: []step{{arm: true, reset: time.Second}, {advance: time.Second}}, fired: time.Second, now: time.Second},
		{name: "past due sends the clock's time", steps: []step{{arm: true, reset: time.Second}, {advance: 3 * time.Second}}, fired: 3 * time.Second, now: 3 * time.Second},
		{name: "armed at zero fires at once", steps: []step{{arm: true}}, fired: 0, now: 0},
		{name: "stopped", steps: []step{{arm: true, reset: time.Second}, {stop: true}, {advance: time.Hour}}, fired: -1, now: time.Hour},
		{name: "stop discards a sent value", steps: []step{{arm: true}, {stop: true}}, fired: -1, now: 0},
		{name: "reset discards a sent value", steps: []step{{arm: true}, {arm: true, reset: time.Minute}, {advance: time.Second}}, fired: -1, now: time.Second},
		{name: "jumping", jump: true, steps: []step{{arm: true, reset: time.Minute}}, fired: time.Minute, now: time.Minute},
		{name: "jumping never goes back", jump: true, steps: []step{{advance: time.Hour}, {arm: true, reset: -time.Minute}}, fired: time.Hour, now: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClock()
			if tc.jump {
				c = NewJumpingClock()
			}
			start := c.Now()
			timer := c.NewTimer()
			for _, s := range tc.steps {
				switch {
				case s.arm:
					timer.Reset(s.reset)
				case s.stop:
					timer.Stop()
				default:
					c.Advance(s.advance)
				}
			}
			fired := time.Duration(-1)
			select {
			case at := <-timer.C():
				fired = at.Sub(start)
			default:
			}
			if fired != tc.fired || c.Now().Sub(start) != tc.now {
				t.Errorf("fired at %v, now %v; want %v, %v", fired, c.Now().Sub(start), tc.fired, tc.now)
			}
			select {
			case at := <-timer.C():
				t.Errorf("fired twice, again at %v", at.Sub(start))
			default:
			}
		})
	}
}

// TestClockWaitArmed: WaitArmed returns once another goroutine has armed a
// timer for that time, and only then.
func TestClockWaitArmed(t *testing.T) {
	c := NewClock()
	timer := c.NewTimer()
	due := c.Now().Add(time.Second)
	armed := make(chan struct{})
	go func() {
		defer close(armed)
		timer.Reset(2 * time.Second) // not the time waited for
		timer.Reset(time.Second)
	}()
	c.WaitArmed(due)
	<-armed
	c.Advance(time.Second)
	if at := <-timer.C(); !at.Equal(due) {
		t.Errorf("fired at %v, want %v", at, due)
	}
}

// TestClockSleep: Sleep moves the clock on by what it is given (never
// back), fires the timers that came due, records every call and returns
// the context's error.
func TestClockSleep(t *testing.T) {
	c := NewClock()
	start := c.Now()
	timer := c.NewTimer()
	timer.Reset(2 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	for _, d := range []time.Duration{time.Second, -time.Hour, 0, time.Second} {
		if err := c.Sleep(ctx, d); err != nil {
			t.Fatalf("sleep %v: %v", d, err)
		}
	}
	cancel()
	if err := c.Sleep(ctx, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("sleep on a cancelled context: %v", err)
	}
	if now := c.Now().Sub(start); now != 3*time.Second {
		t.Errorf("now %v past the start, want 3s", now)
	}
	if got, want := c.Slept(), []time.Duration{time.Second, -time.Hour, 0, time.Second, time.Second}; !slices.Equal(got, want) {
		t.Errorf("slept %v, want %v", got, want)
	}
	select {
	case at := <-timer.C():
		if at.Sub(start) != 2*time.Second {
			t.Errorf("the timer fired at %v, want 2s", at.Sub(start))
		}
	default:
		t.Error("the timer due in the sleeps did not fire")
	}
}
