package emulate

import (
	"container/list"
	"sync"
)

// prefixCache models vLLM's automatic prefix caching at the level that
// decides hit counts: a prompt is cut into full blocks of blockSize
// tokens, each block is named by a hash chained over its parent's hash
// and its own tokens (so equal hashes mean equal prefixes), and a lookup
// hits the longest run of leading blocks present. It keeps no KV data and
// no reference counts: a block in use by a running request may be evicted,
// which only matters when the capacity is smaller than the working set.
type prefixCache struct {
	blockSize int

	mu       sync.Mutex
	enabled  bool
	capacity int // blocks; 0 means unbounded
	index    map[uint64]*list.Element
	lru      list.List // of uint64 block hashes; front is most recently used
}

func newPrefixCache(blockSize, capacity int, enabled bool) *prefixCache {
	return &prefixCache{
		blockSize: blockSize,
		enabled:   enabled,
		capacity:  capacity,
		index:     make(map[uint64]*list.Element),
	}
}

// FNV-1a, 64 bit: deterministic across runs and processes, unlike
// hash/maphash with a random seed, so block hashes can be compared in
// tests and logs.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func fnvUint64(h, v uint64) uint64 {
	for range 8 {
		h ^= v & 0xff
		h *= fnvPrime64
		v >>= 8
	}
	return h
}

func fnvUint32(h uint64, v uint32) uint64 {
	for range 4 {
		h ^= uint64(v & 0xff)
		h *= fnvPrime64
		v >>= 8
	}
	return h
}

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// blockHashes returns the chained hashes of the full blocks of tokens; a
// trailing partial block has none, since only full blocks are cached. A
// non-empty salt (vLLM's cache_salt) changes the root, so salted prompts
// share nothing with unsalted or differently salted ones. Token ids must
// fit in 32 bits (checked when a request is parsed).
func blockHashes(tokens []int, blockSize int, salt string) []uint64 {
	n := len(tokens) / blockSize
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	parent := fnvString(fnvOffset64, "kvload-emulate/root\x00"+salt)
	for b := range n {
		h := fnvUint64(fnvOffset64, parent)
		for _, t := range tokens[b*blockSize : (b+1)*blockSize] {
			h = fnvUint32(h, uint32(t))
		}
		out[b] = h
		parent = h
	}
	return out
}

// lookup returns how many leading tokens of a prompt of promptLen tokens
// with the given block hashes are cached. Like vLLM it never hits the
// whole prompt: at most promptLen-1 tokens, rounded down to whole blocks,
// because the last token is always recomputed to produce logits. Hit
// blocks become most recently used.
func (c *prefixCache) lookup(hashes []uint64, promptLen int) int {
	if promptLen <= 1 {
		return 0
	}
	maxBlocks := min(len(hashes), (promptLen-1)/c.blockSize)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled {
		return 0
	}
	hit := 0
	for hit < maxBlocks {
		if _, ok := c.index[hashes[hit]]; !ok {
			break
		}
		hit++
	}
	c.touchLocked(hashes[:hit])
	return hit * c.blockSize
}

// insert adds a prefilled prompt's blocks. If the prompt has more blocks
// than the capacity only its leading ones are kept, the only ones a later
// lookup can reach.
func (c *prefixCache) insert(hashes []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled {
		return
	}
	if c.capacity > 0 && len(hashes) > c.capacity {
		hashes = hashes[:c.capacity]
	}
	c.touchLocked(hashes)
	c.evictLocked()
}

// touchLocked makes a chain of blocks most recently used, adding missing
// ones. It goes from the last block to the first so that the root ends up
// most recent: eviction then takes a chain's tail before its head (as vLLM
// frees a request's blocks tail first), never orphaning reachable blocks
// behind an evicted parent.
func (c *prefixCache) touchLocked(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		if e, ok := c.index[hashes[i]]; ok {
			c.lru.MoveToFront(e)
			continue
		}
		c.index[hashes[i]] = c.lru.PushFront(hashes[i])
	}
}

func (c *prefixCache) evictLocked() {
	if c.capacity == 0 {
		return
	}
	for c.lru.Len() > c.capacity {
		e := c.lru.Back()
		delete(c.index, e.Value.(uint64))
		c.lru.Remove(e)
	}
}

// setEnabled turns the cache on or off. Turning it off also empties it,
// as restarting an engine without prefix caching would.
func (c *prefixCache) setEnabled(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enabled = on
	if !on {
		c.flushLocked()
	}
}

func (c *prefixCache) resize(capacity int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capacity = capacity
	c.evictLocked()
}

func (c *prefixCache) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
}

func (c *prefixCache) flushLocked() {
	clear(c.index)
	c.lru.Init()
}

// CacheState is the prefix cache's configuration and occupancy.
type CacheState struct {
	Enabled        bool `json:"enabled"`
	BlockSize      int  `json:"block_size"`
	CapacityBlocks int  `json:"capacity_blocks"` // 0 means unbounded
	Blocks         int  `json:"blocks"`          // blocks held now
}

func (c *prefixCache) state() CacheState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheState{Enabled: c.enabled, BlockSize: c.blockSize, CapacityBlocks: c.capacity, Blocks: c.lru.Len()}
}
