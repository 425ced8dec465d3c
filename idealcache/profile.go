package idealcache

import "github.com/kvload-exporter/kvload-exporter/engine"

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
// (replay's TestCapacityProfileBoundedWhateverBlockSize): ProfileMaxBlocks of them
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
