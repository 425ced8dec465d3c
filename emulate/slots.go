package emulate

import (
	"cmp"
	"errors"
	"slices"
	"sync"
)

// slotCache models llama.cpp's server: a fixed number of slots, each
// remembering the prompt it last ran, and no cache shared between them. A
// request runs in the idle slot whose prompt shares the longest common
// token prefix with its own (the least recently used slot on ties or when
// nothing is shared) and reuses that prefix. Since every prompt starts
// with the same BOS and chat-template header tokens, unrelated prompts
// still reuse those, as on a real llama.cpp server. llama.cpp's
// --slot-prompt-similarity threshold is not modelled.
type slotCache struct {
	mu      sync.Mutex
	enabled bool
	slots   []*slot
	tick    uint64
}

type slot struct {
	salt   string
	tokens []int
	used   uint64 // tick of the last use; 0 for never
	busy   bool
}

func newSlotCache(n int, enabled bool) *slotCache {
	c := &slotCache{enabled: enabled}
	for range n {
		c.slots = append(c.slots, &slot{})
	}
	return c
}

func (c *slotCache) lookup(salt string, tokens []int) (int, claim) {
	cl := claim{salt: salt, tokens: tokens}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Idle slots first; when more requests run than there are slots
	// (max_running above slots), a busy one is shared.
	cands := make([]*slot, 0, len(c.slots))
	for _, s := range c.slots {
		if !s.busy {
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		cands = c.slots
	}
	var best *slot
	bestLen := 0
	for _, s := range cands {
		l := 0
		if c.enabled && s.salt == salt {
			l = commonPrefix(s.tokens, tokens)
		}
		if best == nil || l > bestLen || (l == bestLen && s.used < best.used) {
			best, bestLen = s, l
		}
	}
	c.tick++
	best.used, best.busy = c.tick, true
	cl.slot = best
	return min(bestLen, max(len(tokens)-1, 0)), cl
}

// insert leaves the prompt in its slot for the next request.
func (c *slotCache) insert(cl claim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.slots, cl.slot) {
		return // resized away meanwhile
	}
	cl.slot.busy = false
	if c.enabled {
		cl.slot.salt, cl.slot.tokens = cl.salt, append(cl.slot.tokens[:0], cl.tokens...)
	}
}

func (c *slotCache) release(cl claim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl.slot.busy = false
}

func (c *slotCache) setEnabled(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enabled = on
	if !on {
		c.flushLocked()
	}
}

// resize sets the number of slots, dropping the least recently used
// ones when there are fewer.
func (c *slotCache) resize(n int) error {
	if n < 1 {
		return errors.New("the llamacpp personality needs at least one slot")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n < len(c.slots) {
		slices.SortStableFunc(c.slots, func(a, b *slot) int { return cmp.Compare(b.used, a.used) })
		c.slots = c.slots[:n]
	}
	for len(c.slots) < n {
		c.slots = append(c.slots, &slot{})
	}
	return nil
}

func (c *slotCache) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
}

func (c *slotCache) flushLocked() {
	for _, s := range c.slots {
		s.salt, s.tokens = "", nil
	}
}

func (c *slotCache) state() CacheState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := CacheState{Enabled: c.enabled, BlockSize: 1, CapacityBlocks: len(c.slots)}
	for _, s := range c.slots {
		if len(s.tokens) > 0 {
			st.Blocks++
			st.Tokens += len(s.tokens)
		}
	}
	return st
}
