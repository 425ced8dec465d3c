package emulate

import (
	"cmp"
	"errors"
	"slices"
	"sync"
)

// slotCache models llama.cpp's server: a fixed number of slots, each
// remembering the prompt it last ran, and optionally a host-memory prompt
// cache behind them (hostCache, llama-server's --cache-ram).
//
// A request takes the idle slot whose prompt shares the largest part of
// the request (more than slotPromptSimilarity of its tokens; the least
// recently used slot on ties), else the least recently used idle slot,
// and reuses the prefix it shares with that slot's prompt. Since every
// prompt starts with the same BOS and chat-template header tokens,
// unrelated prompts still reuse those, as on a real llama.cpp server.
//
// With the host cache on, a slot taken by the least-recently-used rule,
// or one about to lose more than half of its prompt, first saves that
// prompt in the host cache and then restores the cached prompt that
// serves the request better, if any. Once the request has its slot, every
// other idle slot saves its prompt in the host cache and is emptied, as
// llama-server does by default (--cache-idle-slots with its unified KV
// cache): an idle prompt then lives on in the host cache only.
type slotCache struct {
	mu      sync.Mutex
	enabled bool
	slots   []*slot
	host    hostCache
	tick    uint64
}

// slotPromptSimilarity is llama-server's --slot-prompt-similarity
// default: a slot is chosen for its prompt only when it shares more than
// this fraction of the request's tokens.
const slotPromptSimilarity = 0.1

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
	best, byLRU := c.choose(salt, tokens)
	if c.enabled && c.host.on() && (byLRU || 2*c.shared(best, salt, tokens) < len(best.tokens)) {
		c.exchange(best, salt, tokens)
	}
	hit := c.shared(best, salt, tokens)
	c.tick++
	best.used, best.busy = c.tick, true
	cl.slot = best
	if c.enabled && c.host.on() {
		c.parkIdle()
	}
	return min(hit, max(len(tokens)-1, 0)), cl
}

// choose picks the slot for a request, and says whether it fell back to
// the least recently used one.
func (c *slotCache) choose(salt string, tokens []int) (best *slot, byLRU bool) {
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
	bestLen := 0
	for _, s := range cands {
		l := c.shared(s, salt, tokens)
		if float64(l) <= slotPromptSimilarity*float64(len(tokens)) {
			continue
		}
		if best == nil || l > bestLen || (l == bestLen && s.used < best.used) {
			best, bestLen = s, l
		}
	}
	if best != nil {
		return best, false
	}
	for _, s := range cands {
		if best == nil || s.used < best.used {
			best = s
		}
	}
	return best, true
}

// shared is the prefix a slot's prompt shares with a request, 0 with the
// cache off.
func (c *slotCache) shared(s *slot, salt string, tokens []int) int {
	if !c.enabled || s.salt != salt {
		return 0
	}
	return commonPrefix(s.tokens, tokens)
}

// exchange saves a slot's prompt in the host cache and restores in its
// place the cached prompt that serves the request better, if any.
func (c *slotCache) exchange(s *slot, salt string, tokens []int) {
	c.host.save(s.salt, s.tokens)
	if e, ok := c.host.take(salt, tokens, c.shared(s, salt, tokens), len(s.tokens)); ok {
		s.salt, s.tokens = e.salt, e.tokens
	}
}

// parkIdle moves every idle slot's prompt to the host cache.
func (c *slotCache) parkIdle() {
	for _, s := range c.slots {
		if !s.busy && len(s.tokens) > 0 {
			c.host.save(s.salt, s.tokens)
			s.salt, s.tokens = "", nil
		}
	}
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
	c.host.flush()
}

// setHostBudget sizes the host prompt cache in tokens; 0 or less turns it
// off, and the slots then keep their prompts when idle.
func (c *slotCache) setHostBudget(tokens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.host.setBudget(tokens)
}

func (c *slotCache) state() CacheState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := CacheState{Enabled: c.enabled, BlockSize: 1, CapacityBlocks: len(c.slots),
		CacheRAMTokens: c.host.budget, HostPrompts: len(c.host.entries), HostTokens: c.host.tokens}
	for _, s := range c.slots {
		if len(s.tokens) > 0 {
			st.Blocks++
			st.Tokens += len(s.tokens)
		}
	}
	st.Blocks += st.HostPrompts
	st.Tokens += st.HostTokens
	return st
}
