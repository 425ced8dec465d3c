package replay

import (
	"container/list"
	"sync"
)

// CacheModel is the ideal prefix cache of one (workload, target): what the
// server could have served from cache if it kept every block this workload
// sent it (capacity 0), or the most recently used capacity blocks.
//
// For one request, k is the number of its leading trace blocks already sent
// to the target; the theoretical cached tokens are
// floor(min(k·traceBlock, inputLength−1) / serverBlock) · serverBlock,
// the quantisation a block-granular engine such as vLLM applies (it caches
// full blocks only and always recomputes the last prompt token).
type CacheModel struct {
	traceBlock  int
	serverBlock int
	capacity    int // in server blocks; 0 = infinite

	mu     sync.Mutex
	index  map[blockKey]*list.Element
	lru    *list.List // front = most recently used; values are *cachedBlock
	used   int        // server blocks held
	newest uint64     // the highest namespace admitted so far
}

type blockKey struct {
	ns uint64
	id int64
}

type cachedBlock struct {
	key    blockKey
	weight int // server blocks this trace block occupies
}

// NewCacheModel returns an empty model. Sizes are in tokens; capacity is in
// server blocks, 0 for an unbounded cache.
func NewCacheModel(traceBlockSize, serverBlockSize, capacityBlocks int) *CacheModel {
	return &CacheModel{
		traceBlock:  max(traceBlockSize, 1),
		serverBlock: max(serverBlockSize, 1),
		capacity:    max(capacityBlocks, 0),
		index:       map[blockKey]*list.Element{},
		lru:         list.New(),
	}
}

// Admit records that a request with these hash ids (in namespace ns) and
// inputLength prompt tokens was sent, and returns the prompt tokens an ideal
// cache would have served for it.
func (m *CacheModel) Admit(ns uint64, ids []int64, inputLength int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ns > m.newest {
		m.newest = ns
		m.forgetBefore(ns - 1)
	}
	k := 0
	for _, id := range ids {
		if _, ok := m.index[blockKey{ns, id}]; !ok {
			break
		}
		k++
	}
	// Touch and insert from the last block back, so that a request's first
	// blocks are the most recently used: under pressure the tails of old
	// prompts go first and shared prefixes stay, as in vLLM's free queue.
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		key := blockKey{ns, id}
		if e, ok := m.index[key]; ok {
			m.lru.MoveToFront(e)
			continue
		}
		tokens := m.traceBlock
		if i == len(ids)-1 {
			tokens = inputLength - (len(ids)-1)*m.traceBlock
		}
		b := &cachedBlock{key: key, weight: max(tokens, 0) / m.serverBlock}
		m.index[key] = m.lru.PushFront(b)
		m.used += b.weight
	}
	m.evict()
	return theoreticalTokens(k, m.traceBlock, m.serverBlock, inputLength)
}

func (m *CacheModel) evict() {
	if m.capacity == 0 {
		return
	}
	for m.used > m.capacity && m.lru.Len() > 0 {
		e := m.lru.Back()
		b := e.Value.(*cachedBlock)
		m.lru.Remove(e)
		delete(m.index, b.key)
		m.used -= b.weight
	}
}

// forgetBefore drops, from an infinite model, the blocks of namespaces
// older than oldest. With loop: fresh every pass has a new namespace and no
// later request can hit an earlier pass's blocks, so an always-on daemon
// would otherwise grow by a whole trace's blocks every pass. The pass just
// before is kept: its last session turns may still be going out. A bounded
// model keeps its dead blocks, as a real server's LRU does, until evicted.
func (m *CacheModel) forgetBefore(oldest uint64) {
	if m.capacity != 0 || oldest == 0 {
		return
	}
	for e := m.lru.Front(); e != nil; {
		next := e.Next()
		if b := e.Value.(*cachedBlock); b.key.ns < oldest {
			m.lru.Remove(e)
			delete(m.index, b.key)
			m.used -= b.weight
		}
		e = next
	}
}

// Blocks returns how many trace blocks the model holds.
func (m *CacheModel) Blocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lru.Len()
}

func theoreticalTokens(k, traceBlock, serverBlock, inputLength int) int {
	hit := min(k*traceBlock, inputLength-1)
	if hit <= 0 {
		return 0
	}
	return hit / serverBlock * serverBlock
}
