package idealcache

import (
	"slices"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// Params describe the server cache an ideal model stands for.
type Params struct {
	TraceBlock     int // tokens per trace hash block (512 for Mooncake)
	ServerBlock    int // tokens per server KV block
	CapacityBlocks int // server blocks the cache holds; 0 is unbounded
	Granularity    engine.Granularity
	// CeilingTokens bounds the capacities the model follows the hits of
	// (CapacityProfile): DefaultCeilingTokens when 0, and at least
	// twice the capacity.
	CeilingTokens int64
}

// DefaultCeilingTokens is the largest LRU capacity, in tokens, whose
// hits the model follows when the configuration does not say: 32 Mi tokens,
// more KV than one engine holds today (an 80 GB GPU holds about 1M tokens
// of an 8B model's KV). A known capacity raises it to at least twice that.
const DefaultCeilingTokens = 32 << 20

// MaxCeilingTokens bounds the ceiling a configuration may set.
const MaxCeilingTokens = 1 << 40

// ProfileMaxBlocks is the most blocks the profile's stack holds, whatever
// the block size and the ceiling: 2¹⁸, 32 MB measured. It is as many as
// the default ceiling holds in blocks of 128 tokens, and four times its
// blocks of 512 tokens, so that the profile of a trace of Mooncake's block
// size at the default ceiling is exact. Beyond it the stack keeps a
// spatially hashed sample of the blocks (Stack.Sample), and a request's
// profile is an estimate (docs/cache-model.md).
const ProfileMaxBlocks = 1 << 18

// ProfileBlockBytes bounds the heap a block of the profile's stack costs,
// its arrays as full as compaction lets them get
// (TestCapacityProfileBoundedWhateverBlockSize): ProfileMaxBlocks of them
// are the profile's bound in bytes.
const ProfileBlockBytes = 160

// CapacityStep is one step of a request's theoretical hit as a function of
// the LRU cache's capacity: from Capacity tokens of KV on, an ideal cache
// of that size serves Tokens of the prompt.
type CapacityStep struct {
	Capacity int64
	Tokens   int
}

// CapacityProfile is a request's theoretical cached tokens at every LRU
// capacity up to the model's ceiling: Steps ordered by capacity, both
// fields increasing; below the first step the hit is 0, and beyond the
// ceiling no step is given. Known is false when a step rests on a block
// that only rows assumed sent (the warm-up) touched, as
// Result.TheoreticalKnown is for the configured capacity.
type CapacityProfile struct {
	Steps []CapacityStep
	Known bool
}

// At is the theoretical hit at a capacity of capacity tokens.
func (p CapacityProfile) At(capacity int64) int {
	hit := 0
	for _, s := range p.Steps {
		if s.Capacity > capacity {
			break
		}
		hit = s.Tokens
	}
	return hit
}

// Profile follows, beside an ideal Cache of the configured size, the LRU
// stack distances of the same blocks, fed the same visits in the same
// order. By LRU's inclusion property a block is in a cache of capacity C
// exactly when its distance is at most C, so one pass gives every request's
// hit at every capacity. Distances are in tokens: a trace block weighs the
// server blocks it fills (Rounding.BlockWeight) times their size.
type Profile struct {
	cache   *Cache
	stack   *Stack[BlockKey]
	ceiling int64
	maxKeys int
	// entryWeight, when set, is the weight of every block that holds a
	// token: with server blocks larger than trace blocks under
	// engine.GranularityBlock, where a trace block fills no whole server
	// block and the ideal cache is bounded by its count of trace blocks
	// (Rounding.MaxEntries): a block then costs its share of one.
	entryWeight int64
	// since is the weight of the distinct blocks used since the model
	// reached its first row sent: a block at a greater distance was last
	// touched only by rows assumed sent. Blocks taken out again
	// (Unadmit) stay counted, so it can only be too high, and it is never
	// taken above the weight tracked.
	since int64
	refs  []StackRef     // scratch: where a row's leading blocks were found
	steps []CapacityStep // scratch: a row's profile, copied out at its size
}

// NewProfile returns the profile of c, empty, up to the ceiling of c's
// Params (DefaultCeilingTokens when 0, at least twice the capacity, at
// most MaxCeilingTokens).
func NewProfile(c *Cache) *Profile {
	p := c.p
	ceiling := p.CeilingTokens
	if ceiling <= 0 {
		ceiling = DefaultCeilingTokens
	}
	ceiling = min(max(ceiling, 2*int64(p.CapacityBlocks)*int64(p.ServerBlock)), MaxCeilingTokens)
	cp := &Profile{cache: c, ceiling: ceiling}
	if p.Granularity != engine.GranularityToken && p.TraceBlock < p.ServerBlock {
		cp.entryWeight = int64(max(p.ServerBlock/c.round.EntriesPerServerBlock(), 1))
	}
	// Blocks that weigh nothing (a short last block under
	// GranularityBlock) would pile up without end: keep at most four
	// times as many blocks as whole trace blocks fit under the ceiling.
	// This binds only where the blocks tracked average under a quarter
	// of a trace block, on traces of very short prompts.
	full := max(cp.weight(p.TraceBlock), 1)
	cp.maxKeys = int(min(4*ceiling/full, 1<<31))
	cp.stack = newProfileStack(ceiling, cp.maxKeys)
	return cp
}

// newProfileStack is a stack of blocks that holds at most
// ProfileMaxBlocks of them, sampled beyond.
func newProfileStack(ceiling int64, maxKeys int) *Stack[BlockKey] {
	s := NewStack[BlockKey](ceiling, maxKeys)
	s.Sample(ProfileMaxBlocks, func(k BlockKey) uint64 { return SampleHash(k.NS, k.Chain) })
	return s
}

// weight is a trace block of tokens tokens' weight in tokens.
func (cp *Profile) weight(tokens int) int64 {
	if cp.entryWeight > 0 && tokens > 0 {
		return cp.entryWeight
	}
	return int64(cp.cache.round.BlockWeight(tokens)) * int64(cp.cache.p.ServerBlock)
}

// Visit is the profile side of Cache.Visit, called just before it with the
// same arguments: before touching, the distance of the request's leading
// blocks gives its profile (when want); then every block is used from the
// last to the first, as the ideal cache touches them. Without insert it
// does nothing. warm marks a row assumed sent.
func (cp *Profile) Visit(ns uint64, keys []uint64, inputLength int, insert, warm, want bool) CapacityProfile {
	var prof CapacityProfile
	if !insert {
		return prof
	}
	round := cp.cache.round
	// counted is how many leading blocks were found, up to the last one
	// the tracker knows (those out of its sample before it included);
	// blocks beyond them are new to it, or out of its sample (a block's
	// key is its chain's: a block seen means its prefix was seen).
	counted := 0
	cp.refs = cp.refs[:0]
	if !warm {
		var reach int64 // the running maximum of the distances
		prof.Known = true
		cp.steps = cp.steps[:0]
		end := len(keys) // where the blocks found end, at the latest
		for i, chain := range keys {
			key := BlockKey{ns, chain}
			if !cp.stack.Tracks(key) {
				// Out of the sample: held where the next block in it
				// is (its prefix is used after it, so is never deeper).
				cp.refs = append(cp.refs, StackRef{})
				continue
			}
			ref, d := cp.stack.Lookup(key)
			if d == InfiniteDistance {
				end = i
				break
			}
			cp.refs = append(cp.refs, ref)
			counted = i + 1
			if d > cp.since {
				// Last touched by a row assumed sent: using it now
				// counts it as touched since.
				cp.since += cp.stack.Scale() * cp.weight(round.BlockTokens(i, len(keys), inputLength))
				if want {
					prof.Known = false
				}
			}
			if want {
				reach = max(reach, d)
				cp.step(reach, round.CachedTokens(i+1, inputLength))
			}
		}
		// In a sample, where the hit ends after the last block found is
		// not known: before the next block in the sample, never seen, or
		// the row's end. Half of those blocks count, where the last one
		// found is held.
		if want && counted > 0 && counted < end && cp.stack.Scale() > 1 {
			cp.step(reach, round.CachedTokens(counted+(end-counted)/2, inputLength))
		}
		cp.refs = cp.refs[:counted]
		prof.Steps = slices.Clone(cp.steps) // allocates nothing when empty
	}
	for i := len(keys) - 1; i >= 0; i-- {
		key := BlockKey{ns, keys[i]}
		if !cp.stack.Tracks(key) {
			continue
		}
		w := cp.weight(round.BlockTokens(i, len(keys), inputLength))
		if i < counted {
			cp.stack.UseRef(cp.refs[i], key, w)
			continue
		}
		if !warm {
			cp.since += cp.stack.Scale() * w
		}
		cp.stack.Use(key, w)
	}
	cp.since = min(cp.since, cp.stack.Weight())
	return prof
}

// step records that the hit reaches hit tokens at a capacity of reach.
func (cp *Profile) step(reach int64, hit int) {
	switch n := len(cp.steps); {
	case n > 0 && cp.steps[n-1].Capacity == reach:
		cp.steps[n-1].Tokens = max(cp.steps[n-1].Tokens, hit)
	case n == 0 && hit > 0, n > 0 && hit > cp.steps[n-1].Tokens:
		cp.steps = append(cp.steps, CapacityStep{Capacity: reach, Tokens: hit})
	}
}

// Unadmit takes out of the stack the blocks the ideal cache is about to
// take out (Cache.Unadmit, called just after): those a's visit added that
// no later visit used. It is approximate: a block the ideal cache had
// evicted meanwhile stays in the stack, and the blocks a's visit only
// touched keep their place, as in the ideal cache.
func (cp *Profile) Unadmit(a Admission) {
	for _, key := range a.inserted {
		if _, ok := cp.cache.addedBy(key, a); ok {
			cp.stack.Remove(key)
		}
	}
}
