package emulate

import (
	"container/list"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
)

// prefixCache is what the engine asks of a prefix cache. A request looks
// its prompt up when it is admitted and gets a claim, which it ends with
// insert once its prefill is done (the prompt becomes reusable) or with
// release if it ends before.
type prefixCache interface {
	// lookup returns how many leading tokens of the prompt are cached, at
	// most len(tokens)-1 since the last token is always recomputed.
	lookup(salt string, tokens []int) (hit int, c claim)
	insert(c claim)
	release(c claim)
	setEnabled(on bool)
	resize(capacity int) error
	flush()
	state() CacheState
}

// claim is a looked-up request's hold on the cache until it ends.
type claim struct {
	salt   string
	tokens []int
	slot   *slot // llamacpp: the slot the request runs in; nil otherwise
}

// CacheState is the prefix cache's configuration and occupancy.
type CacheState struct {
	Enabled   bool `json:"enabled"`
	BlockSize int  `json:"block_size"`
	// CapacityBlocks is the capacity in blocks, 0 for unbounded; in the
	// llamacpp personality it is the number of slots.
	CapacityBlocks int `json:"capacity_blocks"`
	// Blocks is the number of blocks held now (llamacpp: prompts held in
	// slots and in the host prompt cache), Tokens the tokens they hold.
	Blocks int `json:"blocks"`
	Tokens int `json:"tokens"`
	// CacheRAMTokens is the llamacpp host prompt cache's size in tokens,
	// 0 when it is off; HostPrompts and HostTokens are what it holds now
	// (counted in Blocks and Tokens too).
	CacheRAMTokens int `json:"cache_ram_tokens,omitempty"`
	HostPrompts    int `json:"host_prompts,omitempty"`
	HostTokens     int `json:"host_tokens,omitempty"`
}

// newPrefixCache returns the cache of a personality.
func newPrefixCache(p Personality, blockSize, capacity, slots int, enabled bool) prefixCache {
	if p == PersonalityLlamaCpp {
		return newSlotCache(slots, enabled)
	}
	return newTrieCache(blockSize, capacity, p == PersonalityTRTLLM, enabled)
}

// trieCache is a prefix cache over real token ids: a trie whose nodes are
// blocks of blockSize tokens at block-aligned positions, one trie per
// cache salt. Children are found by their exact tokens, so a hit never
// depends on a hash, and salted prompts share nothing with other salts.
//
// Only a prompt's full blocks are stored, its trailing partial block
// never (vLLM's rule; whether TensorRT-LLM also keeps a last, partly
// filled block is not modelled).
//
// It is written independently of the exporter's theoretical model (an
// LRU keyed by trace hash ids) so that it can serve as ground truth for
// it. Capacity is in blocks; eviction takes the least recently used block,
// which is always a leaf: every touch of a block also touches its
// ancestors afterwards, so a parent is never older than its children and a
// prefix is never evicted before its extension.
type trieCache struct {
	blockSize int
	// partial (TensorRT-LLM) lets a hit end inside a cached block: the
	// longest common prefix with any cached child counts, not only
	// whole blocks.
	partial bool

	mu       sync.Mutex
	enabled  bool
	capacity int              // blocks; 0 means unbounded
	roots    map[string]*node // by cache salt
	lru      list.List        // of *node, front most recent; roots are not in it
	tick     uint64           // counts touches
	// events, when set, hears of every block stored and removed and of
	// every flush, under mu (vLLM's KV cache events).
	events cacheEvents
}

// cacheEvents is what a trie cache tells of its blocks: the KV events
// publisher. Calls come under the cache's lock, in the cache's order.
type cacheEvents interface {
	// stored: blocks made reusable, in prompt order, after the block
	// parent (none when hasParent is false: they start the prompt), under
	// the cache salt salt ("" for none).
	stored(salt string, parent uint64, hasParent bool, hashes []uint64, tokens []int, blockSize int)
	removed(hashes []uint64)
	cleared()
}

type node struct {
	parent   *node
	key      string           // children key in parent; for a root, its salt
	tokens   []int            // blockSize tokens; nil for a root
	children map[string]*node // nil until the first child
	elem     *list.Element
	used     uint64 // tick of the last touch
	// hash names the block in KV events: FNV-1a of the parent's hash and
	// the block's tokens (of the salt, for a root), so that equal prefixes
	// under one salt always get equal names.
	hash uint64
}

// blockHash is the event name of a block after parent, the block's tokens
// given as their chunk key.
func blockHash(parent uint64, chunkKey []byte) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], parent)
	h.Write(b[:])
	h.Write(chunkKey)
	return h.Sum64()
}

// rootHash is the hash a salt's root stands for, the parent of its first
// blocks.
func rootHash(salt string) uint64 {
	h := fnv.New64a()
	h.Write([]byte("salt:" + salt))
	return h.Sum64()
}

func newTrieCache(blockSize, capacity int, partial, enabled bool) *trieCache {
	return &trieCache{blockSize: blockSize, partial: partial, enabled: enabled, capacity: capacity,
		roots: make(map[string]*node)}
}

// appendChunkKey encodes a block's tokens exactly: uvarints are
// prefix-free, so different token sequences never share a key. Callers
// index maps with string(key), which Go does without allocating.
func appendChunkKey(b []byte, tokens []int) []byte {
	for _, t := range tokens {
		b = binary.AppendUvarint(b, uint64(t))
	}
	return b
}

func chunkKey(tokens []int) string { return string(appendChunkKey(nil, tokens)) }

func commonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func (c *trieCache) lookup(salt string, tokens []int) (int, claim) {
	cl := claim{salt: salt, tokens: tokens}
	maxHit := len(tokens) - 1
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled || maxHit <= 0 {
		return 0, cl
	}
	n := c.roots[salt]
	if n == nil {
		return 0, cl
	}
	B := c.blockSize
	// Whole blocks first, as long as they stay within the cap: vLLM
	// recomputes a whole last block rather than hit the last token.
	hit := 0
	var key []byte
	for hit+B <= maxHit {
		key = appendChunkKey(key[:0], tokens[hit:hit+B])
		child := n.children[string(key)]
		if child == nil {
			break
		}
		n, hit = child, hit+B
	}
	last := n
	if c.partial && hit < maxHit {
		// Partial reuse: the best match inside one more cached block,
		// the most recently used on ties so that map order never decides
		// which block stays warm.
		best, bestLen := (*node)(nil), 0
		for _, child := range n.children {
			l := commonPrefix(child.tokens, tokens[hit:maxHit])
			if l > bestLen || (l == bestLen && l > 0 && child.used > best.used) {
				best, bestLen = child, l
			}
		}
		if best != nil {
			last, hit = best, hit+bestLen
		}
	}
	c.touchLocked(last)
	return hit, cl
}

func (c *trieCache) insert(cl claim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled {
		return
	}
	nb := len(cl.tokens) / c.blockSize
	if c.capacity > 0 {
		// Only the leading blocks fit, the only ones a lookup can reach.
		nb = min(nb, c.capacity)
	}
	if nb == 0 {
		return
	}
	n := c.roots[cl.salt]
	if n == nil {
		n = &node{key: cl.salt}
		if c.events != nil {
			n.hash = rootHash(cl.salt)
		}
		c.roots[cl.salt] = n
	}
	var key []byte
	first := -1 // the first block this insert stores
	var hashes []uint64
	for b := range nb {
		chunk := cl.tokens[b*c.blockSize : (b+1)*c.blockSize]
		key = appendChunkKey(key[:0], chunk)
		child := n.children[string(key)]
		if child == nil {
			if n.children == nil {
				n.children = make(map[string]*node) // lazily: most blocks are leaves
			}
			child = &node{parent: n, key: string(key), tokens: slices.Clone(chunk)}
			n.children[child.key] = child
			if first < 0 {
				first = b
				if c.events != nil {
					hashes = make([]uint64, 0, nb-b)
				}
			}
			if c.events != nil {
				child.hash = blockHash(n.hash, key)
				hashes = append(hashes, child.hash)
			}
		}
		n = child
	}
	if c.events != nil && first >= 0 {
		// Once one block is new, so are all after it: one event for the
		// run, linked to the block before it, as vLLM sends a prefill's.
		start := n
		for range len(hashes) - 1 {
			start = start.parent
		}
		p := start.parent
		c.events.stored(cl.salt, p.hash, p.parent != nil, hashes,
			slices.Clone(cl.tokens[first*c.blockSize:nb*c.blockSize]), c.blockSize)
	}
	c.touchLocked(n)
	c.evictLocked()
}

func (c *trieCache) release(claim) {}

// touchLocked makes a block and then each of its ancestors most recently
// used, adding those not yet in the LRU list, so that ancestors end up
// more recent than the block.
func (c *trieCache) touchLocked(n *node) {
	c.tick++
	for ; n != nil && n.parent != nil; n = n.parent {
		n.used = c.tick
		if n.elem == nil {
			n.elem = c.lru.PushFront(n)
		} else {
			c.lru.MoveToFront(n.elem)
		}
	}
}

func (c *trieCache) evictLocked() {
	if c.capacity == 0 {
		return
	}
	for c.lru.Len() > c.capacity {
		n := c.lru.Remove(c.lru.Back()).(*node)
		if len(n.children) != 0 {
			// The ordering above makes this impossible; failing loudly
			// beats silently orphaning reachable blocks.
			panic("emulate: prefix cache evicted a block that has children")
		}
		p := n.parent
		delete(p.children, n.key)
		if p.parent == nil && len(p.children) == 0 {
			delete(c.roots, p.key)
		}
		if c.events != nil {
			c.events.removed([]uint64{n.hash}) // one event a block, as vLLM
		}
	}
}

// setEnabled turns the cache on or off. Turning it off also empties it,
// as restarting an engine without prefix caching would.
func (c *trieCache) setEnabled(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enabled = on
	if !on {
		c.flushLocked()
	}
}

func (c *trieCache) resize(capacity int) error {
	if capacity < 0 {
		return fmt.Errorf("capacity must not be negative, got %d", capacity)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capacity = capacity
	c.evictLocked()
	return nil
}

func (c *trieCache) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
}

func (c *trieCache) flushLocked() {
	if c.events != nil {
		c.events.cleared()
	}
	clear(c.roots)
	c.lru.Init()
}

func (c *trieCache) state() CacheState {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.lru.Len()
	return CacheState{Enabled: c.enabled, BlockSize: c.blockSize, CapacityBlocks: c.capacity, Blocks: n, Tokens: n * c.blockSize}
}
