package emulate

import (
	"fmt"
	"slices"
)

// DefaultCacheRAMTokens is the llamacpp personality's host prompt cache
// size: llama-server's default --cache-ram of 8192 MiB holds 65,536
// tokens of an 8B Llama-3-class model (32 layers × 8 KV heads × 128
// dimensions × K and V × 2 bytes in f16 = 128 KiB per token). A smaller
// model's tokens are smaller, so a real server holds more of them; the
// emulator does not model bytes per token, so the budget is in tokens.
const DefaultCacheRAMTokens = 65536

// hostCache models llama-server's host-memory prompt cache (--cache-ram):
// prompts that leave a slot are kept here, and a slot taking a request
// restores the one that serves it best. It is ordered by when each prompt
// came in, oldest first, and evicts from the front to stay within a token
// budget. A restored prompt leaves the cache, so a prompt in use comes
// back at the end when it is saved again: least recently parked goes
// first. Its owner, the slotCache, holds the lock.
type hostCache struct {
	budget  int // tokens; 0 means off
	entries []hostEntry
	tokens  int // held by entries
}

type hostEntry struct {
	salt   string
	tokens []int
}

func (h *hostCache) on() bool { return h.budget > 0 }

// save keeps a copy of a slot's prompt, unless the cache already holds it
// whole (as a prefix of a longer prompt) or it alone exceeds the budget.
// Prompts it extends are dropped as obsolete, and the oldest ones make
// room for it.
func (h *hostCache) save(salt string, tokens []int) {
	n := len(tokens)
	if !h.on() || n == 0 || n > h.budget {
		return
	}
	for _, e := range h.entries {
		if e.salt == salt && commonPrefix(e.tokens, tokens) == n {
			return
		}
	}
	h.entries = slices.DeleteFunc(h.entries, func(e hostEntry) bool {
		obsolete := e.salt == salt && commonPrefix(e.tokens, tokens) == len(e.tokens)
		if obsolete {
			h.tokens -= len(e.tokens)
		}
		return obsolete
	})
	h.evict(h.budget - n)
	h.entries = append(h.entries, hostEntry{salt: salt, tokens: slices.Clone(tokens)})
	h.tokens += n
}

// take removes and returns the cached prompt that serves tokens better
// than the slot's own prompt (slotLCP tokens in common, slotLen long),
// or false when none does. Better means more of the request reused and
// more of the cached prompt kept; a cached prompt that would keep less
// than a quarter of itself is never taken, so that a short request does
// not throw away a long prompt. An empty slot (slotLen 0) is beaten by
// any prompt that passes that floor and shares a token.
func (h *hostCache) take(salt string, tokens []int, slotLCP, slotLen int) (hostEntry, bool) {
	best, bestLCP, bestLen := -1, slotLCP, slotLen
	for i, e := range h.entries {
		if e.salt != salt {
			continue
		}
		lcp := commonPrefix(e.tokens, tokens)
		if 4*lcp < len(e.tokens) {
			continue
		}
		// lcp/len(e) > bestLCP/bestLen, with an empty slot's ratio below
		// any; the request's share is lcp/len(tokens) for both sides.
		keepsMore := bestLen == 0 || lcp*bestLen > bestLCP*len(e.tokens)
		if keepsMore && lcp > bestLCP {
			best, bestLCP, bestLen = i, lcp, len(e.tokens)
		}
	}
	if best < 0 {
		return hostEntry{}, false
	}
	e := h.entries[best]
	h.entries = slices.Delete(h.entries, best, best+1)
	h.tokens -= len(e.tokens)
	return e, true
}

// evict drops the oldest prompts until at most limit tokens are held.
func (h *hostCache) evict(limit int) {
	i := 0
	for ; i < len(h.entries) && h.tokens > limit; i++ {
		h.tokens -= len(h.entries[i].tokens)
	}
	h.entries = slices.Delete(h.entries, 0, i)
}

// setBudget changes the size, evicting the oldest prompts beyond it; 0
// or less turns the cache off and empties it.
func (h *hostCache) setBudget(tokens int) {
	h.budget = max(tokens, 0)
	h.evict(h.budget)
}

func (h *hostCache) flush() {
	h.entries, h.tokens = nil, 0
}

// SetCacheRAMTokens sizes the llamacpp personality's host prompt cache in
// tokens, evicting the oldest prompts beyond it; 0 or less turns it off
// (llama-server's --cache-ram 0), and idle slots then keep their prompts.
func (e *Engine) SetCacheRAMTokens(tokens int) error {
	sc, ok := e.cache.(*slotCache)
	if !ok {
		return fmt.Errorf("emulate: the host prompt cache is llamacpp's, not %s's", e.cfg.Engine)
	}
	sc.setHostBudget(tokens)
	return nil
}
