package servedcache

import "slices"

// Some engines report tokens as cached that every prompt shares whatever
// the trace says: llama.cpp keeps the BOS token and the chat template's
// header in its slot, SGLang's page-1 radix tree matches them too. Those
// few tokens are real hits, but the trace knows nothing of them, so on a
// trace that shares little they would lift the observed hit rate above
// the theoretical one (efficiency > 1). This step learns that preamble
// per target from the engine's own answers, from requests that the
// theoretical model says share nothing, and has the collector leave it out
// of both sides of the observed hit rate.

const (
	// preambleWindow: the preamble is the lower quartile of the cached
	// counts of the last preambleWindow requests that share nothing in
	// theory. Not the least: one cold answer (an empty slot at start or
	// after a restart) would then hide it for a whole window. Not the
	// median: unrelated texts that also share a first word now and then
	// are real hits the trace cannot see, not a preamble.
	preambleWindow = 32
	// preambleMinSamples: below this many samples nothing is subtracted.
	preambleMinSamples = 8
	// preambleMaxTokens bounds what counts as a preamble: a BOS and a chat
	// header are a handful of tokens. More than this, hit by every
	// request the model says shares nothing, is a real disagreement
	// between model and engine, which must stay visible.
	preambleMaxTokens = 64
)

// preamble learns one target's always-cached preamble.
type preamble struct {
	recent [preambleWindow]int
	n      int // samples held, up to preambleWindow
	next   int // where the next sample goes
}

// observe records the cached count of a request whose prompt an ideal
// cache would not serve at all.
func (p *preamble) observe(cached int) {
	p.recent[p.next] = cached
	p.next = (p.next + 1) % preambleWindow
	p.n = min(p.n+1, preambleWindow)
}

// tokens is the current preamble: 0 until enough samples, or when the
// lower quartile is too large to be one.
func (p *preamble) tokens() int {
	if p.n < preambleMinSamples {
		return 0
	}
	held := slices.Clone(p.recent[:p.n])
	slices.Sort(held)
	q := held[p.n/4]
	if q > preambleMaxTokens {
		return 0
	}
	return q
}
