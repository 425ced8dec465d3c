// Package idealcache is the theoretical prefix cache the exporter judges
// engines by: the rules that round its hits and weigh its blocks
// (Rounding), the order in which a fleet's rows reach it (FleetOrder), the
// ideal LRU itself (Cache), its hits at every capacity (Profile, on the
// stack distances of Stack), and what the engine's answers say it holds of
// the rows a model only assumed sent (WarmUp). The daemon's model
// (replay.CacheModel, which walks the fleet schedule through these) and the
// offline analysis (synth.CapacityCurveOf, analyze --capacity-curve) both
// use these definitions, so that the two cannot drift apart;
// docs/cache-model.md describes them.
package idealcache

import "github.com/kvload-exporter/kvload-exporter/engine"

// Rounding is how an ideal cache of one engine counts: a trace names its
// prompts in blocks of TraceBlock tokens, the engine keeps them in server
// blocks of ServerBlock tokens and rounds a hit as Granularity says. Both
// sizes must be positive.
type Rounding struct {
	TraceBlock  int // tokens per trace hash block (512 for Mooncake)
	ServerBlock int // tokens per server KV block (16 for vLLM)
	Granularity engine.Granularity
}

// CachedTokens is the theoretical cached tokens of a request of
// inputLength tokens whose k leading trace blocks the cache holds:
// min(k·TraceBlock, inputLength−1), since an engine always computes the
// last prompt token again, and under engine.GranularityBlock only the
// whole server blocks of that.
func (r Rounding) CachedTokens(k, inputLength int) int {
	hit := min(k*r.TraceBlock, inputLength-1)
	if hit <= 0 {
		return 0
	}
	if r.Granularity == engine.GranularityToken {
		return hit
	}
	return hit / r.ServerBlock * r.ServerBlock
}

// BlockTokens is the tokens of block i of a row of n trace blocks and
// inputLength tokens: a whole trace block, except that the last holds what
// is left (none where the row names more blocks than its tokens fill).
func (r Rounding) BlockTokens(i, n, inputLength int) int {
	if i == n-1 {
		return max(inputLength-(n-1)*r.TraceBlock, 0)
	}
	return r.TraceBlock
}

// BlockWeight is the server blocks a trace block of tokens fills, which is
// what it costs of the cache's capacity: the whole ones only under
// engine.GranularityBlock, whose engines never reuse a partial block, the
// partial last one too under engine.GranularityToken.
func (r Rounding) BlockWeight(tokens int) int {
	tokens = max(tokens, 0)
	if r.Granularity == engine.GranularityToken {
		return (tokens + r.ServerBlock - 1) / r.ServerBlock
	}
	return tokens / r.ServerBlock
}

// EntriesPerServerBlock is the most trace blocks one server block of
// capacity holds: ⌈ServerBlock/TraceBlock⌉, at least 1.
func (r Rounding) EntriesPerServerBlock() int {
	return max((r.ServerBlock+r.TraceBlock-1)/r.TraceBlock, 1)
}

// MaxEntries bounds the trace blocks a cache of capacityBlocks server
// blocks holds, besides their weight: capacityBlocks·⌈ServerBlock/TraceBlock⌉.
// Weights alone do not bound them: a block of fewer tokens than a server
// block weighs 0 under engine.GranularityBlock (every block does when
// server blocks are larger than trace blocks), and so does a block of no
// tokens under either granularity; such blocks would pile up without end.
// Where every block weighs at least one server block, as blocks that hold
// a token do under engine.GranularityToken, the weight binds first and this
// bound changes nothing, so it is the same for both granularities.
func (r Rounding) MaxEntries(capacityBlocks int) int {
	return capacityBlocks * r.EntriesPerServerBlock()
}
