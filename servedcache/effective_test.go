package servedcache

import (
	"math"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/servedcache/servedcachetest"
)

// TestEffectiveCapacityFigure: the state and the capacity read from the
// window's requests: the inverse of their theoretical hits at the observed
// cached tokens, interpolated between grid points.
func TestEffectiveCapacityFigure(t *testing.T) {
	// Two grid points, and capacities between and below them.
	c99, c100 := capacityGrid[99], capacityGrid[100]
	at100 := int64(c100) // its grid point is c100
	twoSteps := []replay.CapacityStep{{Capacity: at100, Tokens: 300}, {Capacity: int64(capacityGrid[200]), Tokens: 600}}
	unknown := servedcachetest.Counted(1000, 1000, 900, twoSteps...)
	unknown.TheoreticalByCapacity.Known = false
	unreported := servedcachetest.Counted(1000, 1000, 0, twoSteps...)
	unreported.Counted = replay.Counted{Unreported: true}
	withPreamble := servedcachetest.Counted(1000, 1010, 310, twoSteps...)
	withPreamble.Counted.LeftOut = 10
	// A model bounded at c100 tokens (configured or read): it would serve
	// 300 tokens, and the engine served them.
	boundedModel := servedcachetest.Counted(1000, 1000, 300, twoSteps...)
	boundedModel.TheoreticalCachedTokens = 300
	tests := []struct {
		name    string
		results []*replay.Result
		state   EffectiveCapacityState
		tokens  float64
		// lowerBound: the engine served 90 % or more of what the model
		// (unbounded here, but where set) or its ceiling would have.
		lowerBound bool
	}{
		{"nothing yet", nil, EffectiveNotReported, 0, false},
		{"only unreported requests", []*replay.Result{unreported}, EffectiveNotReported, 0, false},
		{"only unknown profiles", []*replay.Result{unknown}, EffectiveNotReported, 0, false},
		{"at a grid point", []*replay.Result{servedcachetest.Counted(1000, 1000, 300, twoSteps...)}, EffectiveMeasured, c100, false},
		{"halfway between two, on a log scale", []*replay.Result{servedcachetest.Counted(1000, 1000, 150, twoSteps...)}, EffectiveMeasured, math.Sqrt(c99 * c100), false},
		{"the server's prompt counts the template", []*replay.Result{servedcachetest.Counted(1000, 1100, 330, twoSteps...)}, EffectiveMeasured, c100, false},
		{"the preamble left out", []*replay.Result{withPreamble}, EffectiveMeasured, c100, false},
		{"unknown profiles left out", []*replay.Result{servedcachetest.Counted(1000, 1000, 300, twoSteps...), unknown}, EffectiveMeasured, c100, false},
		{"requests added up", []*replay.Result{
			servedcachetest.Counted(1000, 1000, 0, replay.CapacityStep{Capacity: at100, Tokens: 600}),
			servedcachetest.Counted(1000, 1000, 300),
		}, EffectiveMeasured, math.Sqrt(c99 * c100), false},
		{"below the first grid point, linear from 0", []*replay.Result{servedcachetest.Counted(1000, 1000, 150, replay.CapacityStep{Capacity: 8, Tokens: 300})}, EffectiveMeasured, 8, false},
		{"no hit observed: a cache of nothing", []*replay.Result{servedcachetest.Counted(1000, 1000, 0, twoSteps...)}, EffectiveMeasured, 0, false},
		{"the ceiling's hits, all observed", []*replay.Result{servedcachetest.Counted(1000, 1000, 600, twoSteps...)}, EffectiveMeasured, capacityGrid[200], true},
		{"more than the ceiling's hits", []*replay.Result{servedcachetest.Counted(1000, 1000, 601, twoSteps...)}, EffectiveAboveModel, 0, false},
		{"nothing to share", []*replay.Result{servedcachetest.Counted(1000, 1000, 0)}, EffectiveNothingToShare, 0, false},
		{"under 1 % shared", []*replay.Result{servedcachetest.Counted(1000, 1000, 5, replay.CapacityStep{Capacity: 100, Tokens: 9})}, EffectiveNothingToShare, 0, false},
		{"1 % shared", []*replay.Result{servedcachetest.Counted(1000, 1000, 5, replay.CapacityStep{Capacity: 100, Tokens: 10})}, EffectiveMeasured, -1, false},
		{"90 % of the ceiling's: at least", []*replay.Result{servedcachetest.Counted(1000, 1000, 540, twoSteps...)}, EffectiveMeasured, -1, true},
		{"89 % of the ceiling's: the size", []*replay.Result{servedcachetest.Counted(1000, 1000, 534, twoSteps...)}, EffectiveMeasured, -1, false},
		{"a bounded model's own hits served: at least", []*replay.Result{boundedModel}, EffectiveMeasured, c100, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			e := NewEffectiveCapacity(func() time.Time { return now })
			e.Start("w", "t")
			for _, r := range tt.results {
				e.Add(r)
			}
			f := e.Figure("w", "t", now)
			if f.State != tt.state {
				t.Fatalf("state %s, want %s", f.State, tt.state)
			}
			if tt.tokens >= 0 && math.Abs(f.Tokens-tt.tokens) > 1e-6*max(tt.tokens, 1) {
				t.Errorf("effective capacity %.3f tokens, want %.3f", f.Tokens, tt.tokens)
			}
			if f.LowerBound != tt.lowerBound {
				t.Errorf("lower bound %v, want %v", f.LowerBound, tt.lowerBound)
			}
			if got := e.Figures()[Pair{"w", "t"}]; got != f {
				t.Errorf("Figures says %+v, Figure %+v", got, f)
			}
		})
	}
}

// TestEffectiveCapacityServerMetrics: with observed: server_metrics the
// observed side is the engine's counter, credited per read, over the
// prompt tokens of the requests counted.
func TestEffectiveCapacityServerMetrics(t *testing.T) {
	now := time.Unix(1000, 0)
	e := NewEffectiveCapacity(func() time.Time { return now })
	e.Start("w", "t")
	for range 4 {
		r := servedcachetest.Counted(1000, 1000, 0, replay.CapacityStep{Capacity: int64(capacityGrid[100]), Tokens: 500})
		r.CachedKnown, r.Counted.UsageCached = false, false
		e.Add(r)
	}
	if f := e.Figure("w", "t", now); f.State != EffectiveMeasured || f.Tokens != 0 {
		t.Fatalf("before any credit: %s, %v tokens; want measured, 0", f.State, f.Tokens)
	}
	e.AddCredit("w", "t", 2000)
	if f := e.Figure("w", "t", now); f.State != EffectiveMeasured || f.Tokens != capacityGrid[100] {
		t.Errorf("after the credit: %s, %v tokens; want measured, %v", f.State, f.Tokens, capacityGrid[100])
	}
}

// TestEffectiveCapacityWindow: the figures cover the last 5 minutes in
// steps of 30 s: requests older than that drop out, and the window
// exported says how long the figures cover.
func TestEffectiveCapacityWindow(t *testing.T) {
	start := time.Unix(3000, 0) // a sub-window boundary
	now := start
	e := NewEffectiveCapacity(func() time.Time { return now })
	e.Start("w", "t")
	small := replay.CapacityStep{Capacity: int64(capacityGrid[50]), Tokens: 500}
	large := replay.CapacityStep{Capacity: int64(capacityGrid[150]), Tokens: 500}
	check := func(after time.Duration, state EffectiveCapacityState, tokens float64, window time.Duration) {
		t.Helper()
		now = start.Add(after)
		f := e.Figure("w", "t", now)
		if f.State != state || f.Tokens != tokens || f.Window != window {
			t.Errorf("after %v: %s, %v tokens over %v; want %s, %v over %v", after, f.State, f.Tokens, f.Window, state, tokens, window)
		}
	}
	e.Add(servedcachetest.Counted(1000, 1000, 500, small))
	check(time.Minute, EffectiveMeasured, capacityGrid[50], time.Minute) // the pair is a minute old
	now = start.Add(2 * time.Minute)
	e.Add(servedcachetest.Counted(1000, 1000, 500, large))
	// Both requests: half the hits by capacityGrid[50], all by [150].
	check(2*time.Minute+10*time.Second, EffectiveMeasured, capacityGrid[150], 2*time.Minute+10*time.Second)
	check(5*time.Minute-time.Second, EffectiveMeasured, capacityGrid[150], 5*time.Minute-time.Second)
	// The first request's sub-window has left: the window starts 30 s on.
	check(5*time.Minute, EffectiveMeasured, capacityGrid[150], 4*time.Minute+30*time.Second)
	check(7*time.Minute-time.Second, EffectiveMeasured, capacityGrid[150], 5*time.Minute-time.Second)
	check(7*time.Minute, EffectiveNotReported, 0, 4*time.Minute+30*time.Second)
}

// TestEffectiveCapacityEstimateWindow: a target's cache.estimate_window
// sets the window, in tenths of it; a change starts the pair over.
func TestEffectiveCapacityEstimateWindow(t *testing.T) {
	start := time.Unix(3000, 0) // a boundary of 1 s and of 30 s sub-windows
	now := start
	e := NewEffectiveCapacity(func() time.Time { return now })
	e.SetWindow("t", 10*time.Second)
	e.Start("w", "t")
	step := replay.CapacityStep{Capacity: int64(capacityGrid[50]), Tokens: 500}
	e.Add(servedcachetest.Counted(1000, 1000, 500, step))
	now = start.Add(9 * time.Second)
	if f := e.Figure("w", "t", now); f.State != EffectiveMeasured || f.Window != 9*time.Second {
		t.Errorf("9 s on: %s over %v, want measured over 9s", f.State, f.Window)
	}
	now = start.Add(10 * time.Second)
	if f := e.Figure("w", "t", now); f.State != EffectiveNotReported || f.Window != 9*time.Second {
		t.Errorf("10 s on: %s over %v, want not_reported over 9s: the request has left a 10 s window", f.State, f.Window)
	}
	e.Add(servedcachetest.Counted(1000, 1000, 500, step))
	e.SetWindow("t", 5*time.Minute)
	if f := e.Figure("w", "t", now); f.State != EffectiveNotReported {
		t.Errorf("after the window changed: %s, want not_reported (started over)", f.State)
	}
}
