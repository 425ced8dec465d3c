package emulate

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"unsafe"
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
//
// The blocks live in flat arrays indexed by block id, their tokens as
// 24-bit ids in one slab, and the trie's and the LRU list's links are ids:
// a block costs cacheBlockBytes plus tokenBytes a token plus its entry in
// children, and nothing in them is a pointer for the garbage collector to
// scan. A bounded cache never holds more than its capacity, so the arrays
// stop growing there; a flush gives them back.
type trieCache struct {
	blockSize int
	// partial (TensorRT-LLM) lets a hit end inside a cached block: the
	// longest common prefix with any cached child counts, not only
	// whole blocks.
	partial bool

	mu       sync.Mutex
	enabled  bool
	capacity int // blocks; 0 means unbounded (up to maxCacheBlocks)

	blocks []cacheBlock // by block id
	tokens []byte       // block id b's tokens, tokenBytes each, little-endian, from b*blockSize*tokenBytes
	free   int32        // a freed block id, the rest chained through nextSib; noBlock when none
	live   int          // blocks in the trie, all of them in the LRU list

	// children finds a block by its parent and the fingerprint of its
	// tokens; blocks whose fingerprints collide are chained through
	// sameKey, and the tokens decide.
	children map[childKey]int32
	seed     maphash.Seed
	fpMask   uint64 // all ones; tests clear it to make every fingerprint collide

	roots     map[string]int32 // root id by cache salt
	rootNodes []cacheRoot      // by root id
	freeRoots []int32

	newest, oldest int32  // the LRU list's ends; roots are not in it
	tick           uint64 // counts touches

	scratch []byte   // a block's tokens as bytes, to fingerprint
	evicted []uint64 // hashes of the blocks an insert evicted, told after the blocks it stored

	// events, when set, hears of every block stored and removed and of
	// every flush, under mu (vLLM's KV cache events).
	events cacheEvents
}

// noBlock is the id of no block.
const noBlock = -1

// maxCacheBlocks bounds the blocks a trie cache holds, so that block ids
// fit in 32 bits; capacity_blocks is checked against it.
const maxCacheBlocks = math.MaxInt32

// Token ids are kept in 24 bits: more than any real vocabulary needs
// (o200k_base has 200,019), and the server refuses larger ones.
const (
	tokenBytes = 3
	maxToken   = 1<<(8*tokenBytes) - 1
)

// nodeRef names a trie node: a block id, or ^id for a root.
type nodeRef int32

func rootRef(id int32) nodeRef   { return nodeRef(^id) }
func (r nodeRef) isRoot() bool   { return r < 0 }
func (r nodeRef) rootID() int32  { return int32(^r) }
func (r nodeRef) blockID() int32 { return int32(r) }
func blockRef(id int32) nodeRef  { return nodeRef(id) }

// cacheBlock is one cached block's place in the trie and the LRU list.
type cacheBlock struct {
	parent                 nodeRef
	firstChild, next, prev int32  // first child, and next and previous siblings
	newer, older           int32  // LRU neighbours
	sameKey                int32  // next block with the same childKey
	used                   uint64 // tick of the last touch
	fp                     uint64 // fingerprint of its tokens, its childKey with parent
	// hash names the block in KV events: FNV-1a of the parent's hash and
	// the block's tokens (of the salt, for a root), so that equal prefixes
	// under one salt always get equal names.
	hash uint64
}

// cacheBlockBytes is what a block costs beyond its tokens and its entry
// in children (docs/reliability.md has the measured total).
const cacheBlockBytes = int(unsafe.Sizeof(cacheBlock{}))

// cacheRoot is a salt's root: its first blocks hang from it.
type cacheRoot struct {
	salt       string
	firstChild int32
	hash       uint64
}

type childKey struct {
	parent nodeRef
	fp     uint64
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
		free: noBlock, newest: noBlock, oldest: noBlock, fpMask: math.MaxUint64,
		children: make(map[childKey]int32), seed: maphash.MakeSeed(), roots: make(map[string]int32)}
}

// appendChunkKey encodes a block's tokens exactly: uvarints are
// prefix-free, so different token sequences never share a key.
func appendChunkKey(b []byte, tokens []int) []byte {
	for _, t := range tokens {
		b = binary.AppendUvarint(b, uint64(t))
	}
	return b
}

func commonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// commonPrefixStored is commonPrefix of stored tokens and a prompt's.
func commonPrefixStored(a []byte, b []int) int {
	n := min(len(a)/tokenBytes, len(b))
	for i := range n {
		if storedToken(a, i) != b[i] {
			return i
		}
	}
	return n
}

func storedToken(a []byte, i int) int {
	return int(a[tokenBytes*i]) | int(a[tokenBytes*i+1])<<8 | int(a[tokenBytes*i+2])<<16
}

// appendStored appends tokens as stored; ok is false when one of them is
// outside 0..maxToken, which no block can hold.
func appendStored(b []byte, tokens []int) (_ []byte, ok bool) {
	for _, t := range tokens {
		if uint(t) > maxToken {
			return b, false
		}
		b = append(b, byte(t), byte(t>>8), byte(t>>16))
	}
	return b, true
}

// fingerprint hashes a block's tokens; ok is false when one of them is
// outside 0..maxToken, which no block can hold.
func (c *trieCache) fingerprint(chunk []int) (fp uint64, ok bool) {
	b, ok := appendStored(c.scratch[:0], chunk)
	c.scratch = b
	if !ok {
		return 0, false
	}
	return maphash.Bytes(c.seed, b) & c.fpMask, true
}

func (c *trieCache) blockTokens(id int32) []byte {
	n := c.blockSize * tokenBytes
	return c.tokens[int(id)*n : (int(id)+1)*n]
}

// child returns parent's child holding chunk, noBlock when none does.
func (c *trieCache) child(parent nodeRef, chunk []int, fp uint64) int32 {
	id, ok := c.children[childKey{parent, fp}]
	if !ok {
		return noBlock
	}
	for ; id != noBlock; id = c.blocks[id].sameKey {
		if commonPrefixStored(c.blockTokens(id), chunk) == len(chunk) {
			return id
		}
	}
	return noBlock
}

func (c *trieCache) firstChild(n nodeRef) *int32 {
	if n.isRoot() {
		return &c.rootNodes[n.rootID()].firstChild
	}
	return &c.blocks[n.blockID()].firstChild
}

func (c *trieCache) nodeHash(n nodeRef) uint64 {
	if n.isRoot() {
		return c.rootNodes[n.rootID()].hash
	}
	return c.blocks[n.blockID()].hash
}

func (c *trieCache) lookup(salt string, tokens []int) (int, claim) {
	cl := claim{salt: salt, tokens: tokens}
	maxHit := len(tokens) - 1
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled || maxHit <= 0 {
		return 0, cl
	}
	root, ok := c.roots[salt]
	if !ok {
		return 0, cl
	}
	n := rootRef(root)
	B := c.blockSize
	// Whole blocks first, as long as they stay within the cap: vLLM
	// recomputes a whole last block rather than hit the last token.
	hit := 0
	for hit+B <= maxHit {
		chunk := tokens[hit : hit+B]
		fp, ok := c.fingerprint(chunk)
		if !ok {
			break
		}
		child := c.child(n, chunk, fp)
		if child == noBlock {
			break
		}
		n, hit = blockRef(child), hit+B
	}
	last := n
	if c.partial && hit < maxHit {
		// Partial reuse: the best match inside one more cached block,
		// the most recently used on ties.
		best, bestLen := int32(noBlock), 0
		for ch := *c.firstChild(n); ch != noBlock; ch = c.blocks[ch].next {
			l := commonPrefixStored(c.blockTokens(ch), tokens[hit:maxHit])
			if l > bestLen || (l == bestLen && l > 0 && c.blocks[ch].used > c.blocks[best].used) {
				best, bestLen = ch, l
			}
		}
		if best != noBlock {
			last, hit = blockRef(best), hit+bestLen
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
	B := c.blockSize
	nb := len(cl.tokens) / B
	if c.capacity > 0 {
		// Only the leading blocks fit, the only ones a lookup can reach.
		nb = min(nb, c.capacity)
	}
	if nb == 0 {
		return
	}
	root, ok := c.roots[cl.salt]
	if !ok {
		root = c.newRoot(cl.salt)
	}
	// The blocks already cached become the most recent first, so that
	// making room for the new ones below never takes one of them: the
	// same blocks go as if every new block were added before evicting.
	n, cached := c.cachedPrefix(rootRef(root), cl.tokens[:nb*B])
	c.touchLocked(n)
	first, end := -1, nb // the first block this insert stores, and the end of those it walks
	var hashes []uint64
	c.evicted = c.evicted[:0]
	for b := cached; b < nb; b++ {
		chunk := cl.tokens[b*B : (b+1)*B]
		fp, ok := c.fingerprint(chunk)
		if !ok {
			end = b
			break
		}
		child := c.child(n, chunk, fp)
		if child == noBlock {
			if c.capacity > 0 && c.live >= c.capacity {
				c.evictOldestLocked(root)
			}
			child = c.newBlock(n, chunk, fp)
			if first < 0 {
				first = b
				if c.events != nil {
					hashes = make([]uint64, 0, nb-b)
				}
			}
			if c.events != nil {
				key := appendChunkKey(c.scratch[:0], chunk)
				c.blocks[child].hash = blockHash(c.nodeHash(n), key)
				c.scratch = key
				hashes = append(hashes, c.blocks[child].hash)
			}
		}
		n = blockRef(child)
	}
	if c.events != nil && first >= 0 {
		// Once one block is new, so are all after it: one event for the
		// run, linked to the block before it, as vLLM sends a prefill's.
		p := c.blocks[n.blockID()].parent
		for range len(hashes) - 1 {
			p = c.blocks[p.blockID()].parent
		}
		c.events.stored(cl.salt, c.nodeHash(p), !p.isRoot(), hashes,
			slices.Clone(cl.tokens[first*B:end*B]), B)
	}
	if c.events != nil {
		for _, h := range c.evicted {
			c.events.removed([]uint64{h}) // one event a block, as vLLM
		}
	}
	c.touchLocked(n)
	if *c.firstChild(rootRef(root)) == noBlock {
		c.deleteRoot(root) // nothing could be stored under a new root
	}
}

// cachedPrefix returns the deepest of tokens' whole blocks cached under
// n (n itself when none is), and how many blocks it is down from n.
func (c *trieCache) cachedPrefix(n nodeRef, tokens []int) (nodeRef, int) {
	B := c.blockSize
	k := 0
	for ; (k+1)*B <= len(tokens); k++ {
		chunk := tokens[k*B : (k+1)*B]
		fp, ok := c.fingerprint(chunk)
		if !ok {
			break
		}
		child := c.child(n, chunk, fp)
		if child == noBlock {
			break
		}
		n = blockRef(child)
	}
	return n, k
}

func (c *trieCache) release(claim) {}

func (c *trieCache) newRoot(salt string) int32 {
	r := cacheRoot{salt: salt, firstChild: noBlock}
	if c.events != nil {
		r.hash = rootHash(salt)
	}
	var id int32
	if k := len(c.freeRoots); k > 0 {
		id = c.freeRoots[k-1]
		c.freeRoots = c.freeRoots[:k-1]
		c.rootNodes[id] = r
	} else {
		id = int32(len(c.rootNodes))
		c.rootNodes = append(c.rootNodes, r)
	}
	c.roots[salt] = id
	return id
}

func (c *trieCache) deleteRoot(id int32) {
	delete(c.roots, c.rootNodes[id].salt)
	c.rootNodes[id] = cacheRoot{firstChild: noBlock}
	c.freeRoots = append(c.freeRoots, id)
}

// newBlock adds a block holding chunk under parent, most recently used.
func (c *trieCache) newBlock(parent nodeRef, chunk []int, fp uint64) int32 {
	id := c.allocBlock()
	appendStored(c.blockTokens(id)[:0], chunk)
	head := c.firstChild(parent)
	b := cacheBlock{parent: parent, firstChild: noBlock, next: *head, prev: noBlock,
		newer: noBlock, older: c.newest, sameKey: noBlock, fp: fp}
	if *head != noBlock {
		c.blocks[*head].prev = id
	}
	*head = id
	key := childKey{parent, fp}
	if same, ok := c.children[key]; ok {
		b.sameKey = same
	}
	c.children[key] = id
	if c.newest != noBlock {
		c.blocks[c.newest].newer = id
	} else {
		c.oldest = id
	}
	c.newest = id
	c.blocks[id] = b
	c.live++
	return id
}

// allocBlock returns an unused block id, reusing freed ones first; a
// bounded cache's arrays grow up to its capacity, not beyond.
func (c *trieCache) allocBlock() int32 {
	if id := c.free; id != noBlock {
		c.free = c.blocks[id].next
		return id
	}
	n := len(c.blocks)
	if n == maxCacheBlocks {
		panic("emulate: prefix cache holds 2^31-1 blocks")
	}
	perBlock := c.blockSize * tokenBytes
	if n == cap(c.blocks) || (n+1)*perBlock > cap(c.tokens) {
		want := max(2*n, 64)
		if c.capacity > 0 {
			want = max(min(want, c.capacity), n+1)
		}
		want = min(want, maxCacheBlocks)
		c.blocks = resized(c.blocks, want)
		c.tokens = resized(c.tokens, want*perBlock)
	}
	c.blocks = c.blocks[:n+1]
	c.tokens = c.tokens[:(n+1)*perBlock]
	return int32(n)
}

// resized returns s with a capacity of exactly n (append would round it
// up by as much as a quarter).
func resized[S ~[]E, E any](s S, n int) S {
	t := make(S, len(s), n)
	copy(t, s)
	return t
}

// touchLocked makes a block and then each of its ancestors most recently
// used, so that ancestors end up more recent than the block.
func (c *trieCache) touchLocked(n nodeRef) {
	c.tick++
	for ; !n.isRoot(); n = c.blocks[n.blockID()].parent {
		id := n.blockID()
		c.blocks[id].used = c.tick
		c.unlinkLRU(id)
		c.pushNewest(id)
	}
}

func (c *trieCache) unlinkLRU(id int32) {
	b := &c.blocks[id]
	if b.newer != noBlock {
		c.blocks[b.newer].older = b.older
	} else {
		c.newest = b.older
	}
	if b.older != noBlock {
		c.blocks[b.older].newer = b.newer
	} else {
		c.oldest = b.newer
	}
	b.newer, b.older = noBlock, noBlock
}

func (c *trieCache) pushNewest(id int32) {
	c.blocks[id].older = c.newest
	if c.newest != noBlock {
		c.blocks[c.newest].newer = id
	} else {
		c.oldest = id
	}
	c.newest = id
}

func (c *trieCache) evictLocked() {
	if c.capacity == 0 {
		return
	}
	c.evicted = c.evicted[:0]
	for c.live > c.capacity {
		c.evictOldestLocked(noBlock)
	}
	if c.events != nil {
		for _, h := range c.evicted {
			c.events.removed([]uint64{h}) // one event a block, as vLLM
		}
	}
}

// evictOldestLocked evicts the least recently used block, noting its
// hash in evicted, and deletes its root if that empties it, unless the
// root is keep (an insert is adding blocks under it).
func (c *trieCache) evictOldestLocked(keep int32) {
	id := c.oldest
	b := &c.blocks[id]
	if b.firstChild != noBlock {
		// The ordering above makes this impossible; failing loudly
		// beats silently orphaning reachable blocks.
		panic("emulate: prefix cache evicted a block that has children")
	}
	c.unlinkLRU(id)
	// Off its parent's children.
	if b.prev != noBlock {
		c.blocks[b.prev].next = b.next
	} else {
		*c.firstChild(b.parent) = b.next
	}
	if b.next != noBlock {
		c.blocks[b.next].prev = b.prev
	}
	// Out of children, and off its fingerprint's chain.
	key := childKey{b.parent, b.fp}
	if head := c.children[key]; head == id {
		if b.sameKey != noBlock {
			c.children[key] = b.sameKey
		} else {
			delete(c.children, key)
		}
	} else {
		for p := head; ; p = c.blocks[p].sameKey {
			if c.blocks[p].sameKey == id {
				c.blocks[p].sameKey = b.sameKey
				break
			}
		}
	}
	if b.parent.isRoot() && *c.firstChild(b.parent) == noBlock && b.parent.rootID() != keep {
		c.deleteRoot(b.parent.rootID())
	}
	if c.events != nil {
		c.evicted = append(c.evicted, b.hash)
	}
	*b = cacheBlock{next: c.free}
	c.free = id
	c.live--
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
	if capacity < 0 || capacity > maxCacheBlocks {
		return fmt.Errorf("capacity must be in 0..%d, got %d", maxCacheBlocks, capacity)
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

// flushLocked empties the cache and gives its arrays back.
func (c *trieCache) flushLocked() {
	if c.events != nil {
		c.events.cleared()
	}
	c.blocks, c.tokens, c.rootNodes, c.freeRoots = nil, nil, nil, nil
	c.children = make(map[childKey]int32)
	c.roots = make(map[string]int32)
	c.free, c.newest, c.oldest, c.live = noBlock, noBlock, noBlock, 0
}

func (c *trieCache) state() CacheState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheState{Enabled: c.enabled, BlockSize: c.blockSize, CapacityBlocks: c.capacity, Blocks: c.live, Tokens: c.live * c.blockSize}
}
