package synth

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/kvload-exporter/kvload-exporter/internal/rng"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// Arrival is how a shared-prefix workload's sessions arrive at its rate.
type Arrival string

// The arrival processes.
const (
	// ArrivalPoisson: exponential gaps, as a large population of
	// independent users gives.
	ArrivalPoisson Arrival = "poisson"
	// ArrivalConstant: one session every 1/rate seconds.
	ArrivalConstant Arrival = "constant"
)

// Arrivals lists the arrival processes, for validation and help texts.
var Arrivals = [...]Arrival{ArrivalPoisson, ArrivalConstant}

// Lengths is a token count drawn from a normal distribution; a draw below
// one token is drawn again, and a zero StdDev gives round(Mean) without a
// draw.
type Lengths struct {
	Mean, StdDev float64
}

// SharedPrefix describes the workload of AIPerf's KV-cache write-up (and
// vLLM's prefix_repetition, inference-perf's shared_prefix): a pool of
// Prefixes system prompts of PrefixTokens tokens each; Requests requests,
// each opening with a prefix picked uniformly from the pool, then
// InputTokens tokens of its own, answered with OutputTokens tokens. With
// Turns > 1 requests come in sessions of that many turns (the last session
// may be shorter): each turn's prompt is the previous turn's prompt, its
// answer and InputTokens new tokens, as in Mooncake traces, where a row
// holds its whole context. Sessions start at Rate a second.
type SharedPrefix struct {
	Prefixes     int     // P ≥ 1
	PrefixTokens int     // L ≥ 0
	Requests     int     // N ≥ 1 rows
	InputTokens  Lengths // per turn, after the prefix
	OutputTokens Lengths
	Turns        int     // ≥ 1; 1 = no sessions
	TurnDelay    float64 // ms from a turn's answer to the next turn (the rows' delay)
	Rate         float64 // sessions per second, > 0
	Arrival      Arrival // ArrivalPoisson when empty
	BlockSize    int     // tokens per hash block
	Seed         uint64
}

// Stream names of the shared-prefix generator: each random quantity has its
// own stream, so that changing the output lengths, say, moves no prefix
// choice and no arrival.
const (
	StreamSharedInputLen  = "shared_prefix.input_length"
	StreamSharedOutputLen = "shared_prefix.output_length"
	StreamSharedPrefix    = "shared_prefix.prefix_choice"
	StreamSharedArrival   = "shared_prefix.arrival"
)

// maxGeneratedTokens bounds a generated prompt: far above any context,
// far below what overflows the trace's columns. maxGeneratedRows bounds
// the rows: some 6 GB held as a trace table.
const (
	maxGeneratedTokens = 1 << 30
	maxGeneratedRows   = 1 << 27
)

// Validate reports every parameter out of range at once, named by
// name(key) with the configuration's keys (prefixes, prefix_tokens, ...).
func (s SharedPrefix) Validate(name func(key string) string) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s", name(key), fmt.Sprintf(format, args...)))
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if s.Prefixes < 1 {
		bad("prefixes", "must be at least 1, got %d", s.Prefixes)
	}
	if s.PrefixTokens < 0 || s.PrefixTokens > maxGeneratedTokens {
		bad("prefix_tokens", "must be from 0 to %d, got %d", maxGeneratedTokens, s.PrefixTokens)
	}
	if s.Requests < 1 || s.Requests > maxGeneratedRows {
		bad("requests", "must be from 1 to %d, got %d", maxGeneratedRows, s.Requests)
	}
	for _, kl := range []struct {
		key string
		l   Lengths
	}{{"input_tokens", s.InputTokens}, {"output_tokens", s.OutputTokens}} {
		key, l := kl.key, kl.l
		if !finite(l.Mean) || l.Mean < 1 || l.Mean > maxGeneratedTokens {
			bad(key+".mean", "must be from 1 to %d tokens, got %v", maxGeneratedTokens, l.Mean)
		}
		if !finite(l.StdDev) || l.StdDev < 0 {
			bad(key+".stddev", "must be a finite number ≥ 0, got %v", l.StdDev)
		}
	}
	if s.Turns < 1 {
		bad("turns", "must be at least 1, got %d", s.Turns)
	}
	if !finite(s.TurnDelay) || s.TurnDelay < 0 {
		bad("turn_delay", "must be ≥ 0, got %v ms", s.TurnDelay)
	}
	if !finite(s.Rate) || !(s.Rate > 0) {
		bad("rate", "must be a finite number of sessions per second > 0, got %v", s.Rate)
	}
	if s.Arrival != "" && !slices.Contains(Arrivals[:], s.Arrival) {
		bad("arrival", "%q is not one of poisson, constant", s.Arrival)
	}
	if s.BlockSize < 1 {
		bad("block_size", "must be > 0, got %d", s.BlockSize)
	}
	return errors.Join(errs...)
}

// GenerateSharedPrefix writes the rows of s, in session order, to emit. The
// same s gives the same rows.
//
// The hash_ids say what is shared and nothing else: block j of a prompt
// (tokens jB to (j+1)B) ends inside the prefix for j < ⌊L/B⌋ and has the
// prefix's id for j; a later full block lies in its session's own text,
// which every later turn repeats, and has the session's id for j; a prompt's
// partial last block is its own. Ids are numbered in order of first use.
// Requests whose prefix was already used hit ⌊L/B⌋ blocks in an infinite
// cache, and a later turn all the full blocks of the turn before.
func GenerateSharedPrefix(s SharedPrefix, emit func(*trace.Record) error) error {
	if err := s.Validate(func(key string) string { return key }); err != nil {
		return err
	}
	g := sharedGen{
		s:         s,
		inLen:     rng.New(s.Seed, StreamSharedInputLen),
		outLen:    rng.New(s.Seed, StreamSharedOutputLen),
		pick:      rng.New(s.Seed, StreamSharedPrefix),
		arrive:    rng.New(s.Seed, StreamSharedArrival),
		prefixIDs: make([][]int64, s.Prefixes),
	}
	rows := 0
	for session := 0; rows < s.Requests; session++ {
		turns := min(s.Turns, s.Requests-rows)
		if err := g.session(session, turns, emit); err != nil {
			return err
		}
		rows += turns
	}
	return nil
}

// sharedGen holds the generator's streams and the ids handed out so far.
type sharedGen struct {
	s                           SharedPrefix
	inLen, outLen, pick, arrive *rand.Rand
	prefixIDs                   [][]int64 // per prefix, its full blocks' ids
	next                        int64     // the next unused id
	at                          float64   // ms, the arrival of the last session
}

// session emits the turns of one session.
func (g *sharedGen) session(index, turns int, emit func(*trace.Record) error) error {
	s := g.s
	if index > 0 {
		if s.Arrival == ArrivalConstant {
			g.at = float64(index) * 1000 / s.Rate
		} else {
			g.at += g.arrive.ExpFloat64() * 1000 / s.Rate
		}
	}
	p := g.pick.IntN(s.Prefixes)
	var own []int64 // the session's full blocks past the prefix's
	length := s.PrefixTokens
	for turn := range turns {
		isl := length + draw(g.inLen, s.InputTokens)
		osl := draw(g.outLen, s.OutputTokens)
		if isl > maxGeneratedTokens {
			return fmt.Errorf("session %d turn %d: the prompt grows past %d tokens", index, turn+1, maxGeneratedTokens)
		}
		rec := trace.Record{InputLength: trace.Ptr(isl), OutputLength: trace.Ptr(osl)}
		rec.HashIDs, own = g.ids(p, own, isl)
		if turn == 0 {
			rec.Timestamp = trace.Ptr(math.Round(g.at*1000) / 1000) // whole µs
		} else if s.TurnDelay > 0 {
			rec.Delay = trace.Ptr(s.TurnDelay)
		}
		if s.Turns > 1 {
			rec.SessionID = trace.Ptr(fmt.Sprintf("session-%06d", index))
		}
		if err := emit(&rec); err != nil {
			return err
		}
		length = isl + osl
	}
	return nil
}

// ids returns the hash ids of a prompt of isl tokens opening with prefix p
// and, past the prefix's full blocks, the session's text, whose full
// blocks' ids own holds (and gains).
func (g *sharedGen) ids(p int, own []int64, isl int) (ids, _ []int64) {
	B := g.s.BlockSize
	shared := g.s.PrefixTokens / B
	n := trace.FittingIDs(isl, B)
	ids = make([]int64, 0, n)
	for j := range n {
		switch {
		case j < shared:
			if j == len(g.prefixIDs[p]) {
				g.prefixIDs[p] = append(g.prefixIDs[p], g.fresh())
			}
			ids = append(ids, g.prefixIDs[p][j])
		case (j+1)*B <= isl:
			if k := j - shared; k == len(own) {
				own = append(own, g.fresh())
			}
			ids = append(ids, own[j-shared])
		default: // a partial last block: this prompt's alone
			ids = append(ids, g.fresh())
		}
	}
	return ids, own
}

func (g *sharedGen) fresh() int64 {
	g.next++
	return g.next - 1
}

// draw is a length from l: a normal draw rounded, drawn again below one
// token; round(Mean) when StdDev is 0, without a draw.
func draw(r *rand.Rand, l Lengths) int {
	if l.StdDev == 0 {
		return max(1, int(math.Round(l.Mean)))
	}
	for {
		if v := math.Round(l.Mean + l.StdDev*r.NormFloat64()); v >= 1 {
			return int(min(v, maxGeneratedTokens))
		}
	}
}
