package replay

import (
	"slices"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/idealcache"
)

// CapacityStep is idealcache.CapacityStep: the model and its callers name
// the ideal cache's definitions as replay's.
type CapacityStep = idealcache.CapacityStep

// CapacityProfile is idealcache.CapacityProfile.
type CapacityProfile = idealcache.CapacityProfile

// The model's ceilings and the profile's bound, as idealcache defines them.
const (
	DefaultModelCeilingTokens = idealcache.DefaultCeilingTokens
	MaxModelCeilingTokens     = idealcache.MaxCeilingTokens
	ProfileMaxBlocks          = idealcache.ProfileMaxBlocks
)

// AcceptProfile is Accept, with the request's theoretical hit at every
// capacity up to the model's ceiling.
func (m *CacheModel) AcceptProfile(it PacerItem) (tokens int, known bool, profile CapacityProfile) {
	return m.accept(it, 0, false)
}

// AcceptObservedProfile is AcceptObserved, with the request's theoretical
// hit at every capacity up to the model's ceiling.
func (m *CacheModel) AcceptObservedProfile(it PacerItem, cached int) (tokens int, known bool, profile CapacityProfile) {
	return m.accept(it, cached, true)
}

// capacityProfile follows, beside the ideal cache of the configured size,
// the LRU stack distances of the same blocks, fed the same visits in the
// same order. By LRU's inclusion property a block is in a cache of
// capacity C exactly when its distance is at most C, so one pass gives
// every request's hit at every capacity. Distances are in tokens: a trace
// block weighs the server blocks it fills (idealcache.Rounding.BlockWeight)
// times their size.
type capacityProfile struct {
	stack   *idealcache.Stack[blockKey]
	ceiling int64
	maxKeys int
	// entryWeight, when set, is the weight of every block that holds a
	// token: with server blocks larger than trace blocks under
	// engine.GranularityBlock, where a trace block fills no whole server
	// block and the ideal cache is bounded by its count of trace blocks
	// (idealcache.Rounding.MaxEntries): a block then costs its share of one.
	entryWeight int64
	// since is the weight of the distinct blocks used since the model
	// reached its first row sent: a block at a greater distance was last
	// touched only by rows assumed sent. Blocks taken out again
	// (unadmit) stay counted, so it can only be too high, and it is never
	// taken above the weight tracked.
	since int64
	refs  []idealcache.StackRef // scratch: where a row's leading blocks were found
	steps []CapacityStep        // scratch: a row's profile, copied out at its size
}

func newCapacityProfile(c *idealCache) *capacityProfile {
	p := c.p
	ceiling := p.CeilingTokens
	if ceiling <= 0 {
		ceiling = DefaultModelCeilingTokens
	}
	ceiling = min(max(ceiling, 2*int64(p.CapacityBlocks)*int64(p.ServerBlock)), MaxModelCeilingTokens)
	cp := &capacityProfile{ceiling: ceiling}
	if p.Granularity != engine.GranularityToken && p.TraceBlock < p.ServerBlock {
		cp.entryWeight = int64(max(p.ServerBlock/c.round.EntriesPerServerBlock(), 1))
	}
	// Blocks that weigh nothing (a short last block under
	// GranularityBlock) would pile up without end: keep at most four
	// times as many blocks as whole trace blocks fit under the ceiling.
	// This binds only where the blocks tracked average under a quarter
	// of a trace block, on traces of very short prompts.
	full := max(cp.weight(c, p.TraceBlock), 1)
	cp.maxKeys = int(min(4*ceiling/full, 1<<31))
	cp.stack = newProfileStack(ceiling, cp.maxKeys)
	return cp
}

// newProfileStack is a stack of blocks that holds at most
// ProfileMaxBlocks of them, sampled beyond.
func newProfileStack(ceiling int64, maxKeys int) *idealcache.Stack[blockKey] {
	s := idealcache.NewStack[blockKey](ceiling, maxKeys)
	s.Sample(ProfileMaxBlocks, func(k blockKey) uint64 { return idealcache.SampleHash(k.ns, k.chain) })
	return s
}

// weight is a trace block of tokens tokens' weight in tokens.
func (cp *capacityProfile) weight(c *idealCache, tokens int) int64 {
	if cp.entryWeight > 0 && tokens > 0 {
		return cp.entryWeight
	}
	return int64(c.round.BlockWeight(tokens)) * int64(c.p.ServerBlock)
}

// visit is the profile side of idealCache.visit: before touching, the
// distance of the request's leading blocks gives its profile (when want);
// then every block is used from the last to the first, as the ideal cache
// touches them. Without insert it does nothing. warm marks a row assumed
// sent.
func (cp *capacityProfile) visit(c *idealCache, ns uint64, keys []uint64, inputLength int, insert, warm, want bool) CapacityProfile {
	var prof CapacityProfile
	if !insert {
		return prof
	}
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
			key := blockKey{ns, chain}
			if !cp.stack.Tracks(key) {
				// Out of the sample: held where the next block in it
				// is (its prefix is used after it, so is never deeper).
				cp.refs = append(cp.refs, idealcache.StackRef{})
				continue
			}
			ref, d := cp.stack.Lookup(key)
			if d == idealcache.InfiniteDistance {
				end = i
				break
			}
			cp.refs = append(cp.refs, ref)
			counted = i + 1
			if d > cp.since {
				// Last touched by a row assumed sent: using it now
				// counts it as touched since.
				cp.since += cp.stack.Scale() * cp.weight(c, c.round.BlockTokens(i, len(keys), inputLength))
				if want {
					prof.Known = false
				}
			}
			if want {
				reach = max(reach, d)
				cp.step(reach, c.round.CachedTokens(i+1, inputLength))
			}
		}
		// In a sample, where the hit ends after the last block found is
		// not known: before the next block in the sample, never seen, or
		// the row's end. Half of those blocks count, where the last one
		// found is held.
		if want && counted > 0 && counted < end && cp.stack.Scale() > 1 {
			cp.step(reach, c.round.CachedTokens(counted+(end-counted)/2, inputLength))
		}
		cp.refs = cp.refs[:counted]
		prof.Steps = slices.Clone(cp.steps) // allocates nothing when empty
	}
	for i := len(keys) - 1; i >= 0; i-- {
		key := blockKey{ns, keys[i]}
		if !cp.stack.Tracks(key) {
			continue
		}
		w := cp.weight(c, c.round.BlockTokens(i, len(keys), inputLength))
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
func (cp *capacityProfile) step(reach int64, hit int) {
	switch n := len(cp.steps); {
	case n > 0 && cp.steps[n-1].Capacity == reach:
		cp.steps[n-1].Tokens = max(cp.steps[n-1].Tokens, hit)
	case n == 0 && hit > 0, n > 0 && hit > cp.steps[n-1].Tokens:
		cp.steps = append(cp.steps, CapacityStep{Capacity: reach, Tokens: hit})
	}
}

// unadmit takes out of the stack the blocks the ideal cache is about to
// take out (idealCache.unadmit): those a's visit added that no later visit
// used. It is approximate: a block the ideal cache had evicted meanwhile
// stays in the stack, and the blocks a's visit only touched keep their
// place, as in the ideal cache.
func (cp *capacityProfile) unadmit(c *idealCache, a admitted) {
	for _, key := range a.inserted {
		if e, ok := c.index[key]; ok && e.Value.(*cachedBlock).seq == a.seq {
			cp.stack.Remove(key)
		}
	}
}
