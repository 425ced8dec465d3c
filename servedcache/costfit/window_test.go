package costfit

import (
	"testing"
	"time"
)

// observations are n requests finishing one a second from start, timed
// by a cache that works (on) or not, with prefill times where prefill.
func observations(start time.Time, n int, on, prefill bool) []Observation {
	in := engine{n: n, perToken: 50e-6, cacheOn: on, noise: 0.002}.samples(uint64(start.Unix()))
	out := make([]Observation, n)
	for i, s := range in {
		d := time.Duration(s.Seconds * float64(time.Second))
		at := start.Add(time.Duration(i) * time.Second)
		o := Observation{Sent: at.Add(-d), At: at, Uncached: int(s.Uncached), Cached: int(s.Cached), TTFT: d}
		if prefill {
			// The queue is in the TTFT only.
			o.TTFT += time.Duration(i%7) * time.Second
			o.Prefill, o.PrefillKnown = d, true
		}
		out[i] = o
	}
	return out
}

func TestWindow(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name   string
		span   time.Duration
		limit  int
		phases [][]Observation // added in order
		at     time.Time
		state  State
		timing Timing
		ratio  float64 // when Decided, ±0.1
		n      int
	}{
		{"a working cache", time.Hour, 512, [][]Observation{observations(t0, 200, true, false)}, t0.Add(200 * time.Second),
			Decided, TimingTTFT, 0, 200},
		{"a broken cache", time.Hour, 512, [][]Observation{observations(t0, 200, false, false)}, t0.Add(200 * time.Second),
			Decided, TimingTTFT, 1, 200},
		{"the prefill time where the engine gives it", time.Hour, 512, [][]Observation{observations(t0, 200, true, true)}, t0.Add(200 * time.Second),
			Decided, TimingPrefill, 0, 200},
		{"broken after the count bound turned over", time.Hour, 100, [][]Observation{
			observations(t0, 200, true, false), observations(t0.Add(200*time.Second), 100, false, false),
		}, t0.Add(300 * time.Second), Decided, TimingTTFT, 1, 100},
		{"broken after the span passed", 60 * time.Second, 512, [][]Observation{
			observations(t0, 200, true, false), observations(t0.Add(200*time.Second), 100, false, false),
		}, t0.Add(300 * time.Second), Decided, TimingTTFT, 1, 59},
		{"everything aged out", 60 * time.Second, 512, [][]Observation{observations(t0, 200, true, false)}, t0.Add(time.Hour),
			TooFewRequests, TimingTTFT, 0, 0},
		{"too few with prefill: all by TTFT", time.Hour, 512, [][]Observation{
			observations(t0, 100, true, false), observations(t0.Add(100*time.Second), 10, true, true),
		}, t0.Add(110 * time.Second), Decided, TimingTTFT, 0, 110},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWindow(tt.span, tt.limit, DefaultLimits)
			for _, p := range tt.phases {
				for _, o := range p {
					w.Add(o)
				}
			}
			r := w.Estimate(tt.at)
			t.Logf("%+v", r)
			if r.State != tt.state || r.Timing != tt.timing || r.Requests != tt.n {
				t.Fatalf("%s by %s on %d requests, want %s by %s on %d", r.State, r.Timing, r.Requests, tt.state, tt.timing, tt.n)
			}
			if r.State == Decided && !(r.Ratio > tt.ratio-0.1 && r.Ratio < tt.ratio+0.1) {
				t.Errorf("ratio %.3f, want %g ± 0.1", r.Ratio, tt.ratio)
			}
		})
	}
}

// TestWindowReuses: a second estimate with nothing added and nothing aged
// out is the first; an Add or an expiry makes a new one.
func TestWindowReuses(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	w := NewWindow(100*time.Second, 512, DefaultLimits)
	for _, o := range observations(t0, 100, true, false) {
		w.Add(o)
	}
	now := t0.Add(100 * time.Second)
	first := w.Estimate(now)
	if first.Requests != 99 { // the first finished exactly a span ago
		t.Fatalf("%d requests", first.Requests)
	}
	if again := w.Estimate(now.Add(500 * time.Millisecond)); again != first {
		t.Errorf("nothing changed, yet %+v after %+v", again, first)
	}
	if later := w.Estimate(now.Add(time.Second)); later.Requests != 98 {
		t.Errorf("one more aged out: %d requests", later.Requests)
	}
	w.Add(Observation{At: now.Add(time.Second), Uncached: 512, TTFT: time.Millisecond})
	if added := w.Estimate(now.Add(time.Second)); added.Requests != 99 {
		t.Errorf("after an Add: %d requests", added.Requests)
	}
}

// BenchmarkWindowAdd is the request path's share: one observation kept.
func BenchmarkWindowAdd(b *testing.B) {
	w := NewWindow(5*time.Minute, 512, DefaultLimits)
	o := Observation{At: time.Unix(1_800_000_000, 0), Uncached: 2048, Cached: 4096, TTFT: 100 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		w.Add(o)
	}
}

// BenchmarkWindowEstimate is a scrape after requests finished since the
// last one (nothing to reuse): copying out the window and fitting it.
func BenchmarkWindowEstimate(b *testing.B) {
	t0 := time.Unix(1_800_000_000, 0)
	w := NewWindow(time.Hour, 512, DefaultLimits)
	obs := observations(t0, 512, true, true)
	for _, o := range obs {
		w.Add(o)
	}
	now := t0.Add(512 * time.Second)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		w.Add(obs[i%len(obs)]) // one more finished: the last estimate is stale
		i++
		if r := w.Estimate(now); r.State != Decided {
			b.Fatalf("%+v", r)
		}
	}
}

// BenchmarkWindowEstimateUnchanged is a scrape with no request finished
// since the last one: the last estimate is reused.
func BenchmarkWindowEstimateUnchanged(b *testing.B) {
	t0 := time.Unix(1_800_000_000, 0)
	w := NewWindow(time.Hour, 512, DefaultLimits)
	for _, o := range observations(t0, 512, true, true) {
		w.Add(o)
	}
	now := t0.Add(512 * time.Second)
	w.Estimate(now)
	b.ReportAllocs()
	for b.Loop() {
		if r := w.Estimate(now); r.State != Decided {
			b.Fatalf("%+v", r)
		}
	}
}
