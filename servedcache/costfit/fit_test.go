package costfit

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/mat"
)

// engine draws requests of a conversation-like workload and times them as
// an engine would: a fixed overhead, perToken seconds for every computed
// prompt token, and what extra adds on top.
type engine struct {
	n        int
	perToken float64 // seconds per computed token
	cacheOn  bool
	noise    float64                              // standard deviation of Gaussian jitter, seconds
	extra    func(r *rand.Rand, s Sample) float64 // added to each request's time
}

func (e engine) samples(seed uint64) []Sample {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]Sample, e.n)
	for i := range out {
		// Half the requests continue a conversation (a long cached
		// prefix), half start one; new text of 1 to 16 blocks of 512.
		s := Sample{Uncached: float64(512 * (1 + r.IntN(16)))}
		if r.IntN(2) == 0 {
			s.Cached = float64(512 * (1 + r.IntN(24)))
		}
		computed := s.Uncached
		if !e.cacheOn {
			computed += s.Cached
		}
		s.Seconds = 0.002 + e.perToken*computed + e.noise*r.NormFloat64()
		if e.extra != nil {
			s.Seconds += e.extra(r, s)
		}
		out[i] = s
	}
	return out
}

func TestFit(t *testing.T) {
	const perToken = 50e-6
	// queue adds a wait of the engine's queue: exponential with a mean of
	// 10 s, as on an engine saturated for minutes (TTFT 15-20 s).
	queue := func(r *rand.Rand, _ Sample) float64 { return 10 * r.ExpFloat64() }
	// slowCached delays one request in ten by 3 s, the ones with the
	// longest cached prefixes: a least-squares fit reads them as cached
	// tokens that cost.
	slowCached := func(r *rand.Rand, s Sample) float64 {
		if s.Cached >= 512*20 && r.IntN(2) == 0 {
			return 3
		}
		return 0
	}
	tests := []struct {
		name   string
		in     []Sample
		want   State
		lo, hi float64 // the ratio's band when Decided
	}{
		{"cached tokens free", engine{n: 300, perToken: perToken, cacheOn: true, noise: 0.005}.samples(1), Decided, -0.05, 0.05},
		{"cache off", engine{n: 300, perToken: perToken, noise: 0.005}.samples(2), Decided, 0.95, 1.05},
		{"exact, cache on", engine{n: 64, perToken: perToken, cacheOn: true}.samples(3), Decided, -1e-6, 1e-6},
		{"exact, cache off", engine{n: 64, perToken: perToken}.samples(4), Decided, 1 - 1e-6, 1 + 1e-6},
		{"queueing dominates, cache on", engine{n: 512, perToken: perToken, cacheOn: true, extra: queue}.samples(5), NoUncachedCost, 0, 0},
		{"queueing dominates, cache off", engine{n: 512, perToken: perToken, extra: queue}.samples(6), NoUncachedCost, 0, 0},
		{"few requests", engine{n: 20, perToken: perToken, cacheOn: true, noise: 0.005}.samples(7), TooFewRequests, 0, 0},
		{"none", nil, TooFewRequests, 0, 0},
		{"outliers on cached requests", engine{n: 400, perToken: perToken, cacheOn: true, noise: 0.005, extra: slowCached}.samples(8), Decided, -0.05, 0.1},
		{"nothing cached", noCached(engine{n: 200, perToken: perToken, cacheOn: true, noise: 0.005}.samples(9)), TooLittleSpread, 0, 0},
		{"cached tokens follow uncached ones", proportional(engine{n: 200, perToken: perToken, noise: 0.005}.samples(10)), TooLittleSpread, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := Fit(tt.in, DefaultLimits)
			t.Logf("%+v", e)
			if e.State != tt.want {
				t.Fatalf("state %s, want %s", e.State, tt.want)
			}
			if e.Requests != len(tt.in) {
				t.Errorf("requests %d, want %d", e.Requests, len(tt.in))
			}
			if tt.want != Decided {
				if !math.IsNaN(e.Ratio) {
					t.Errorf("undecided with ratio %v", e.Ratio)
				}
				return
			}
			if !(e.Ratio >= tt.lo && e.Ratio <= tt.hi) {
				t.Errorf("ratio %.4f, want within [%g, %g]", e.Ratio, tt.lo, tt.hi)
			}
			if !(e.RatioStdErr <= DefaultLimits.MaxRatioStdErr) {
				t.Errorf("decided with standard error %v", e.RatioStdErr)
			}
			if math.Abs(e.PerUncached-perToken)/perToken > 0.05 {
				t.Errorf("%.3g s per uncached token, want %.3g", e.PerUncached, perToken)
			}
		})
	}
}

// TestFitRobust shows the outliers of TestFit's "outliers on cached
// requests" matter: least squares alone (every weight 1) reads the cache
// as far from free.
func TestFitRobust(t *testing.T) {
	in := engine{n: 400, perToken: 50e-6, cacheOn: true, noise: 0.005, extra: func(r *rand.Rand, s Sample) float64 {
		if s.Cached >= 512*20 && r.IntN(2) == 0 {
			return 3
		}
		return 0
	}}.samples(8)
	e := Fit(in, DefaultLimits)
	ls := leastSquaresRatio(t, in)
	t.Logf("Huber %.4f, least squares %.4f", e.Ratio, ls)
	if ls < 0.3 {
		t.Errorf("least squares reads %.4f: the outliers do not test robustness", ls)
	}
	if !(e.Ratio < 0.1) {
		t.Errorf("Huber reads %.4f", e.Ratio)
	}
}

// TestFitNeverConfidentlyWrong: over many draws of a saturated engine,
// timed by its queue, a fit is either undecided or right (within 3
// standard errors of the truth), for a cache that works and one that does
// not.
func TestFitNeverConfidentlyWrong(t *testing.T) {
	for _, on := range []bool{true, false} {
		truth := 0.0
		if !on {
			truth = 1
		}
		decided := 0
		for seed := range uint64(40) {
			for _, mean := range []float64{0.5, 2, 10} {
				in := engine{n: 512, perToken: 50e-6, cacheOn: on, extra: func(r *rand.Rand, _ Sample) float64 {
					return mean * r.ExpFloat64()
				}}.samples(100 + seed)
				e := Fit(in, DefaultLimits)
				if e.State != Decided {
					continue
				}
				decided++
				if math.Abs(e.Ratio-truth) > 3*e.RatioStdErr+0.05 {
					t.Errorf("cache on %v, queue mean %gs, seed %d: ratio %.3f ± %.3f, truth %g", on, mean, seed, e.Ratio, e.RatioStdErr, truth)
				}
			}
		}
		t.Logf("cache on %v: %d of 120 fits decided", on, decided)
	}
}

func TestFitLimits(t *testing.T) {
	in := engine{n: 100, perToken: 50e-6, cacheOn: true, noise: 0.05}.samples(11)
	if e := Fit(in, DefaultLimits); e.State != Decided {
		t.Fatalf("default limits: %+v", e)
	}
	strict := DefaultLimits
	strict.MaxRatioStdErr = 1e-4
	if e := Fit(in, strict); e.State != TooUncertain || !(e.RatioStdErr > 1e-4) || !math.IsNaN(e.Ratio) {
		t.Errorf("a standard error above the limit: %+v", e)
	}
	strict = DefaultLimits
	strict.MinRequests = 101
	if e := Fit(in, strict); e.State != TooFewRequests {
		t.Errorf("fewer requests than the minimum: %+v", e)
	}
	strict = DefaultLimits
	strict.MinUncachedT = 1e6
	if e := Fit(in, strict); e.State != NoUncachedCost {
		t.Errorf("an uncached cost short of its t: %+v", e)
	}
}

func noCached(in []Sample) []Sample {
	for i := range in {
		in[i].Cached = 0
	}
	return in
}

func proportional(in []Sample) []Sample {
	for i := range in {
		in[i].Cached = 3 * in[i].Uncached
	}
	return in
}

// leastSquaresRatio is the ratio of an ordinary least-squares fit (every
// weight 1) on the raw token counts.
func leastSquaresRatio(t *testing.T, in []Sample) float64 {
	t.Helper()
	x := mat.NewDense(len(in), 3, nil)
	y := mat.NewVecDense(len(in), nil)
	w := make([]float64, len(in))
	for i, s := range in {
		x.SetRow(i, []float64{1, s.Uncached, s.Cached})
		y.SetVec(i, s.Seconds)
		w[i] = 1
	}
	beta := mat.NewVecDense(3, nil)
	if !newLeastSquares(len(in), 3).solve(x, y, w, beta) {
		t.Fatal("singular")
	}
	return beta.AtVec(2) / beta.AtVec(1)
}

// saturatedFIFO simulates an engine that runs one request at a time, in
// the order they arrive, fed a request every gap by a client that keeps at
// most 64 in it (later ones are dropped, as the exporter's max_in_flight
// does). The requests are conversations in five lanes taking turns, each of
// 1 to 6 turns that add 1 to 8 blocks of 64 tokens; a turn's cached tokens
// are the prompt of its conversation's last turn sent. Prefill costs 200 µs
// per computed token (every token with the cache off), decoding 4 ms. It
// returns the samples TTFT makes, in send order.
func saturatedFIFO(seed uint64, rows int, gap float64, cacheOn bool) []Sample {
	r := rand.New(rand.NewPCG(seed, 2))
	type lane struct{ isl, sent, left int }
	var lanes [5]lane
	var finishes []float64 // of the requests in the engine, in order
	free := 0.0
	var out []Sample
	for i := range rows {
		at := float64(i) * gap
		l := &lanes[i%len(lanes)]
		if l.left == 0 {
			l.isl, l.sent, l.left = 0, 0, 1+r.IntN(6)
		}
		l.isl += 64 * (1 + r.IntN(8))
		l.left--
		for len(finishes) > 0 && finishes[0] <= at {
			finishes = finishes[1:]
		}
		if len(finishes) >= 64 {
			continue // dropped: never sent, so its prompt is not cached
		}
		s := Sample{Cached: float64(l.sent), Uncached: float64(l.isl - l.sent)}
		computed := s.Uncached
		if !cacheOn {
			computed += s.Cached
		}
		start := math.Max(at, free)
		first := start + 0.002 + 200e-6*computed
		free = first + 0.004
		finishes = append(finishes, free)
		s.Seconds = first - at
		l.sent = l.isl
		out = append(out, s)
	}
	return out
}

func TestFitSaturatedFIFO(t *testing.T) {
	for _, on := range []bool{true, false} {
		truth := 0.0
		if !on {
			truth = 1
		}
		for seed := range uint64(10) {
			in := saturatedFIFO(seed, 400, 0.05, on)
			e := Fit(in, DefaultLimits)
			t.Logf("cache on %v, seed %d: %d requests, %s, ratio %.3f ± %.3f, %.3g s per uncached token", on, seed, len(in), e.State, e.Ratio, e.RatioStdErr, e.PerUncached)
			if e.State == Decided && math.Abs(e.Ratio-truth) > 0.25 {
				t.Errorf("cache on %v, seed %d: confidently wrong: %.3f ± %.3f", on, seed, e.Ratio, e.RatioStdErr)
			}
		}
	}
}

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
