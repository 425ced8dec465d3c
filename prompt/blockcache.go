package prompt

import (
	"container/list"
	"encoding/binary"
	"sync"

	"github.com/bits-and-blooms/bloom/v3"
)

// blockCache is a byte-bounded LRU of built blocks, split into shards with
// their own locks so that many request goroutines rarely wait on each
// other. Entries are immutable once inserted, so a reader copies from the
// slice get returned after the lock is released.
//
// A block is stored only when it is built a second time since its shard's
// doorkeeper was last cleared (a Bloom filter, as in TinyLFU). Most rows
// of a trace end in a partial block no other row asks for: storing each
// would cost more than building it (a copy, three allocations) and push
// out the shared blocks the cache is for.
type blockCache struct {
	shards [cacheShards]cacheShard
}

const cacheShards = 32

// The doorkeepers remember one block per bytesPerRemembered bytes of the
// bound (131,072 for 8 MiB, some ten times the 64-token blocks the cache
// holds) at doorkeeperFalse false positives, in about 1.2 bytes each taken
// from the bound. A shard's doorkeeper is cleared once it has taken its
// share.
const (
	bytesPerRemembered = 64
	doorkeeperFalse    = 0.01
)

// entryOverhead is what an entry costs beyond its data: its item (80
// bytes), list element (48) and map slot (about 50), as
// TestPromptCacheHeapWithinBound measures.
const entryOverhead = 192

type cacheKey struct {
	ns  uint64
	h   int64
	n   int32
	ids bool
}

// bytes is k as the doorkeeper hashes it.
func (k cacheKey) bytes() [21]byte {
	var b [21]byte
	binary.LittleEndian.PutUint64(b[0:], k.ns)
	binary.LittleEndian.PutUint64(b[8:], uint64(k.h))
	binary.LittleEndian.PutUint32(b[16:], uint32(k.n))
	if k.ids {
		b[20] = 1
	}
	return b
}

type cacheEntry struct {
	text []byte
	ids  []int
}

func (e cacheEntry) size() int64 {
	return int64(cap(e.text)) + int64(cap(e.ids))*8 + entryOverhead
}

type cacheShard struct {
	mu    sync.Mutex
	limit int64
	used  int64
	order *list.List // front = most recently used; values are *cacheItem
	items map[cacheKey]*list.Element

	seen     *bloom.BloomFilter // blocks built since it was last cleared
	seenLeft int                // insertions before the next clear
	seenCap  int
}

type cacheItem struct {
	key   cacheKey
	entry cacheEntry
}

func newBlockCache(limit int64) *blockCache {
	c := &blockCache{}
	perShard := max(int(limit/bytesPerRemembered/cacheShards), 16)
	for i := range c.shards {
		s := &c.shards[i]
		s.seen = bloom.NewWithEstimates(uint(perShard), doorkeeperFalse)
		s.seenLeft, s.seenCap = perShard, perShard
		s.limit = max(limit/cacheShards-int64(s.seen.Cap()/8), 0)
		s.order = list.New()
		s.items = make(map[cacheKey]*list.Element)
	}
	return c
}

func (c *blockCache) shard(k cacheKey) *cacheShard {
	x := mix64(k.ns ^ uint64(k.h)*0x9e3779b97f4a7c15 ^ uint64(k.n)<<1)
	return &c.shards[x%cacheShards]
}

// get returns k's entry if the cache holds it. If not, admit says whether
// k was built before since the doorkeeper was last cleared; the building
// that follows this miss is counted.
func (c *blockCache) get(k cacheKey) (e cacheEntry, hit, admit bool) {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.items[k]; ok {
		s.order.MoveToFront(el)
		return el.Value.(*cacheItem).entry, true, false
	}
	key := k.bytes()
	if s.seen.TestOrAdd(key[:]) {
		return cacheEntry{}, false, true
	}
	if s.seenLeft--; s.seenLeft <= 0 {
		s.seen.ClearAll()
		s.seenLeft = s.seenCap
	}
	return cacheEntry{}, false, false
}

// put inserts e unless k is already there (another goroutine built the same
// block) or e alone exceeds the shard's share, then evicts from the back.
func (c *blockCache) put(k cacheKey, e cacheEntry) {
	s := c.shard(k)
	size := e.size()
	if size > s.limit {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.items[k]; ok {
		return
	}
	s.items[k] = s.order.PushFront(&cacheItem{key: k, entry: e})
	s.used += size
	for s.used > s.limit {
		back := s.order.Back()
		it := back.Value.(*cacheItem)
		s.order.Remove(back)
		delete(s.items, it.key)
		s.used -= it.entry.size()
	}
}

// cachedBytes reports the bytes the cache accounts for (tests).
func (c *blockCache) cachedBytes() int64 {
	var n int64
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.used
		s.mu.Unlock()
	}
	return n
}
