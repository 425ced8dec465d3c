// Package costfit estimates what a prompt token that an ideal cache would
// serve costs a target, against one it must compute: a robust linear fit of
// each request's prefill time (or, where the engine reports none, its time
// to first token) on its theoretical uncached and cached prompt tokens,
// over a sliding window of recent requests. When the cache works, cached
// tokens are nearly free and the ratio of the two costs is near 0; when it
// does not, they cost what the others cost and the ratio is near 1. Where
// the requests cannot tell the two apart (too few, too alike, or timed
// mostly by a queue), the estimate says why instead of giving a number.
//
// It needs nothing from the server but a time, so it also covers targets
// that report no cached tokens.
package costfit

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/stat"
)

// Sample is one successful request: its theoretical uncached and cached
// prompt tokens and how long its prefill took, in seconds.
type Sample struct {
	Uncached, Cached float64
	Seconds          float64
}

// State is what a fit could say: a ratio, or why not.
type State string

// The states of a fit; all but Decided export no ratio.
const (
	// Decided: the ratio is known well enough to act on.
	Decided State = "decided"
	// TooFewRequests: fewer requests in the window than Limits.MinRequests.
	TooFewRequests State = "too_few_requests"
	// TooLittleSpread: the requests' uncached or cached tokens vary too
	// little, or vary together, to tell their costs apart.
	TooLittleSpread State = "too_little_spread"
	// NoUncachedCost: an uncached token is not clearly dearer than
	// nothing, so there is no cost to compare a cached one with (the time
	// is mostly something else, such as a queue).
	NoUncachedCost State = "no_uncached_cost"
	// TooUncertain: the ratio's standard error exceeds
	// Limits.MaxRatioStdErr.
	TooUncertain State = "too_uncertain"
)

// States lists every state, for exporting each as a series.
var States = [...]State{Decided, TooFewRequests, TooLittleSpread, NoUncachedCost, TooUncertain}

// Limits are the conditions a fit must meet to be Decided.
type Limits struct {
	// MinRequests is the fewest requests a fit is tried on.
	MinRequests int
	// MinSpreadTokens is the least standard deviation, in tokens, of both
	// the uncached and the cached tokens of the requests.
	MinSpreadTokens float64
	// MaxCorrelation bounds how closely the uncached and cached tokens may
	// move together (in absolute value): beyond it their costs are one.
	MaxCorrelation float64
	// MinUncachedT is how many standard errors above zero the cost of an
	// uncached token must be.
	MinUncachedT float64
	// MaxRatioStdErr is the largest standard error of the ratio that is
	// still Decided.
	MaxRatioStdErr float64
}

// DefaultLimits are the limits the exporter uses.
var DefaultLimits = Limits{
	MinRequests:     32,
	MinSpreadTokens: 32,
	MaxCorrelation:  0.98,
	MinUncachedT:    4,
	MaxRatioStdErr:  0.25,
}

// Estimate is the outcome of a fit.
type Estimate struct {
	State    State
	Requests int
	// Ratio is the cost of a cached prompt token over that of an uncached
	// one; NaN unless State is Decided.
	Ratio float64
	// RatioStdErr is Ratio's standard error (delta method on the fit's
	// covariance); NaN where the uncached cost is not established.
	RatioStdErr float64
	// PerUncached and PerCached are the fitted seconds per uncached and per
	// cached token, Intercept the seconds every request takes; NaN where
	// no fit was made.
	Intercept, PerUncached, PerCached float64
}

// undecided is an Estimate of n requests with nothing fitted.
func undecided(s State, n int) Estimate {
	nan := math.NaN()
	return Estimate{State: s, Requests: n, Ratio: nan, RatioStdErr: nan, Intercept: nan, PerUncached: nan, PerCached: nan}
}

// Fit estimates the ratio from samples:
//
//	seconds ≈ intercept + PerUncached·uncached + PerCached·cached
//
// fitted by Huber's M-estimator (iteratively reweighted least squares), so
// that a few requests slowed by something else (a hiccup, a long decode
// ahead) do not move it. samples are in the order the requests were sent:
// residuals that follow each other from one request to the next, as a
// queue's waits do, widen the standard errors (serialInflation). Its cost
// is linear in len(samples).
func Fit(samples []Sample, lim Limits) Estimate {
	n := len(samples)
	if n < max(lim.MinRequests, 4) {
		return undecided(TooFewRequests, n)
	}
	xu, xc, y := make([]float64, n), make([]float64, n), make([]float64, n)
	for i, s := range samples {
		xu[i], xc[i], y[i] = s.Uncached, s.Cached, s.Seconds
	}
	muU, sdU := stat.MeanStdDev(xu, nil)
	muC, sdC := stat.MeanStdDev(xc, nil)
	if !(sdU >= lim.MinSpreadTokens && sdC >= lim.MinSpreadTokens) ||
		math.Abs(stat.Correlation(xu, xc, nil)) > lim.MaxCorrelation {
		return undecided(TooLittleSpread, n)
	}
	// Standardised columns keep the normal equations well conditioned
	// whatever the prompt lengths.
	x := mat.NewDense(n, 3, nil)
	for i := range n {
		x.Set(i, 0, 1)
		x.Set(i, 1, (xu[i]-muU)/sdU)
		x.Set(i, 2, (xc[i]-muC)/sdC)
	}
	beta, cov, ok := huberFit(x, mat.NewVecDense(n, y))
	if !ok {
		return undecided(TooLittleSpread, n)
	}
	e := undecided(NoUncachedCost, n)
	e.PerUncached, e.PerCached = beta.AtVec(1)/sdU, beta.AtVec(2)/sdC
	e.Intercept = beta.AtVec(0) - e.PerUncached*muU - e.PerCached*muC
	varU := cov.At(1, 1) / (sdU * sdU)
	varC := cov.At(2, 2) / (sdC * sdC)
	covUC := cov.At(1, 2) / (sdU * sdC)
	if !(e.PerUncached > 0) || e.PerUncached < lim.MinUncachedT*math.Sqrt(varU) {
		return e
	}
	r := e.PerCached / e.PerUncached
	e.RatioStdErr = math.Sqrt(max(varC-2*r*covUC+r*r*varU, 0)) / e.PerUncached
	if !(e.RatioStdErr <= lim.MaxRatioStdErr) {
		e.State = TooUncertain
		return e
	}
	e.State, e.Ratio = Decided, r
	return e
}

// Huber's tuning constant: 95 % efficiency when the errors are normal.
const huberK = 1.345

// The reweighting stops after huberMaxIter rounds, or once no coefficient
// moves by more than huberTol of its size.
const (
	huberMaxIter = 50
	huberTol     = 1e-6
)

// huberFit fits y ≈ x·beta by Huber's M-estimator with the residuals'
// scale re-estimated each round (median absolute residual), and returns
// beta with its covariance (Huber's first correction, as statsmodels' H1).
// ok is false where the weighted normal equations are singular.
func huberFit(x *mat.Dense, y *mat.VecDense) (beta *mat.VecDense, cov *mat.SymDense, ok bool) {
	n, p := x.Dims()
	ws := newLeastSquares(n, p)
	w := make([]float64, n)
	for i := range w {
		w[i] = 1
	}
	beta = mat.NewVecDense(p, nil)
	if !ws.solve(x, y, w, beta) {
		return nil, nil, false
	}
	next := mat.NewVecDense(p, nil)
	resid := mat.NewVecDense(n, nil)
	abs := make([]float64, n)
	var s float64
	for range huberMaxIter {
		s = residualsAndScale(x, y, beta, resid, abs)
		for i := range n {
			w[i] = huberWeight(resid.AtVec(i) / s)
		}
		if !ws.solve(x, y, w, next) {
			return nil, nil, false
		}
		converged := true
		for j := range p {
			if math.Abs(next.AtVec(j)-beta.AtVec(j)) > huberTol*(1+math.Abs(beta.AtVec(j))) {
				converged = false
			}
		}
		beta, next = next, beta
		if converged {
			break
		}
	}
	s = residualsAndScale(x, y, beta, resid, abs)
	cov, ok = huberCovariance(x, resid, s)
	if !ok {
		return nil, nil, false
	}
	cov.ScaleSym(serialInflation(resid, s), cov)
	return beta, cov, true
}

// maxSerial caps the residuals' serial correlation serialInflation uses.
const maxSerial = 0.99

// serialInflation is how much the residuals' correlation from one request
// to the next (in send order) inflates the fit's variance: (1+ρ)/(1−ρ)
// for a lag-1 correlation ρ > 0 of their ψ, 1 otherwise. Requests timed
// by a queue are not independent evidence: one waits about as long as the
// one sent before it, and a queue that fills while the mix of prompts
// drifts reads as a cost of the prompts. This is the variance of a mean
// of such errors, an upper bound for coefficients of regressors that are
// not themselves correlated in time: it errs towards undecided.
func serialInflation(resid *mat.VecDense, s float64) float64 {
	psi := func(i int) float64 { return math.Max(-huberK, math.Min(huberK, resid.AtVec(i)/s)) }
	var num, den float64
	for i := range resid.Len() {
		p := psi(i)
		den += p * p
		if i > 0 {
			num += p * psi(i-1)
		}
	}
	if !(den > 0) {
		return 1
	}
	rho := min(num/den, maxSerial)
	if rho <= 0 {
		return 1
	}
	return (1 + rho) / (1 - rho)
}

// residualsAndScale writes y − x·beta into resid and returns their robust
// scale: the median absolute residual over 0.6745 (the standard deviation
// for normal errors), never quite zero so that an exact fit divides. abs
// is scratch space of resid's length.
func residualsAndScale(x *mat.Dense, y, beta, resid *mat.VecDense, abs []float64) float64 {
	resid.MulVec(x, beta)
	resid.SubVec(y, resid)
	n := resid.Len()
	var sumY float64
	for i := range n {
		abs[i] = math.Abs(resid.AtVec(i))
		sumY += math.Abs(y.AtVec(i))
	}
	slices.Sort(abs)
	s := stat.Quantile(0.5, stat.Empirical, abs, nil) / 0.6745
	return max(s, 1e-12*(1+sumY/float64(n)))
}

func huberWeight(u float64) float64 {
	if a := math.Abs(u); a > huberK {
		return huberK / a
	}
	return 1
}

// leastSquares holds the scratch space of weighted least-squares solves
// of one size, reused across the rounds of a fit.
type leastSquares struct {
	xw     *mat.Dense
	yw     *mat.VecDense
	normal mat.SymDense
	rhs    mat.VecDense
	chol   mat.Cholesky
}

func newLeastSquares(n, p int) *leastSquares {
	return &leastSquares{xw: mat.NewDense(n, p, nil), yw: mat.NewVecDense(n, nil)}
}

// solve writes into beta the solution of the normal equations of the rows
// of x and y weighted by w. It returns false where they are singular or
// nearly so.
func (ls *leastSquares) solve(x *mat.Dense, y *mat.VecDense, w []float64, beta *mat.VecDense) bool {
	n, p := x.Dims()
	for i := range n {
		sw := math.Sqrt(w[i])
		for j := range p {
			ls.xw.Set(i, j, sw*x.At(i, j))
		}
		ls.yw.SetVec(i, sw*y.AtVec(i))
	}
	ls.normal.SymOuterK(1, ls.xw.T())
	if !ls.chol.Factorize(&ls.normal) || ls.chol.Cond() > 1e12 {
		return false
	}
	ls.rhs.MulVec(ls.xw.T(), ls.yw)
	return ls.chol.SolveVecTo(beta, &ls.rhs) == nil
}

// huberCovariance is the covariance of a Huber fit with residuals resid
// at scale s: K² · Σψ(u)²/(n−p) / m² · s² · (XᵀX)⁻¹, where u are the
// scaled residuals, m the share of them inside the tuning constant and
// K = 1 + p/n · Var(ψ′)/m² corrects for the sample's size.
func huberCovariance(x *mat.Dense, resid *mat.VecDense, s float64) (*mat.SymDense, bool) {
	n, p := x.Dims()
	var sumPsi2, inside float64
	for i := range n {
		u := resid.AtVec(i) / s
		psi := math.Max(-huberK, math.Min(huberK, u))
		sumPsi2 += psi * psi
		if math.Abs(u) <= huberK {
			inside++
		}
	}
	m := inside / float64(n)
	if m == 0 || n <= p {
		return nil, false
	}
	k := 1 + float64(p)/float64(n)*(m-m*m)/(m*m)
	scale := k * k * sumPsi2 / float64(n-p) / (m * m) * s * s
	var xtx, inv mat.SymDense
	xtx.SymOuterK(1, x.T())
	var chol mat.Cholesky
	if !chol.Factorize(&xtx) {
		return nil, false
	}
	if err := chol.InverseTo(&inv); err != nil {
		return nil, false
	}
	inv.ScaleSym(scale, &inv)
	return &inv, true
}
