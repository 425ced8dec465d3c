package synth

import (
	"math"
	"math/big"
	"slices"
)

// The statistics here reproduce numpy 1.24 bit for bit, because the numbers
// printed by `analyze` must equal those of AIPerf's analyze-trace and Dynamo's
// datagen analyze, which call np.mean, np.std, np.percentile and np.median.
// The arithmetic order is therefore part of the contract: do not "simplify"
// it into a plain loop or a compensated sum.

// npBufferSize is numpy's default ufunc buffer size. A reduction is fed to
// the pairwise kernel in chunks of this many elements, and the chunk sums are
// added one after the other into the accumulator.
const npBufferSize = 8192

// NumpySum is np.sum (np.add.reduce) of a float64 array as numpy 1.24
// computes it.
func NumpySum(x []float64) float64 {
	acc := 0.0
	for len(x) > 0 {
		n := min(len(x), npBufferSize)
		acc += pairwiseSum(x[:n])
		x = x[n:]
	}
	return acc
}

// pairwiseSum is numpy's pairwise summation kernel for one buffer: short
// runs are summed left to right, medium ones with eight interleaved
// accumulators (numpy unrolls the loop this way), long ones split in two at
// a multiple of eight.
func pairwiseSum(x []float64) float64 {
	n := len(x)
	switch {
	case n < 8:
		s := 0.0
		for _, v := range x {
			s += v
		}
		return s
	case n <= 128:
		var r [8]float64
		copy(r[:], x[:8])
		i := 8
		for ; i < n-n%8; i += 8 {
			r[0] += x[i]
			r[1] += x[i+1]
			r[2] += x[i+2]
			r[3] += x[i+3]
			r[4] += x[i+4]
			r[5] += x[i+5]
			r[6] += x[i+6]
			r[7] += x[i+7]
		}
		s := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			s += x[i]
		}
		return s
	default:
		n2 := n / 2
		n2 -= n2 % 8
		return pairwiseSum(x[:n2]) + pairwiseSum(x[n2:])
	}
}

// NumpyMean is np.mean: the numpy sum divided by the count. NaN when x is
// empty, as numpy returns (with a warning).
func NumpyMean(x []float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	return NumpySum(x) / float64(len(x))
}

// NumpyStd is np.std with ddof=0 (population): the square root of the
// numpy mean of squared deviations from the numpy mean.
func NumpyStd(x []float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	mean := NumpyMean(x)
	sq := make([]float64, len(x))
	for i, v := range x {
		d := v - mean
		sq[i] = d * d
	}
	return math.Sqrt(NumpySum(sq) / float64(len(x)))
}

// NumpyPercentile is np.percentile(x, p) with the default "linear" method
// for x sorted ascending and non-empty; p is in [0, 100].
func NumpyPercentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	h := float64(n-1) * (p / 100)
	lo := math.Floor(h)
	i := int(lo)
	if i >= n-1 {
		return sorted[n-1]
	}
	return numpyLerp(sorted[i], sorted[i+1], h-lo)
}

// numpyLerp interpolates the way numpy ≥ 1.22 does: from a for the lower
// half of g and from b for the upper half, so that g = 1 yields b exactly.
// The two forms may differ in the last bit, so the choice matters.
func numpyLerp(a, b, g float64) float64 {
	d := b - a
	if g >= 0.5 {
		return b - d*(1-g)
	}
	return a + d*g
}

// NumpyMedian is np.median for x sorted ascending and non-empty. For an even
// count numpy takes np.mean of the middle pair, (a+b)/2, which is not always
// bit-equal to the 50th percentile's b−(b−a)·0.5.
func NumpyMedian(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return NumpyMean(sorted[n/2-1 : n/2+1])
}

// MetricStats summarises one list of values the way AIPerf's trace analyzer
// does.
type MetricStats struct {
	Mean   float64
	StdDev float64
	Min    float64
	P25    float64
	Median float64
	P75    float64
	Max    float64
}

// ComputeStats returns the statistics of values, or nil when it is empty.
// values is not modified.
func ComputeStats(values []float64) *MetricStats {
	if len(values) == 0 {
		return nil
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	return &MetricStats{
		Mean:   NumpyMean(values),
		StdDev: NumpyStd(values),
		Min:    sorted[0],
		P25:    NumpyPercentile(sorted, 25),
		Median: NumpyMedian(sorted),
		P75:    NumpyPercentile(sorted, 75),
		Max:    sorted[len(sorted)-1],
	}
}

// ExactMean is Python's statistics.mean of finite floats: the exact rational
// mean rounded once to the nearest float64. It is 0 for an empty slice, as
// AIPerf's cache_hit_rate is.
func ExactMean(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	// A big.Float with enough precision adds finite float64 values without
	// rounding: their bits span at most 2^1023 down to 2^-1074, and the sum
	// of n values needs log2(n) more bits on top.
	sum := new(big.Float).SetPrec(2200)
	var v big.Float
	for _, f := range x {
		sum.Add(sum, v.SetFloat64(f))
	}
	r, _ := sum.Rat(nil)
	r.Quo(r, new(big.Rat).SetInt64(int64(len(x))))
	f, _ := r.Float64()
	return f
}

// divide returns num/den rounded once to the nearest float64, as Python's
// int / int does, also for values beyond 2^53.
func divide(num, den int64) float64 {
	const exact = 1 << 53
	if num > -exact && num < exact && den > -exact && den < exact {
		return float64(num) / float64(den)
	}
	f, _ := new(big.Rat).SetFrac64(num, den).Float64()
	return f
}
