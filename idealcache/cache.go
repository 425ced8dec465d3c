package idealcache

import (
	"container/list"
	"math"
)

// BlockKey names a trace block in an ideal cache: the namespace of its pass
// (a pass of loop fresh is a namespace of its own) and the key of the whole
// chain of blocks up to it (ChainKey), as an engine keys its prefix cache:
// an id after another prefix is another block.
type BlockKey struct {
	NS    uint64
	Chain uint64 // ChainKey of the block and its prefix
}

// Cache is the ideal prefix cache itself: trace blocks by BlockKey, in LRU
// order, each weighing the server blocks it fills (Rounding.BlockWeight),
// at most Params.CapacityBlocks of them (none when 0: unbounded). It is not
// safe for concurrent use; its owner serialises the visits.
type Cache struct {
	p      Params
	round  Rounding // p's rounding rules
	index  map[BlockKey]*list.Element
	lru    *list.List // front = most recently used; values are *cachedBlock
	used   int        // server blocks held
	newest uint64     // the highest namespace admitted so far
	seq    uint64     // visits so far
}

type cachedBlock struct {
	key    BlockKey
	weight int    // server blocks this trace block occupies
	seq    uint64 // the last visit that touched it
	// assumed: only rows from before the model started touched it, so the
	// server holds it only if someone really sent those rows.
	assumed bool
}

// Admission is what one visit of a Cache did, and what it found: the
// theoretical cached tokens of the request, with and without the blocks
// only assumed sent, and what the warm-up (WarmUp) needs to place its hit
// on a server that holds only part of those.
type Admission struct {
	Tokens int // theoretical cached tokens, every block present counted
	Cold   int // the same without the blocks only assumed sent
	// Profile is the request's hit at every capacity, where a Profile
	// followed the same visit and its owner put it here.
	Profile CapacityProfile

	seq      uint64
	inserted []BlockKey
	// steps are where the hit ends on a server that holds only part of
	// what was assumed sent (WarmUp); none for a row of the warm-up.
	steps []warmStep
}

// NewCache returns an empty cache of p; block sizes under 1 count as 1 and a
// negative capacity as unbounded.
func NewCache(p Params) *Cache {
	p.TraceBlock = max(p.TraceBlock, 1)
	p.ServerBlock = max(p.ServerBlock, 1)
	p.CapacityBlocks = max(p.CapacityBlocks, 0)
	return &Cache{
		p:     p,
		round: Rounding{TraceBlock: p.TraceBlock, ServerBlock: p.ServerBlock, Granularity: p.Granularity},
		index: map[BlockKey]*list.Element{},
		lru:   list.New(),
	}
}

// Params is the cache as it counts: p of NewCache, block sizes of at least 1.
func (c *Cache) Params() Params { return c.p }

// Rounding is the rules the cache rounds hits and weighs blocks by.
func (c *Cache) Rounding() Rounding { return c.round }

// Visit looks a request up by its blocks' chain keys (AppendChainKeys) in
// namespace ns and, when insert is set, adds its blocks; warm marks a row
// from before the model started, which is assumed sent. A visit that
// inserts into a newer namespace first forgets what ForgetBefore would of
// the namespaces before the one just before it.
func (c *Cache) Visit(ns uint64, keys []uint64, inputLength int, insert, warm bool) Admission {
	c.seq++
	a := Admission{seq: c.seq}
	if insert && ns > c.newest {
		c.newest = ns
		c.ForgetBefore(ns - 1)
	}
	// k counts the leading blocks present; cold those before the first
	// one only assumed sent, which a server that never got the warm-up's
	// rows lacks, and with it every block after.
	k, cold := 0, -1
	oldest := uint64(math.MaxUint64) // the oldest last touch of an assumed block so far
	for _, chain := range keys {
		e, ok := c.index[BlockKey{ns, chain}]
		if !ok {
			break
		}
		if b := e.Value.(*cachedBlock); b.assumed && b.seq < oldest {
			if cold < 0 {
				cold = k
			}
			oldest = b.seq
			if !warm {
				a.steps = append(a.steps, warmStep{touched: oldest, tokens: c.round.CachedTokens(k, inputLength)})
			}
		}
		k++
	}
	a.Tokens = c.round.CachedTokens(k, inputLength)
	a.Cold = a.Tokens
	if cold >= 0 {
		a.Cold = c.round.CachedTokens(cold, inputLength)
	}
	if !insert {
		return a
	}
	// Touch and insert from the last block back, so that a request's first
	// blocks are the most recently used: under pressure the tails of old
	// prompts go first and shared prefixes stay, as in vLLM's free queue.
	for i := len(keys) - 1; i >= 0; i-- {
		key := BlockKey{ns, keys[i]}
		if e, ok := c.index[key]; ok {
			b := e.Value.(*cachedBlock)
			b.seq = c.seq
			b.assumed = b.assumed && warm
			c.lru.MoveToFront(e)
			continue
		}
		weight := c.round.BlockWeight(c.round.BlockTokens(i, len(keys), inputLength))
		b := &cachedBlock{key: key, weight: weight, seq: c.seq, assumed: warm}
		c.index[key] = c.lru.PushFront(b)
		c.used += b.weight
		a.inserted = append(a.inserted, key)
	}
	c.evict()
	return a
}

// Unadmit takes out the blocks a's visit added, unless a later visit used
// them: the request never reached the server.
func (c *Cache) Unadmit(a Admission) {
	for _, key := range a.inserted {
		if e, ok := c.addedBy(key, a); ok {
			c.remove(e)
		}
	}
}

// addedBy finds key where a's visit added it and no later visit used it.
func (c *Cache) addedBy(key BlockKey, a Admission) (*list.Element, bool) {
	e, ok := c.index[key]
	if !ok || e.Value.(*cachedBlock).seq != a.seq {
		return nil, false
	}
	return e, true
}

func (c *Cache) remove(e *list.Element) {
	b := e.Value.(*cachedBlock)
	c.lru.Remove(e)
	delete(c.index, b.key)
	c.used -= b.weight
}

func (c *Cache) evict() {
	if c.p.CapacityBlocks == 0 {
		return
	}
	// Weights alone do not bound a cache: see Rounding.MaxEntries.
	for (c.used > c.p.CapacityBlocks || c.lru.Len() > c.round.MaxEntries(c.p.CapacityBlocks)) && c.lru.Len() > 0 {
		c.remove(c.lru.Back())
	}
}

// ForgetBefore drops, from an unbounded cache, the blocks of namespaces
// older than oldest. With loop: fresh every pass has a new namespace and no
// later request can hit an earlier pass's blocks, so an always-on daemon
// would otherwise grow by a whole trace's blocks every pass. Visit keeps
// the pass just before the newest: its last session turns may still be
// going out. A bounded cache keeps its dead blocks, as a real server's LRU
// does, until evicted.
func (c *Cache) ForgetBefore(oldest uint64) {
	if c.p.CapacityBlocks != 0 || oldest == 0 {
		return
	}
	for e := c.lru.Front(); e != nil; {
		next := e.Next()
		if e.Value.(*cachedBlock).key.NS < oldest {
			c.remove(e)
		}
		e = next
	}
}

// Len is the number of trace blocks held.
func (c *Cache) Len() int { return c.lru.Len() }
