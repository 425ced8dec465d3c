package synth

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// tiny is half an ulp of 1: 1+tiny rounds back to 1 (ties to even), while
// 1+2·tiny is representable. Arrays of ones and tinies expose the order of
// additions.
const tiny = 0x1p-53

func TestNumpySum(t *testing.T) {
	// chunked has its two tinies in the first 8192-element buffer and the
	// one in the second, so numpy adds the tinies together first. A single
	// pairwise pass over all 8200 elements would put indices 8129, 8130
	// and 8192 in one eight-accumulator block (8128..8199) and add each
	// tiny to the one separately, losing both.
	chunked := make([]float64, 8200)
	chunked[8129], chunked[8130], chunked[8192] = tiny, tiny, 1

	tests := []struct {
		name  string
		x     []float64
		want  float64 // numpy 1.24
		naive float64 // plain left-to-right sum
	}{
		{"empty", nil, 0, 0},
		{"short runs are summed left to right", []float64{1, tiny, tiny}, 1, 1},
		{"eight values pair up", []float64{1, 0, tiny, tiny, 0, 0, 0, 0}, 1 + 2*tiny, 1},
		{
			// r0 = 1 (1+tiny rounds to 1), r1..r7 = 2·tiny; then
			// ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) = 1 + 14·tiny.
			"sixteen values use eight accumulators",
			[]float64{1, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny},
			1 + 14*tiny, 1,
		},
		{
			// As above, then the tail element is added last: 1+14·tiny
			// plus tiny is a tie between 1+14·tiny and 1+16·tiny; even
			// mantissa wins (1+16·tiny = 1+8 ulps).
			"tail after the accumulators",
			[]float64{1, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny},
			1 + 16*tiny, 1,
		},
		{"integers are exact", []float64{13, 277, 11587, 23175, 191378}, 226430, 226430},
		{"8192-element buffers are summed one after the other", chunked, 1 + 2*tiny, 1 + 2*tiny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NumpySum(tt.x); got != tt.want {
				t.Errorf("NumpySum = %v, want %v", strconv.FormatFloat(got, 'g', -1, 64), strconv.FormatFloat(tt.want, 'g', -1, 64))
			}
			naive := 0.0
			for _, v := range tt.x {
				naive += v
			}
			if naive != tt.naive {
				t.Errorf("naive sum = %v, want %v (the test vector is wrong)", naive, tt.naive)
			}
		})
	}

	// The buffering matters: one pairwise pass over the whole array gives
	// another result, so the test above fails if the chunking goes.
	if got := pairwiseSum(chunked); got != 1 {
		t.Errorf("pairwiseSum over the whole array = %v, want 1", got)
	}
}

func TestNumpyMeanStd(t *testing.T) {
	tests := []struct {
		name      string
		x         []float64
		mean, std float64
	}{
		{"one value", []float64{891}, 891, 0},
		// deviations 519, 243, -81, -681; squares sum to 798732; /4 = 199683.
		{"integers", []float64{1300, 1024, 700, 100}, 781, math.Sqrt(199683)},
		// mean 0.5; squared deviations 0.25, 0.25, 0 → 0.5/3.
		{"hit rates", []float64{0, 1, 0.5}, 0.5, math.Sqrt(0.5 / 3)},
		// The sum is 1+2·tiny (pairwise), not 1 (naive), so the mean is
		// (1+2·tiny)/8. The std was checked with the same float operations
		// in Python.
		{"pairwise sum feeds the mean", []float64{1, 0, tiny, tiny, 0, 0, 0, 0}, (1 + 2*tiny) / 8, 0.33071891388307384},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NumpyMean(tt.x); got != tt.mean {
				t.Errorf("NumpyMean = %v, want %v", got, tt.mean)
			}
			if got := NumpyStd(tt.x); got != tt.std {
				t.Errorf("NumpyStd = %v, want %v", got, tt.std)
			}
		})
	}
	if !math.IsNaN(NumpyMean(nil)) || !math.IsNaN(NumpyStd(nil)) {
		t.Error("mean and std of nothing should be NaN, as in numpy")
	}
}

func TestNumpyPercentileMedian(t *testing.T) {
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"single", []float64{7}, 25, 7},
		{"p0 is the min", []float64{1, 2, 3}, 0, 1},
		{"p100 is the max", []float64{1, 2, 3}, 100, 3},
		{"exact index", []float64{0, 0.5, 1}, 50, 0.5},
		// h = 3·0.25 = 0.75 → 100 + (700−100)·0.75.
		{"interpolated upper half", []float64{100, 700, 1024, 1300}, 25, 550},
		// h = 2.25 → 1024 + 276·0.25.
		{"interpolated lower half", []float64{100, 700, 1024, 1300}, 75, 1093},
		// g = 0.75 interpolates down from b: 0.4 − 0.3·0.25 = 0.325, while
		// 0.1 + 0.3·0.75 = 0.32500000000000007.
		{"g ≥ 0.5 starts from b", []float64{0.1, 0.4}, 75, 0.325},
		// g = 0.25 interpolates up from a: 0.1 + 0.9·0.25 = 0.325, while
		// 1 − 0.9·0.75 = 0.32499999999999996.
		{"g < 0.5 starts from a", []float64{0.1, 1}, 25, 0.325},
		// g = 0.5 belongs to the upper form: 2 − (2 − 1/3)·0.5 =
		// 1.1666666666666665, while 1/3 + (2 − 1/3)·0.5 = 1.1666666666666667.
		// (np.median of the same pair gives the latter; see below.)
		{"g = 0.5 starts from b", []float64{1.0 / 3, 2}, 50, 1.1666666666666665},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NumpyPercentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("NumpyPercentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}

	medians := []struct {
		name   string
		sorted []float64
		want   float64
	}{
		{"odd", []float64{1, 5, 9}, 5},
		{"even integers", []float64{100, 700, 1024, 1300}, 862},
		// np.median averages the middle pair: (1/3 + 2)/2 =
		// 1.1666666666666667; the 50th percentile's b − (b−a)·0.5 would be
		// 1.1666666666666665.
		{"even floats average the pair", []float64{1.0 / 3, 2}, 1.1666666666666667},
	}
	for _, tt := range medians {
		t.Run("median "+tt.name, func(t *testing.T) {
			if got := NumpyMedian(tt.sorted); got != tt.want {
				t.Errorf("NumpyMedian(%v) = %v, want %v", tt.sorted, got, tt.want)
			}
		})
	}
}

func TestComputeStats(t *testing.T) {
	if s := ComputeStats(nil); s != nil {
		t.Errorf("ComputeStats(nil) = %+v, want nil", s)
	}
	in := []float64{1300, 1024, 700, 100}
	got := ComputeStats(in)
	want := MetricStats{Mean: 781, StdDev: math.Sqrt(199683), Min: 100, P25: 550, Median: 862, P75: 1093, Max: 1300}
	if *got != want {
		t.Errorf("ComputeStats = %+v, want %+v", *got, want)
	}
	if in[0] != 1300 {
		t.Error("ComputeStats sorted its input in place")
	}
}

func TestExactMean(t *testing.T) {
	third := 1.0 / 3
	tests := []struct {
		name string
		x    []float64
		want float64
	}{
		{"empty is 0", nil, 0},
		{"exact", []float64{0, 1, 0.5}, 0.5},
		// 0.1+0.2+0.3 in floats is 0.6000000000000001, so the float mean
		// is 0.20000000000000004; the exact sum of the three doubles
		// divided by 3 rounds to 0.2.
		{"no intermediate rounding", []float64{0.1, 0.2, 0.3}, 0.2},
		// The exact sum is 1+2·tiny, where a float sum would give 1.
		{"tiny terms are kept", []float64{1, tiny, tiny}, (1 + 2*tiny) / 3},
		{"thirds", []float64{third, third, third}, third},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ExactMean(tt.x); got != tt.want {
				t.Errorf("ExactMean(%v) = %v, want %v", tt.x, got, tt.want)
			}
		})
	}
}

func TestDivide(t *testing.T) {
	tests := []struct {
		num, den int64
		want     float64
	}{
		{61194628, 3993, 15325.476584022039}, // avg_isl of the synthetic trace
		{1, 3, 1.0 / 3},
		// Beyond 2^53 converting num to float first would round twice:
		// float64(num)/939 is 463830094995404.6.
		{435536459200684905, 939, 463830094995404.56},
	}
	for _, tt := range tests {
		if got := divide(tt.num, tt.den); got != tt.want {
			t.Errorf("divide(%d, %d) = %v, want %v", tt.num, tt.den, got, tt.want)
		}
	}
}

// The expected strings are Python 3 repr() output. (FormatPyFloat was also
// compared with CPython's repr on 200,000 random doubles while writing it.)
func TestFormatPyFloat(t *testing.T) {
	tests := []struct {
		x    float64
		want string
	}{
		{0, "0.0"},
		{math.Copysign(0, -1), "-0.0"},
		{1, "1.0"},
		{891, "891.0"},
		{-2.5, "-2.5"},
		{0.1, "0.1"},
		{2306.5, "2306.5"},
		{0.42323532378348516, "0.42323532378348516"},
		{15325.476584022039, "15325.476584022039"},
		{0.0001, "0.0001"},
		{0.00012345, "0.00012345"},
		{0.00001, "1e-05"},
		{-0.000015, "-1.5e-05"},
		{1e15, "1000000000000000.0"},
		{9999999999999998, "9999999999999998.0"},
		{1e16, "1e+16"},
		{1.5e16, "1.5e+16"},
		{123456789012345680, "1.2345678901234568e+17"},
		{1e22, "1e+22"},
		{1e100, "1e+100"},
		{5e-324, "5e-324"},
		{math.MaxFloat64, "1.7976931348623157e+308"},
		{math.Inf(1), "inf"},
		{math.Inf(-1), "-inf"},
		{math.NaN(), "nan"},
	}
	for _, tt := range tests {
		if got := FormatPyFloat(tt.x); got != tt.want {
			t.Errorf("FormatPyFloat(%v) = %q, want %q", tt.x, got, tt.want)
		}
	}
}

func FuzzPyRepr(f *testing.F) {
	for _, x := range []float64{0, 1, 0.1, 1e-5, 1e16, 5e-324, math.MaxFloat64, 891, 2306.5} {
		f.Add(math.Float64bits(x))
	}
	f.Fuzz(func(t *testing.T, bits uint64) {
		x := math.Float64frombits(bits)
		s := FormatPyFloat(x)
		if math.IsNaN(x) {
			if s != "nan" {
				t.Fatalf("NaN formatted as %q", s)
			}
			return
		}
		back, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("FormatPyFloat(%v) = %q does not parse: %v", x, s, err)
		}
		if math.IsInf(x, 0) {
			if back != x {
				t.Fatalf("FormatPyFloat(%v) = %q", x, s)
			}
			return
		}
		if math.Float64bits(back) != bits {
			t.Fatalf("FormatPyFloat(%v) = %q reads back as %v", x, s, back)
		}
		// A float always shows it is one: a point or an exponent.
		if !strings.ContainsAny(s, ".e") {
			t.Fatalf("FormatPyFloat(%v) = %q has neither '.' nor 'e'", x, s)
		}
	})
}
