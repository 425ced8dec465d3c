package synth

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"

	"github.com/kvload-exporter/kvload-exporter/internal/rng"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// Lengths is a token count drawn from a normal distribution; a draw below
// one token is drawn again, and a zero StdDev gives round(Mean) without a
// draw. Its keys are those of a generated workload's input_tokens and
// output_tokens.
type Lengths struct {
	Mean   float64 `yaml:"mean"`
	StdDev float64 `yaml:"stddev,omitempty"`
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
//
// Its keys are those of a workload's generate block, whose block size and
// seed are the workload's and whose turn delay is a duration: those three
// have none here.
type SharedPrefix struct {
	Prefixes     int      `yaml:"prefixes"`      // P ≥ 1
	PrefixTokens int      `yaml:"prefix_tokens"` // L ≥ 0
	Requests     int      `yaml:"requests"`      // N ≥ 1 rows
	InputTokens  Lengths  `yaml:"input_tokens"`  // per turn, after the prefix
	OutputTokens Lengths  `yaml:"output_tokens"`
	Turns        int      `yaml:"turns,omitempty"`    // ≥ 1; 1 = no sessions
	TurnDelay    float64  `yaml:"-"`                  // ms from a turn's answer to the next turn (the rows' delay)
	Rate         float64  `yaml:"rate"`               // sessions per second, > 0
	Arrivals     Arrivals `yaml:"arrivals,omitempty"` // ArrivalsPoisson when empty
	BlockSize    int      `yaml:"-"`                  // tokens per hash block
	Seed         uint64   `yaml:"-"`
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

// Bounds of a shared-prefix workload, checked by Validate before anything
// is generated, so that no value can take the generator (or the daemon
// holding its rows) past a size told in advance.
const (
	// MaxRowTokens bounds a generated row's input and output lengths: the
	// most tokens the daemon sends in one request.
	MaxRowTokens = 1 << 24
	// MaxGeneratedRows bounds requests: some 3 GiB held as a trace table.
	MaxGeneratedRows = 1 << 27
	// MaxGeneratedIDs bounds the hash ids the generated rows hold at
	// worst (HeldIDs), which are most of their memory.
	MaxGeneratedIDs = 1 << 26
	// maxDrawSigmas caps a length draw at Mean + maxDrawSigmas·StdDev, so
	// that the longest prompt is known in advance; a normal draw beyond
	// it has odds under 10⁻¹⁵.
	maxDrawSigmas = 8
	// maxGapMeans caps a Poisson gap between sessions at maxGapMeans
	// mean gaps (odds of a longer one: e⁻⁴⁰), so that the last arrival is
	// known in advance.
	maxGapMeans = 40
	// MaxGeneratedSpan bounds, in seconds, the last session's arrival at
	// worst: 100 years, within what the replay's schedule holds.
	MaxGeneratedSpan = 100 * 365.25 * 24 * 3600
)

// Validate reports every parameter out of range at once, named by
// name(key) with the configuration's keys (prefixes, prefix_tokens, ...).
// Past each key's own range it checks what the rows will hold at worst:
// every row's lengths (MaxRowTokens), their hash ids (MaxGeneratedIDs) and
// the last arrival (MaxGeneratedSpan).
func (s SharedPrefix) Validate(name func(key string) string) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s", name(key), fmt.Sprintf(format, args...)))
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if s.Prefixes < 1 || s.Prefixes > MaxGeneratedRows {
		bad("prefixes", "must be from 1 to %d, got %d", MaxGeneratedRows, s.Prefixes)
	}
	if s.PrefixTokens < 0 || s.PrefixTokens >= MaxRowTokens {
		bad("prefix_tokens", "must be from 0 to %d (a request holds at most %d tokens), got %d", MaxRowTokens-1, MaxRowTokens, s.PrefixTokens)
	}
	if s.Requests < 1 || s.Requests > MaxGeneratedRows {
		bad("requests", "must be from 1 to %d, got %d", MaxGeneratedRows, s.Requests)
	}
	lengthsOK := true
	for _, kl := range []struct {
		key string
		l   Lengths
	}{{"input_tokens", s.InputTokens}, {"output_tokens", s.OutputTokens}} {
		key, l := kl.key, kl.l
		if !finite(l.Mean) || l.Mean < 1 || l.Mean > MaxRowTokens {
			bad(key+".mean", "must be from 1 to %d tokens, got %v", MaxRowTokens, l.Mean)
			lengthsOK = false
		}
		if !finite(l.StdDev) || l.StdDev < 0 || l.StdDev > MaxRowTokens {
			bad(key+".stddev", "must be from 0 to %d tokens, got %v", MaxRowTokens, l.StdDev)
			lengthsOK = false
		}
	}
	if s.Turns < 1 || s.Turns > MaxGeneratedRows {
		bad("turns", "must be from 1 to %d, got %d", MaxGeneratedRows, s.Turns)
	}
	if !finite(s.TurnDelay) || s.TurnDelay < 0 || s.TurnDelay > MaxGeneratedSpan*1000 {
		bad("turn_delay", "must be from 0 to 100 years, got %v ms", s.TurnDelay)
	}
	if !finite(s.Rate) || !(s.Rate > 0) {
		bad("rate", "must be a finite number of sessions per second > 0, got %v", s.Rate)
	}
	if err := s.Arrivals.Validate(); err != nil {
		bad("arrivals", "%v", err)
	}
	if s.BlockSize < 1 {
		bad("block_size", "must be > 0, got %d", s.BlockSize)
	}
	if len(errs) > 0 || !lengthsOK {
		return errors.Join(errs...) // what follows assumes each key in range
	}
	if out := s.OutputTokens.max(); out > MaxRowTokens {
		bad("output_tokens", "draws up to %.0f tokens (mean + %d stddev), more than the %d a request holds", out, maxDrawSigmas, MaxRowTokens)
	}
	if isl := s.longestPrompt(); isl > MaxRowTokens {
		bad("prefix_tokens", "with turns, input_tokens and output_tokens makes prompts of up to %.0f tokens, more than the %d a request holds", isl, MaxRowTokens)
	}
	if ids := s.HeldIDs(); ids > MaxGeneratedIDs {
		bad("requests", "with prefix_tokens, input_tokens, turns and the block size makes rows holding up to %.3g hash ids, more than %d: fewer requests or tokens, or a larger block_size", ids, MaxGeneratedIDs)
	}
	if span := s.LastArrival(); span > MaxGeneratedSpan {
		bad("rate", "%v sessions a second spread the sessions over up to %.3g years, more than 100: a higher rate or fewer requests", s.Rate, span/(365.25*24*3600))
	}
	return errors.Join(errs...)
}

// max is the longest draw from l.
func (l Lengths) max() float64 {
	return max(1, math.Round(l.Mean+maxDrawSigmas*l.StdDev))
}

// mean is the mean draw from l (a draw below one token is drawn again:
// ignored here).
func (l Lengths) mean() float64 { return max(1, math.Round(l.Mean)) }

// sessions is the number of sessions and the turns of the last one.
func (s SharedPrefix) sessions() (n, lastTurns int) {
	n = (s.Requests + s.Turns - 1) / s.Turns
	return n, s.Requests - (n-1)*s.Turns
}

// LongestRow is the longest input and output lengths a row can have.
func (s SharedPrefix) LongestRow() (input, output float64) {
	return s.longestPrompt(), s.OutputTokens.max()
}

// longestPrompt is the longest input length a row can have: a session's
// last turn holds the prefix, every turn's input and every earlier answer.
func (s SharedPrefix) longestPrompt() float64 {
	t := float64(min(s.Turns, s.Requests))
	return float64(s.PrefixTokens) + t*s.InputTokens.max() + (t-1)*s.OutputTokens.max()
}

// HeldIDs is the most hash ids the rows can hold together, with every
// draw at its longest: a row of n tokens holds ⌈n/B⌉.
func (s SharedPrefix) HeldIDs() float64 {
	return s.heldIDs(s.InputTokens.max(), s.OutputTokens.max())
}

// heldIDs is the ids of the rows with every input and output draw at in
// and out tokens.
func (s SharedPrefix) heldIDs(in, out float64) float64 {
	n, last := s.sessions()
	B := float64(s.BlockSize)
	// turns(k): the ids of a session of k turns, each row's ⌈isl/B⌉ taken
	// as isl/B + 1.
	turns := func(k float64) float64 {
		return k*(float64(s.PrefixTokens)/B+1) + in/B*k*(k+1)/2 + out/B*k*(k-1)/2
	}
	return float64(n-1)*turns(float64(s.Turns)) + turns(float64(last))
}

// MeanIDs is the hash ids the rows hold with every draw at its mean: what
// the rows hold in practice, for a memory estimate.
func (s SharedPrefix) MeanIDs() float64 {
	return s.heldIDs(s.InputTokens.mean(), s.OutputTokens.mean())
}

// LastArrival is the latest the last session can arrive, in seconds after
// the first.
func (s SharedPrefix) LastArrival() float64 {
	n, _ := s.sessions()
	gap := 1 / s.Rate
	if s.Arrivals != ArrivalsConstant {
		gap *= maxGapMeans
	}
	return float64(n-1) * gap
}

// GenerateSharedPrefix writes the rows of s, in session order, to emit. The
// same s gives the same rows.
//
// The hash_ids say what is shared and nothing else: block j of a prompt
// (tokens jB to (j+1)B) ends inside the prefix for j < ⌊L/B⌋ and has the
// prefix's id for j; a later full block lies in its session's own text,
// which every later turn repeats, and has the session's id for j; a prompt's
// partial last block is its own. Requests whose prefix was already used hit
// ⌊L/B⌋ blocks in an infinite cache, and a later turn all the full blocks of
// the turn before.
//
// Block j of prefix p has id p·⌊L/B⌋ + j, whether or not p is drawn, so
// that its text (made from the seed and the id) is the same for every
// choice of the other parameters' lengths, requests and turns; the other
// ids are numbered from P·⌊L/B⌋ in order of first use.
func GenerateSharedPrefix(s SharedPrefix, emit func(*trace.Record) error) error {
	if err := s.Validate(func(key string) string { return key }); err != nil {
		return err
	}
	g := sharedGen{
		s:      s,
		inLen:  rng.New(s.Seed, StreamSharedInputLen),
		outLen: rng.New(s.Seed, StreamSharedOutputLen),
		pick:   rng.New(s.Seed, StreamSharedPrefix),
		arrive: rng.New(s.Seed, StreamSharedArrival),
		next:   int64(s.Prefixes) * int64(s.PrefixTokens/s.BlockSize),
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
	next                        int64   // the next unused id past the prefixes'
	at                          float64 // ms, the arrival of the last session
}

// session emits the turns of one session.
func (g *sharedGen) session(index, turns int, emit func(*trace.Record) error) error {
	s := g.s
	if index > 0 {
		if s.Arrivals == ArrivalsConstant {
			g.at = float64(index) * 1000 / s.Rate
		} else {
			g.at += min(g.arrive.ExpFloat64(), maxGapMeans) * 1000 / s.Rate
		}
	}
	p := g.pick.IntN(s.Prefixes)
	var own []int64 // the session's full blocks past the prefix's
	length := s.PrefixTokens
	for turn := range turns {
		isl := length + draw(g.inLen, s.InputTokens)
		osl := draw(g.outLen, s.OutputTokens)
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
			ids = append(ids, int64(p)*int64(shared)+int64(j))
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
// token, at most l.max(); round(Mean) when StdDev is 0, without a draw.
func draw(r *rand.Rand, l Lengths) int {
	if l.StdDev == 0 {
		return max(1, int(math.Round(l.Mean)))
	}
	for {
		if v := math.Round(l.Mean + l.StdDev*r.NormFloat64()); v >= 1 {
			return int(min(v, l.max()))
		}
	}
}

// UnsharedPrefixWarning says, when each prefix is shorter than the block it
// is written at, that the requests share nothing, and suggests a block size
// that would share, naming the block size by blockKey (a flag or a
// configuration key); it is "" otherwise. Only whole blocks get a prefix's ids, so such prefixes
// give the requests no common id, their prompts no common text, and every
// hit rate reads 0.
func (s SharedPrefix) UnsharedPrefixWarning(blockKey string) string {
	if s.PrefixTokens <= 0 || s.BlockSize <= s.PrefixTokens {
		return ""
	}
	suggest := SharingBlockSize(s.PrefixTokens)
	return fmt.Sprintf("the %d-token prefixes are shorter than %s (%d tokens), so the requests share no block of them and every cache hit rate reads 0: "+
		"a %s of %d (the largest power of two not above %d) shares %d tokens of each; "+
		"an engine caches whole blocks of its own, so a prefix shorter than the target's cache block (16 on vLLM) is not served either",
		s.PrefixTokens, blockKey, s.BlockSize, blockKey, suggest, s.PrefixTokens, s.PrefixTokens/suggest*suggest)
}

// SharingBlockSize is the block size suggested for prefixes of n ≥ 1
// tokens: the largest power of two not above n, as block sizes are. It
// shares more than half of each prefix, all of it when n is a power of
// two.
func SharingBlockSize(n int) int {
	return 1 << (bits.Len(uint(n)) - 1)
}
