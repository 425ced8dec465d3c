package kvevents

import (
	"math"
	"testing"
	"time"
)

// TestStreamClock: a batch is placed by the engine's clock plus the least
// the exporter's clock was ahead of it, so a batch taken late keeps the
// time it happened; never after it was taken, never before the batch
// before it, and at its taking when it carries no usable timestamp.
func TestStreamClock(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	ts := func(s float64) float64 { return float64(base.Unix()) + s }
	s := NewStream("tcp://test:1")
	for _, step := range []struct {
		name          string
		taken, engine float64 // seconds after base
		noStamp       bool
		want          float64
	}{
		{name: "first batch, 0.1 s on its way", taken: 100, engine: 99.9, want: 100},
		{name: "taken 4.9 s late", taken: 105, engine: 100.1, want: 100.2},
		{name: "a quicker batch lowers the lead", taken: 105.5, engine: 105.45, want: 105.5},
		{name: "taken late again", taken: 110, engine: 106, want: 106.05},
		{name: "no timestamp", taken: 111, noStamp: true, want: 111},
		{name: "stamped before the batch before it", taken: 112, engine: 100, want: 111},
		{name: "NaN", taken: 113, engine: math.NaN(), want: 113},
	} {
		stamp := ts(step.engine)
		if step.noStamp {
			stamp = 0
		}
		if math.IsNaN(step.engine) {
			stamp = math.NaN()
		}
		got := s.clock(at(step.taken), stamp)
		if d := got.Sub(at(step.want)); d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("%s: placed at %v after base, want %v", step.name, got.Sub(base).Seconds(), step.want)
		}
	}
}

// TestStreamCaughtUp: a classification of a request that ended at end
// waits while the stream's latest batch happened before end and batches
// still come; a batch of after end, or a quiet stream, ends the wait.
func TestStreamCaughtUp(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	end := base.Add(10 * time.Second)
	const quiet = 2 * time.Second
	for _, tc := range []struct {
		name           string
		taken, stamped time.Duration // the latest batch, after base; 0: none
		now            time.Duration
		want           bool
	}{
		{name: "no batch taken", now: 11 * time.Second, want: true},
		{name: "behind, batches coming", taken: 11 * time.Second, stamped: 9 * time.Second, now: 11500 * time.Millisecond, want: false},
		{name: "a batch of after the end", taken: 12 * time.Second, stamped: 10500 * time.Millisecond, now: 12 * time.Second, want: true},
		{name: "behind, and quiet since", taken: 11 * time.Second, stamped: 9 * time.Second, now: 13 * time.Second, want: true},
	} {
		s := NewStream("tcp://test:1")
		if tc.taken != 0 {
			// The lead is learnt from a first batch on time.
			s.clock(base, float64(base.UnixNano())/1e9)
			s.clock(base.Add(tc.taken), float64(base.Add(tc.stamped).UnixNano())/1e9)
		}
		if got := s.caughtUp(end, base.Add(tc.now), quiet); got != tc.want {
			t.Errorf("%s: caught up %v, want %v", tc.name, got, tc.want)
		}
	}
}
