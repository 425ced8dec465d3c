package cachecost

import (
	"testing"
	"time"
)

// BenchmarkFit is one scrape's work for one (workload, target) whose window
// is full: a fit of 512 requests.
func BenchmarkFit(b *testing.B) {
	for _, tc := range []struct {
		name string
		e    engine
	}{
		{"working", engine{n: 512, perToken: 50e-6, cacheOn: true, noise: 0.005}},
		{"broken", engine{n: 512, perToken: 50e-6, noise: 0.005}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			in := tc.e.samples(1)
			b.ReportAllocs()
			for b.Loop() {
				if e := Fit(in, DefaultLimits); e.State != Decided {
					b.Fatalf("%+v", e)
				}
			}
		})
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
