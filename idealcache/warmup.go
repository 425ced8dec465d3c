package idealcache

import (
	"math"
	"slices"
)

// A model started mid-run warms up on the rows of the fleet's schedule
// before its start, assumed sent. Whether they really reached the server
// is a fact about the server, not the schedule: an exporter restarted next
// to an engine that kept running finds them there, one started next to a
// fresh engine does not. Until that is known, a request whose modelled hit
// rests on an assumed block is unknown, and with loop repeat on a large
// cache that is nearly every request of the pass the model starts in.
//
// The server's own answers tell the two apart. For such a request the
// model has two theoretical values: warm (the assumed blocks are there)
// and cold (only blocks really sent since the start count). Where they
// differ by enough, the cached tokens the server reported sit near one of
// them. Enough such requests with a clear majority by tokens decide for
// the whole model: warm counts every assumed block as sent, cold leaves
// them all out, and later answers are known; so are those of requests
// simulated before the decision, which kept both values.
//
// Warm and cold are the two ends of one scale. A replica restarted next to
// an engine that the replica before it fed for only part of the warm-up
// (it joined a pass late and stopped at its end, say) finds the engine
// holding what the fleet sent from some row on, up to this start: the
// frontier. (Rows that nobody sent between that stop and this start do
// not fit it; a restart of seconds in a pass of hours leaves few.) A block is
// then held if the last warm-up row that touched it is at or after the
// frontier; along a prompt's blocks those last touches only grow older (a
// row that touches a block touches the blocks before it), so the server's
// hit ends at the first assumed block last touched before the frontier.
// Each request records where its hit would end for every frontier (its
// steps); an answer names the frontiers it agrees with, and the frontier
// that enough answers agree on by a clear majority is decided: warm is the
// frontier at the warm-up's first row, cold the one past its last, and
// any other is partial. A request is known once a frontier is decided, its
// answer being where its own steps end at that frontier.
//
// Why this judges the engine and does not merely echo it: the frontier is
// one number for the whole model, fitted to the answers of many requests,
// and a request's value follows from it and from the schedule alone. An
// engine that lost blocks it should hold (a cache smaller than modelled)
// keeps losing them after the fit, on rows the fit never saw, and reads
// below the model. Taking each request's own answer as the truth of its
// blocks would instead count every request at an efficiency of one.
//
// The blocks keep their mark after the decision, so that later answers go
// on weighing it: a server whose answers fit no one frontier (the exporter
// before this one dropped every other row) gives mixed answers, and the
// decision is taken back when they leave no clear majority. While the mark
// stands, the cache answers exactly as one whose assumed blocks last
// touched before the frontier were taken out: blocks only assumed are
// touched by no real row, so they sit behind every other block in LRU
// order, those before the frontier behind the rest, and a bounded cache
// evicts them first.

const (
	// warmUpMinGap: a request is evidence only where its warm and cold
	// values differ by at least this many tokens. The server's answer
	// is compared with bands of a quarter of the gap, which then hold
	// the few tokens every prompt shares on some engines (llama.cpp's
	// BOS and chat header: the preamble, at most 64 tokens, see package
	// servedcache) and the block rounding of a chat template's header.
	warmUpMinGap = 256
	// warmUpMinRequests: requests that pointed one way or the other
	// before anything is decided.
	warmUpMinRequests = 8
	// warmUpMajority: the least share, of the tokens at stake (warm
	// minus cold) in every request that pointed somewhere, of those
	// pointing to the world decided.
	warmUpMajority = 0.9
	// warmUpMaxEvidence: the answers weighed at most, the latest; each is
	// a range of frontiers and its weight.
	warmUpMaxEvidence = 1024
	// frontierCold is the frontier past every row of the warm-up.
	frontierCold = math.MaxUint64
)

// WarmUpWorld is what the server holds of the rows a model only assumed
// sent.
type WarmUpWorld int

// Warm-up worlds.
const (
	// WarmUpUndecided: not known (yet, or the answers are mixed); hits
	// resting on those rows are unknown.
	WarmUpUndecided WarmUpWorld = iota
	// WarmUpWarm: the rows reached the server (another exporter, or this
	// one before a restart, sent them): they count as sent.
	WarmUpWarm
	// WarmUpCold: they did not (a fresh or restarted engine): only what
	// was really sent since the start counts.
	WarmUpCold
	// WarmUpPartial: the rows from a point of the warm-up on reached the
	// server (the exporter before this one sent only those): they count
	// as sent, and the rows before that point do not.
	WarmUpPartial
)

func (w WarmUpWorld) String() string {
	switch w {
	case WarmUpWarm:
		return "warm"
	case WarmUpCold:
		return "cold"
	case WarmUpPartial:
		return "partial"
	}
	return "undecided"
}

// WarmUpDecision is a change of what a model holds of its warm-up, and the
// evidence it rests on.
type WarmUpDecision struct {
	World WarmUpWorld
	// Warm, Cold and Partial are how many of the answers weighed pointed
	// to each world, WarmShare the warm ones' share of the tokens at
	// stake and Agreeing the share of those that agree with World.
	Warm, Cold, Partial int
	WarmShare, Agreeing float64
	// Abstained is how many answers were evidence but sat between the
	// two values, near neither.
	Abstained int
}

// WarmUp is a model's evidence of what the server holds of its warm-up: the
// answers of the server (Weigh), and what it decided from them (World,
// Answer). The zero value weighs nothing; set Learn to weigh answers. It is
// not safe for concurrent use.
type WarmUp struct {
	// Learn makes Weigh take answers as evidence; without it nothing is
	// ever decided.
	Learn bool
	world WarmUpWorld
	// frontier: the server holds the assumed blocks last touched at or
	// after this visit of the warm-up (0 when warm, frontierCold when
	// cold); meaningful once world is decided.
	frontier uint64

	evidence  []warmEvidence // the latest warmUpMaxEvidence answers
	abstained int
	edges     []frontierEdge // decide's scratch
}

// frontierEdge is where an answer's range of frontiers starts (weight > 0)
// or ends (weight < 0).
type frontierEdge struct {
	at     uint64
	weight int
}

// warmStep is where a request's hit ends when the frontier lies past
// touched: at tokens, the cached tokens of the blocks before the first
// assumed block last touched at touched (or earlier).
type warmStep struct {
	touched uint64
	tokens  int
}

// warmEvidence is an answer: the frontiers in [from, to) agree with it,
// with weight the tokens at stake (warm minus cold).
type warmEvidence struct {
	from, to uint64
	weight   int
}

// heldFrom is a's cached tokens on a server holding the assumed blocks
// last touched at or after frontier.
func (a Admission) heldFrom(frontier uint64) int {
	for _, s := range a.warmSteps() {
		if s.touched < frontier {
			return s.tokens
		}
	}
	return a.Tokens
}

// warmSteps are a's steps; a request simulated without them (as in tests)
// has one, at its cold value.
func (a Admission) warmSteps() []warmStep {
	if len(a.steps) == 0 {
		return []warmStep{{tokens: a.Cold}}
	}
	return a.steps
}

// Answer is the theoretical cached tokens of a visit of a request of this
// replica, and whether they are known.
func (w *WarmUp) Answer(a Admission) (int, bool) {
	switch {
	case a.Tokens == a.Cold:
		return a.Tokens, true
	case w.world == WarmUpUndecided:
		return a.Tokens, false
	}
	return a.heldFrom(w.frontier), true
}

// Weigh takes the server's cached tokens for a, the visit of a request, as
// evidence, and returns the decision when this answer changed it.
func (w *WarmUp) Weigh(a Admission, cached int) *WarmUpDecision {
	gap := a.Tokens - a.Cold
	if !w.Learn || gap < warmUpMinGap {
		return nil
	}
	from, to, ok := a.agreeing(cached)
	if !ok {
		w.abstained++
		return nil
	}
	if len(w.evidence) == warmUpMaxEvidence {
		w.evidence = append(w.evidence[:0], w.evidence[1:]...)
	}
	w.evidence = append(w.evidence, warmEvidence{from: from, to: to, weight: gap})
	world, frontier, d := w.decide()
	if world == w.world {
		w.frontier = frontier // a partial frontier may move; no news
		return nil
	}
	w.world, w.frontier = world, frontier
	return &d
}

// agreeing is the range of frontiers [from, to) that the server's answer
// cached agrees with, and false when it agrees with none clearly. The
// values a's hit takes at each frontier are compared with bands of a
// quarter of the gaps between them, so that the few tokens every prompt
// shares on some engines, and a chat header's rounding, stay inside;
// values closer than warmUpMinGap cannot be told apart and are taken
// together.
func (a Admission) agreeing(cached int) (from, to uint64, ok bool) {
	// The values in increasing order, each with its frontiers: cut at the
	// first step (cold: every frontier past the first step's touch), at
	// each later step, and nowhere (warm: up to the last step's touch).
	type value struct {
		lo, hi   int
		from, to uint64
	}
	steps := a.warmSteps()
	values := make([]value, 0, len(steps)+1)
	add := func(tokens int, from, to uint64) {
		if n := len(values); n > 0 && tokens-values[n-1].hi < warmUpMinGap {
			values[n-1].hi, values[n-1].from = tokens, from
			return
		}
		values = append(values, value{lo: tokens, hi: tokens, from: from, to: to})
	}
	to = frontierCold
	for _, s := range steps {
		add(s.tokens, s.touched+1, to)
		to = s.touched + 1
	}
	add(a.Tokens, 0, to)
	if len(values) < 2 {
		return 0, 0, false
	}
	for i, v := range values {
		below, above := math.MinInt, math.MaxInt
		if i > 0 {
			below = v.lo - (v.lo-values[i-1].hi)/4
		}
		if i < len(values)-1 {
			above = v.hi + (values[i+1].lo-v.hi)/4
		}
		if cached >= below && cached <= above {
			return v.from, v.to, true
		}
	}
	return 0, 0, false
}

// decide is the world and frontier the evidence so far points to, and the
// decision it makes: the frontier that the most answers by tokens agree
// with, if they are a clear majority (warm where it is among those, else
// cold, else the oldest such frontier, which needs warmUpMinRequests
// answers against each end); else warm or cold where a clear majority
// agrees with it. A few answers between warm and cold (a chat header's
// blocks, a block the engine kept from elsewhere) do not then pin a cold
// engine to a partial frontier.
func (w *WarmUp) decide() (WarmUpWorld, uint64, WarmUpDecision) {
	d := WarmUpDecision{Abstained: w.abstained}
	total, warmTokens := 0, 0
	edges := w.edges[:0]
	defer func() { w.edges = edges[:0] }()
	for _, e := range w.evidence {
		total += e.weight
		switch {
		case e.from == 0:
			d.Warm++
			warmTokens += e.weight
		case e.to == frontierCold:
			d.Cold++
		default:
			d.Partial++
		}
		edges = append(edges, frontierEdge{e.from, e.weight})
		if e.to != frontierCold {
			edges = append(edges, frontierEdge{e.to, -e.weight})
		}
	}
	d.WarmShare = float64(warmTokens) / float64(max(total, 1))
	if len(w.evidence) < warmUpMinRequests {
		return WarmUpUndecided, 0, d
	}
	// Sweep the frontiers in order: agree[f] is the weight of the answers
	// whose range holds f; the first frontier of the best run is kept.
	slices.SortFunc(edges, func(a, b frontierEdge) int {
		if a.at != b.at {
			if a.at < b.at {
				return -1
			}
			return 1
		}
		return a.weight - b.weight
	})
	best, bestAt, agree := -1, uint64(0), 0
	var warmAgree, coldAgree int
	for i, e := range edges {
		agree += e.weight
		if i+1 < len(edges) && edges[i+1].at == e.at {
			continue
		}
		if e.at == 0 {
			warmAgree = agree
		}
		if agree > best {
			best, bestAt = agree, e.at
		}
	}
	if len(edges) == 0 || edges[0].at != 0 {
		warmAgree = 0
	}
	coldAgree = agree // past every edge: the answers open to the top
	share := func(agree int) float64 { return float64(agree) / float64(total) }
	// A partial frontier needs answers against each end: enough that
	// the warm end cannot be, and enough that the cold end cannot be.
	partial := d.Warm+d.Partial >= warmUpMinRequests && d.Cold+d.Partial >= warmUpMinRequests
	switch {
	case share(best) >= warmUpMajority && warmAgree == best:
		d.World, d.Agreeing = WarmUpWarm, share(best)
		return WarmUpWarm, 0, d
	case share(best) >= warmUpMajority && coldAgree == best:
		d.World, d.Agreeing = WarmUpCold, share(best)
		return WarmUpCold, frontierCold, d
	case share(best) >= warmUpMajority && partial:
		d.World, d.Agreeing = WarmUpPartial, share(best)
		return WarmUpPartial, bestAt, d
	case share(warmAgree) >= warmUpMajority:
		d.World, d.Agreeing = WarmUpWarm, share(warmAgree)
		return WarmUpWarm, 0, d
	case share(coldAgree) >= warmUpMajority:
		d.World, d.Agreeing = WarmUpCold, share(coldAgree)
		return WarmUpCold, frontierCold, d
	}
	d.Agreeing = share(best)
	return WarmUpUndecided, 0, d
}

// World is what the evidence decided so far.
func (w *WarmUp) World() WarmUpWorld { return w.world }

// Lookback finds where a model's warm-up may start: fed the rows before the
// model's first row sent, latest first, it tells when the rows fed so far
// fill the cache (CacheFull) and the profile's stack (ProfileFull). A
// bounded LRU cache always holds the most recently used blocks that fit, so
// once the blocks used since some row overflow its capacity, what came
// before that row cannot be in it at the start; the profile's stack
// likewise forgets what lies beyond its ceiling. An unbounded cache is
// never full.
type Lookback struct {
	cache   *Cache
	profile *Profile
	// The cache's blocks are counted exactly while it needs them: at most
	// its bound in blocks. The profile's distinct blocks, up to a ceiling
	// of millions of small blocks, are counted as its stack would sample
	// them, within the same bound.
	seen      map[BlockKey]bool
	used      int // server blocks of seen
	cacheFull bool
	distinct  *Stack[BlockKey]
}

// NewLookback returns a lookback of profile and its cache, fed no row.
func NewLookback(profile *Profile) *Lookback {
	return &Lookback{
		cache:    profile.cache,
		profile:  profile,
		seen:     map[BlockKey]bool{},
		distinct: newProfileStack(0, 0),
	}
}

// Row feeds the row before those fed so far: its blocks' chain keys in
// namespace ns, of inputLength tokens.
func (l *Lookback) Row(ns uint64, keys []uint64, inputLength int) {
	c := l.cache
	bounded := c.p.CapacityBlocks != 0
	for i, chain := range keys { // the first block of a row is its most recent
		k := BlockKey{ns, chain}
		tokens := c.round.BlockTokens(i, len(keys), inputLength)
		if l.distinct.Distance(k) == InfiniteDistance {
			l.distinct.Use(k, l.profile.weight(tokens))
		}
		if bounded && !l.cacheFull && !l.seen[k] {
			l.seen[k] = true
			l.used += c.round.BlockWeight(tokens)
		}
	}
	if bounded && !l.cacheFull {
		l.cacheFull = l.used > c.p.CapacityBlocks || len(l.seen) > c.round.MaxEntries(c.p.CapacityBlocks)
	}
}

// CacheFull tells whether the rows fed overflow a bounded cache: no row
// before them can change what it holds at the start.
func (l *Lookback) CacheFull() bool { return l.cacheFull }

// ProfileFull tells whether the rows fed overflow the profile's stack, in
// weight or in blocks: no row before them can change it at the start.
func (l *Lookback) ProfileFull() bool {
	p := l.profile
	return l.distinct.Weight() > p.ceiling || int64(l.distinct.Len())*l.distinct.Scale() > int64(p.maxKeys)
}
