package emulate

import (
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"testing"
)

// A repeated prompt of n tokens hits floor((n-1)/B)*B tokens: full blocks
// only, and never the last token.
func TestCacheRepeatedPrompt(t *testing.T) {
	const B = 16
	for _, n := range []int{1, 2, 15, 16, 17, 31, 32, 33, 100, 513} {
		e, srv := newTestServer(t, Config{BlockSize: B})
		prompt := seq(7, n)
		if u := complete(t, srv.URL, prompt, nil); u.cached(t) != 0 {
			t.Fatalf("n=%d: cold request hit %d", n, u.cached(t))
		}
		want := (n - 1) / B * B
		if u := complete(t, srv.URL, prompt, nil); u.cached(t) != want {
			t.Fatalf("n=%d: second request hit %d, want %d", n, u.cached(t), want)
		}
		if st := e.Stats(); st.CachedTokens != int64(want) || st.CacheHitTokens != int64(want) || st.CacheQueryTokens != int64(2*n) {
			t.Fatalf("n=%d: stats %+v", n, st)
		}
	}
}

func TestCacheSharedPrefixes(t *testing.T) {
	const B = 16
	base := seq(1, 5*B+3) // five full blocks and a partial one
	tests := []struct {
		name   string
		prompt []int
		want   int
	}{
		{"shares three full blocks", append(append([]int(nil), base[:3*B]...), seq(50000, 40)...), 3 * B},
		{"shares all five full blocks", append(append([]int(nil), base[:5*B]...), seq(50000, 40)...), 5 * B},
		// The partial sixth block of base was never cached, so sharing
		// 5 blocks and 3 tokens still hits 5 blocks.
		{"partial block never hits", append(append([]int(nil), base...), seq(50000, 40)...), 5 * B},
		{"differs inside the first block", append([]int{99999}, base[1:]...), 0},
		{"differs in the third block", append(append(append([]int(nil), base[:2*B+5]...), 99999), base[2*B+6:]...), 2 * B},
		{"shorter than a block", base[:B-1], 0},
		{"exactly two blocks: last token recomputed", base[:2*B], B},
		{"two blocks and one token", base[:2*B+1], 2 * B},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, srv := newTestServer(t, Config{BlockSize: B})
			complete(t, srv.URL, base, nil)
			if got := complete(t, srv.URL, tt.prompt, nil).cached(t); got != tt.want {
				t.Fatalf("hit %d, want %d", got, tt.want)
			}
		})
	}
}

func TestCacheSalt(t *testing.T) {
	_, srv := newTestServer(t, Config{BlockSize: 4})
	p := seq(1, 13)
	complete(t, srv.URL, p, nil)
	if got := complete(t, srv.URL, p, map[string]any{"cache_salt": "a"}).cached(t); got != 0 {
		t.Fatalf("salted prompt hit the unsalted one: %d", got)
	}
	if got := complete(t, srv.URL, p, map[string]any{"cache_salt": "a"}).cached(t); got != 12 {
		t.Fatalf("same salt hit %d, want 12", got)
	}
	if got := complete(t, srv.URL, p, map[string]any{"cache_salt": "b"}).cached(t); got != 0 {
		t.Fatalf("other salt hit %d", got)
	}
}

func TestCacheLRUEviction(t *testing.T) {
	const B = 4
	e, srv := newTestServer(t, Config{BlockSize: B, CapacityBlocks: 4})
	a, b, c := seq(100, 2*B+1), seq(200, 2*B+1), seq(300, 2*B+1) // two blocks each
	complete(t, srv.URL, a, nil)
	complete(t, srv.URL, b, nil)
	if got := e.Stats().Cache.Blocks; got != 4 {
		t.Fatalf("%d blocks cached, want 4", got)
	}
	// Touch a, so b is the least recently used.
	if got := complete(t, srv.URL, a, nil).cached(t); got != 2*B {
		t.Fatalf("a hit %d", got)
	}
	complete(t, srv.URL, c, nil) // evicts b
	if got := e.Stats().Cache.Blocks; got != 4 {
		t.Fatalf("%d blocks cached, want 4", got)
	}
	if got := complete(t, srv.URL, a, nil).cached(t); got != 2*B {
		t.Fatalf("a hit %d after c, want %d", got, 2*B)
	}
	if got := complete(t, srv.URL, c, nil).cached(t); got != 2*B {
		t.Fatalf("c hit %d, want %d", got, 2*B)
	}
	if got := complete(t, srv.URL, b, nil).cached(t); got != 0 {
		t.Fatalf("b hit %d after eviction, want 0", got)
	}
}

// A chain's tail goes before its head, so a long prompt under pressure
// keeps a reachable prefix rather than orphaned blocks.
func TestCacheEvictsTailFirst(t *testing.T) {
	c := newTrieCache(1, 3, false, true)
	c.insert(claim{tokens: seq(1, 4)}) // 4 blocks, capacity 3: the first 3 kept
	if got, _ := c.lookup("", seq(1, 5)); got != 3 {
		t.Fatalf("hit %d, want the first 3 blocks", got)
	}
	c.insert(claim{tokens: seq(100, 2)}) // must evict a's tail, not its head
	if got, _ := c.lookup("", seq(1, 5)); got != 1 {
		t.Fatalf("hit %d after pressure, want 1 (a's head)", got)
	}
}

func TestCacheControl(t *testing.T) {
	const B = 4
	e, srv := newTestServer(t, Config{BlockSize: B})
	p := seq(1, 3*B+1)
	warm := func() int {
		complete(t, srv.URL, p, nil)
		return complete(t, srv.URL, p, nil).cached(t)
	}
	if got := warm(); got != 3*B {
		t.Fatalf("warm hit %d", got)
	}

	e.SetCacheEnabled(false)
	if got := warm(); got != 0 {
		t.Fatalf("disabled cache hit %d", got)
	}
	if st := e.Stats(); st.Cache.Enabled || st.Cache.Blocks != 0 {
		t.Fatalf("disabled cache state %+v", st.Cache)
	}
	e.SetCacheEnabled(true)
	if got := warm(); got != 3*B {
		t.Fatalf("re-enabled cache hit %d", got)
	}

	e.Flush()
	if got := e.Stats().Cache.Blocks; got != 0 {
		t.Fatalf("%d blocks after flush", got)
	}
	if got := complete(t, srv.URL, p, nil).cached(t); got != 0 {
		t.Fatalf("hit %d after flush", got)
	}

	if err := e.Resize(1); err != nil {
		t.Fatal(err)
	}
	if got := e.Stats().Cache.Blocks; got != 1 {
		t.Fatalf("%d blocks after resize to 1", got)
	}
	if err := e.Resize(-1); err == nil {
		t.Fatal("Resize(-1) succeeded")
	}

	// The same through HTTP.
	var st CacheState
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"capacity_blocks": 0}, http.StatusOK, &st)
	if st.CapacityBlocks != 0 || !st.Enabled {
		t.Fatalf("state %+v", st)
	}
	complete(t, srv.URL, p, nil)
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"flush": true}, http.StatusOK, &st)
	if st.Blocks != 0 {
		t.Fatalf("state after flush %+v", st)
	}
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"enabled": false}, http.StatusOK, &st)
	if st.Enabled {
		t.Fatalf("state %+v", st)
	}
	if got := warm(); got != 0 {
		t.Fatalf("disabled over HTTP, hit %d", got)
	}
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"capacity_blocks": -3}, http.StatusBadRequest, nil)

	var stats Stats
	resp, err := http.Get(srv.URL + "/emulator/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := decodeJSON(resp, &stats); err != nil {
		t.Fatal(err)
	}
	if want := e.Stats(); stats != want {
		t.Fatalf("GET /emulator/stats %+v, Stats() %+v", stats, want)
	}
}

// Blocks are found by their exact tokens, not by their fingerprints:
// with every fingerprint made to collide, every hit still matches the
// reference, and a bounded cache keeps its invariants.
func TestTrieFingerprintCollisions(t *testing.T) {
	collide := func(c *trieCache) { c.fpMask = 0 }
	for _, s := range referenceShapes {
		for seed := range uint64(5) {
			ops := randomOps(rand.New(rand.NewPCG(seed, uint64(s.block))), 150)
			checkAgainstReference(t, s.p, s.block, ops, collide)
		}
	}
	c := newTrieCache(2, 5, false, true)
	collide(c)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, op := range randomOps(rng, 300) {
		_, cl := c.lookup(op.salt, op.tokens)
		c.insert(cl)
		checkTrie(t, c)
	}
}

// Token ids beyond 24 bits, which the server refuses, are never stored
// and never hit; the blocks before them still are.
func TestTrieTokensBeyond32Bits(t *testing.T) {
	c := newTrieCache(2, 0, false, true)
	p := []int{1, 2, 3, 1 << 24, 5, 6, 7}
	_, cl := c.lookup("", p)
	c.insert(cl)
	if got, _ := c.lookup("", p); got != 2 {
		t.Fatalf("hit %d, want the 2 tokens before the 25-bit one", got)
	}
	if st := c.state(); st.Blocks != 1 {
		t.Fatalf("state %+v, want the one block before it", st)
	}
	q := []int{-1, 2, 3}
	_, cl = c.lookup("s", q)
	c.insert(cl)
	if st := c.state(); st.Blocks != 1 || len(c.roots) != 1 {
		t.Fatalf("state %+v with roots %v: nothing should be stored under salt s", st, c.roots)
	}
	checkTrie(t, c)
}

// cat joins token sequences, for hand-made prompts.
func cat(parts ...[]int) []int { return slices.Concat(parts...) }

// Each personality's hit arithmetic on hand-made prompts. The wants are
// worked out by hand from each engine's rule, not from the code.
func TestPersonalityHits(t *testing.T) {
	type step struct {
		prompt []int
		want   int
	}
	tests := []struct {
		name   string
		p      Personality
		block  int
		cached [][]int // inserted first, in order
		steps  []step  // looked up afterwards (lookups insert nothing)
	}{
		{"vllm: full blocks only", PersonalityVLLM, 4, [][]int{seq(1, 10)}, []step{
			{seq(1, 10), 8},                    // 2 full blocks; 9,10 were never a full block
			{seq(1, 9), 8},                     // cap 8 tokens: 2 blocks
			{seq(1, 8), 4},                     // cap 7: the second block is recomputed whole
			{cat(seq(1, 6), []int{99, 98}), 4}, // differs inside block 2
			{cat([]int{1, 2, 3}, seq(90, 5)), 0},
			{seq(2, 10), 0},
			{seq(1, 1), 0},
		}},
		{"vllm: default 16-token blocks", PersonalityVLLM, 0, [][]int{seq(1, 40)}, []step{
			{seq(1, 40), 32},
			{seq(1, 33), 32},
			{seq(1, 32), 16},
			{cat(seq(1, 20), seq(500, 20)), 16},
		}},
		{"sglang: token granular", PersonalitySGLang, 0, [][]int{{1, 2, 3, 4, 5}, {1, 2, 7, 8}}, []step{
			{[]int{1, 2, 3, 9, 9}, 3},
			{[]int{1, 2, 3, 4, 5}, 4}, // the last token is recomputed
			{seq(1, 7), 5},
			{[]int{1, 2, 7, 8, 9}, 4}, // the second prompt's branch
			{[]int{1, 2, 9}, 2},
			{[]int{2, 3}, 0},
			{[]int{1}, 0},
		}},
		{"trtllm: partial reuse inside a block", PersonalityTRTLLM, 4, [][]int{seq(1, 10)}, []step{
			{cat(seq(1, 6), []int{99, 98}), 6}, // one block and 2 tokens of the next
			{seq(1, 10), 8},                    // 9,10 were never a full block
			{seq(1, 8), 7},                     // capped at prompt-1, inside block 2
			{[]int{1, 2, 99}, 2},               // partial match in the first block
			{[]int{5, 6, 7, 8}, 0},             // blocks are position-bound
		}},
		{"trtllm: default 32-token blocks", PersonalityTRTLLM, 0, [][]int{seq(1, 70)}, []step{
			{cat(seq(1, 40), seq(900, 10)), 40},
			{seq(1, 70), 64},
			{cat(seq(1, 5), seq(900, 40)), 5},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Config{Engine: tt.p, BlockSize: tt.block}.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			c := newPrefixCache(cfg.Engine, cfg.BlockSize, 0, cfg.Slots, true)
			for _, p := range tt.cached {
				_, cl := c.lookup("", p)
				c.insert(cl)
			}
			for _, s := range tt.steps {
				if got, cl := c.lookup("", s.prompt); got != s.want {
					t.Errorf("prompt %v: hit %d, want %d", s.prompt, got, s.want)
				} else {
					c.release(cl)
				}
			}
		})
	}
}

// Least recently used leaves go first, a prefix never before its
// extension, and the capacity always holds.
func TestTrieEvictionOrder(t *testing.T) {
	c := newTrieCache(1, 4, false, true)
	put := func(p []int) { c.insert(claim{tokens: p}) }
	hit := func(p []int) int { h, _ := c.lookup("", append(slices.Clone(p), -1)); return h }

	put([]int{1, 2, 3}) // blocks 1, 1.2, 1.2.3
	put([]int{1, 2, 9}) // adds 1.2.9: 4 blocks
	if st := c.state(); st.Blocks != 4 || st.Tokens != 4 {
		t.Fatalf("state %+v", st)
	}
	// 1.2.3 is now the least recently used block; 1 and 1.2 are more
	// recent, since each touch of a leaf touches its ancestors after it.
	put([]int{5})
	if hit([]int{1, 2, 3}) != 2 || hit([]int{1, 2, 9}) != 3 || hit([]int{5}) != 1 {
		t.Fatalf("after one eviction: hits %d %d %d", hit([]int{1, 2, 3}), hit([]int{1, 2, 9}), hit([]int{5}))
	}
	// Touching 1.2.9 leaves 5 the least recently used leaf.
	hit([]int{1, 2, 9})
	put([]int{6})
	if hit([]int{5}) != 0 || hit([]int{1, 2, 9}) != 3 || hit([]int{6}) != 1 {
		t.Fatal("5 should have gone, not the older prefix 1.2")
	}
	// A long prompt keeps its head under pressure: its tail blocks are
	// evicted first, even its own.
	put(seq(100, 6))
	if got := hit(seq(100, 6)); got != 4 {
		t.Fatalf("a 6-block prompt in 4 blocks hit %d, want its first 4", got)
	}
	if st := c.state(); st.Blocks != 4 {
		t.Fatalf("state %+v", st)
	}
	checkTrie(t, c)
}

// checkTrie verifies the trie's invariants: every block in the LRU list
// is reachable from its root and found by its tokens, and vice versa,
// parents are more recent than their children, the links agree both
// ways, every block id is live or free, and the capacity holds.
func checkTrie(t *testing.T, c *trieCache) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	pos := map[int32]int{}
	prev := int32(noBlock)
	for id := c.newest; id != noBlock; id = c.blocks[id].older {
		if c.blocks[id].newer != prev {
			t.Fatalf("LRU list: block %d's newer is %d, want %d", id, c.blocks[id].newer, prev)
		}
		pos[id] = len(pos)
		prev = id
	}
	if prev != c.oldest {
		t.Fatalf("LRU list ends at %d, oldest is %d", prev, c.oldest)
	}
	seen := 0
	var walk func(n nodeRef)
	walk = func(n nodeRef) {
		before := int32(noBlock)
		for ch := *c.firstChild(n); ch != noBlock; ch = c.blocks[ch].next {
			b := c.blocks[ch]
			if b.parent != n || b.prev != before {
				t.Fatalf("malformed block %d %+v under %d", ch, b, n)
			}
			before = ch
			chunk := make([]int, c.blockSize)
			for i := range chunk {
				chunk[i] = storedToken(c.blockTokens(ch), i)
			}
			if fp, _ := c.fingerprint(chunk); fp != b.fp || c.child(n, chunk, fp) != ch {
				t.Fatalf("block %d (%v) not found by its tokens", ch, chunk)
			}
			p, ok := pos[ch]
			if !ok {
				t.Fatalf("block %v reachable but not in the LRU list", chunk)
			}
			if !n.isRoot() && pos[n.blockID()] > p {
				t.Fatalf("block %v is more recent than its parent", chunk)
			}
			seen++
			walk(blockRef(ch))
		}
	}
	for salt, r := range c.roots {
		if c.rootNodes[r].salt != salt || c.rootNodes[r].firstChild == noBlock {
			t.Fatalf("root %q malformed or empty", salt)
		}
		walk(rootRef(r))
	}
	if seen != len(pos) || seen != c.live {
		t.Fatalf("%d reachable blocks, %d in the LRU list, %d live", seen, len(pos), c.live)
	}
	chained := 0
	for _, id := range c.children {
		for ; id != noBlock; id = c.blocks[id].sameKey {
			chained++
		}
	}
	free := 0
	for id := c.free; id != noBlock; id = c.blocks[id].next {
		free++
	}
	if chained != seen || free+seen != len(c.blocks) {
		t.Fatalf("%d blocks in children, %d free, %d live, %d ids", chained, free, seen, len(c.blocks))
	}
	if c.capacity > 0 && seen > c.capacity {
		t.Fatalf("%d blocks over capacity %d", seen, c.capacity)
	}
}

// refCache is the brute-force reference: every prompt ever inserted, kept
// whole, scanned linearly. It knows nothing of tries or blocks beyond each
// engine's rule for what a hit is.
type refCache struct {
	p       Personality
	block   int
	prompts []claim
}

func (r *refCache) lookup(salt string, tokens []int) int {
	n := len(tokens)
	if n <= 1 {
		return 0
	}
	best := 0
	for _, q := range r.prompts {
		if q.salt != salt {
			continue
		}
		// Only the full blocks of a cached prompt are kept.
		full := q.tokens[:len(q.tokens)/r.block*r.block]
		best = max(best, commonPrefix(full, tokens))
	}
	switch r.p {
	case PersonalityVLLM:
		return min(best/r.block*r.block, (n-1)/r.block*r.block)
	default: // sglang (block 1) and trtllm's partial reuse
		return min(best, n-1)
	}
}

// cacheOp is one step of a random workload: look a prompt up, then
// insert it or (when abandon is set) release it.
type cacheOp struct {
	salt    string
	tokens  []int
	abandon bool
}

// checkAgainstReference runs ops through an unbounded trie cache and the
// reference, comparing every hit, and checks the trie's invariants.
func checkAgainstReference(t *testing.T, p Personality, block int, ops []cacheOp, tune ...func(*trieCache)) {
	t.Helper()
	c := newTrieCache(block, 0, p == PersonalityTRTLLM, true)
	for _, f := range tune {
		f(c)
	}
	ref := &refCache{p: p, block: block}
	for i, op := range ops {
		want := ref.lookup(op.salt, op.tokens)
		got, cl := c.lookup(op.salt, op.tokens)
		if got != want {
			t.Fatalf("%s/%d op %d: prompt %v salt %q: hit %d, reference %d", p, block, i, op.tokens, op.salt, got, want)
		}
		if op.abandon {
			c.release(cl)
			continue
		}
		c.insert(cl)
		ref.prompts = append(ref.prompts, claim{salt: op.salt, tokens: op.tokens})
	}
	checkTrie(t, c)
}

// randomOps draws prompts from a tiny alphabet so that they share long
// prefixes, and branch from earlier prompts often.
func randomOps(rng *rand.Rand, n int) []cacheOp {
	var ops []cacheOp
	for range n {
		var tokens []int
		if len(ops) > 0 && rng.IntN(2) == 0 {
			prev := ops[rng.IntN(len(ops))].tokens
			tokens = slices.Clone(prev[:rng.IntN(len(prev)+1)])
		}
		for range rng.IntN(12) {
			tokens = append(tokens, rng.IntN(3))
		}
		ops = append(ops, cacheOp{salt: []string{"", "", "s"}[rng.IntN(3)], tokens: tokens, abandon: rng.IntN(8) == 0})
	}
	return ops
}

var referenceShapes = []struct {
	p     Personality
	block int
}{
	{PersonalityVLLM, 1}, {PersonalityVLLM, 2}, {PersonalityVLLM, 4},
	{PersonalitySGLang, 1},
	{PersonalityTRTLLM, 2}, {PersonalityTRTLLM, 3},
}

func TestTrieMatchesReference(t *testing.T) {
	for _, s := range referenceShapes {
		for seed := range uint64(20) {
			ops := randomOps(rand.New(rand.NewPCG(seed, uint64(s.block))), 150)
			checkAgainstReference(t, s.p, s.block, ops)
		}
	}
}

// FuzzTrieCache decodes ops from bytes: a byte < 3 is a token, 3 ends a
// prompt, 4 ends a salted prompt, 5 ends an abandoned one.
func FuzzTrieCache(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 0, 3, 0, 1, 2, 4, 0, 1, 2, 4})
	f.Add([]byte{1, 1, 1, 1, 5, 1, 1, 1, 1, 3, 1, 1, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		var ops []cacheOp
		var cur []int
		for _, b := range data {
			switch b % 6 {
			case 3, 4, 5:
				ops = append(ops, cacheOp{salt: map[bool]string{true: "s"}[b%6 == 4], tokens: cur, abandon: b%6 == 5})
				cur = nil
			default:
				cur = append(cur, int(b%6))
			}
		}
		for _, s := range referenceShapes {
			checkAgainstReference(t, s.p, s.block, ops)
		}
	})
}

// A bounded cache keeps its invariants under a random workload and never
// hits more than an unbounded one would.
func TestTrieBoundedInvariants(t *testing.T) {
	for _, s := range referenceShapes {
		for _, capacity := range []int{1, 3, 10} {
			rng := rand.New(rand.NewPCG(uint64(capacity), 7))
			c := newTrieCache(s.block, capacity, s.p == PersonalityTRTLLM, true)
			ref := &refCache{p: s.p, block: s.block}
			for _, op := range randomOps(rng, 300) {
				got, cl := c.lookup(op.salt, op.tokens)
				if want := ref.lookup(op.salt, op.tokens); got > want {
					t.Fatalf("bounded hit %d above unbounded %d", got, want)
				}
				c.insert(cl)
				ref.prompts = append(ref.prompts, claim{salt: op.salt, tokens: op.tokens})
				if rng.IntN(50) == 0 {
					if err := c.resize(rng.IntN(capacity + 1)); err != nil {
						t.Fatal(err)
					}
					checkTrie(t, c)
					_ = c.resize(capacity)
				}
			}
			checkTrie(t, c)
		}
	}
}

// A bounded cache's arrays stop at its capacity, however many blocks pass
// through it, and a flush gives them back.
func TestTrieArraysBoundedByCapacity(t *testing.T) {
	const capacity, block = 1000, 4
	c := newTrieCache(block, capacity, false, true)
	for i := range 500 {
		_, cl := c.lookup("", seq(i*1000, 37*block)) // 37 new blocks each
		c.insert(cl)
	}
	if st := c.state(); st.Blocks != capacity {
		t.Fatalf("state %+v, want a full cache", st)
	}
	// Beyond the capacity only the allocator's rounding to a size class.
	if len(c.blocks) != capacity || cap(c.blocks) > capacity*5/4 || cap(c.tokens) > capacity*5/4*block*tokenBytes {
		t.Fatalf("%d block ids, arrays of %d blocks and %d tokens, for a capacity of %d", len(c.blocks), cap(c.blocks), cap(c.tokens), capacity)
	}
	checkTrie(t, c)
	c.flush()
	if c.blocks != nil || c.tokens != nil || c.state().Blocks != 0 {
		t.Fatalf("after a flush: %d block ids, %d tokens, state %+v", len(c.blocks), len(c.tokens), c.state())
	}
}

// Salted prompts share nothing with other salts, at any granularity.
func TestCacheSaltIsolation(t *testing.T) {
	for _, p := range []Personality{PersonalityVLLM, PersonalitySGLang, PersonalityTRTLLM, PersonalityLlamaCpp} {
		t.Run(p.String(), func(t *testing.T) {
			block := 4
			if p == PersonalityLlamaCpp || p == PersonalitySGLang {
				block = 1
			}
			c := newPrefixCache(p, block, 0, 3, true) // llamacpp: a slot per salt

			prompt := seq(1, 13)
			_, cl := c.lookup("", prompt)
			c.insert(cl)
			for _, salt := range []string{"a", "b"} {
				if got, cl := c.lookup(salt, prompt); got != 0 {
					t.Fatalf("salt %q hit %d of the unsalted prompt", salt, got)
				} else {
					c.insert(cl)
				}
			}
			if got, cl := c.lookup("a", prompt); got != 12 {
				t.Fatalf("same salt hit %d, want 12", got)
			} else {
				c.release(cl)
			}
		})
	}
}

// A partial match that ties between blocks touches the most recently used
// one, whatever the map order, so eviction stays deterministic.
func TestTriePartialTieDeterministic(t *testing.T) {
	a, b := []int{1, 2, 3, 4}, []int{1, 2, 5, 6}
	for range 20 { // map order is random: a wrong pick would show
		c := newTrieCache(4, 2, true, true)
		c.insert(claim{tokens: b})
		c.insert(claim{tokens: a})
		c.lookup("", cat(b, []int{0})) // b is now the most recent
		if got, _ := c.lookup("", []int{1, 2, 9, 9, 9}); got != 2 {
			t.Fatalf("partial hit %d, want 2", got)
		}
		c.insert(claim{tokens: []int{7, 7, 7, 7}}) // evicts the least recent: a
		if got, _ := c.lookup("", cat(b, []int{0})); got != 4 {
			t.Fatalf("b hit %d after eviction, want 4", got)
		}
		if got, _ := c.lookup("", cat(a, []int{0})); got != 2 {
			t.Fatalf("a hit %d after eviction, want 2 (partially, through b)", got)
		}
	}
}

// BenchmarkPrefixCache looks up and inserts 2,048-token prompts that
// share half their tokens with the previous one, per personality.
func BenchmarkPrefixCache(b *testing.B) {
	for _, p := range []Personality{PersonalityVLLM, PersonalitySGLang, PersonalityTRTLLM} {
		b.Run(p.String(), func(b *testing.B) {
			c := newPrefixCache(p, p.defaultBlockSize(), 1<<16, 0, true)
			prompts := make([][]int, 64)
			for i := range prompts {
				prompts[i] = cat(seq(0, 1024), seq(10_000+i*1024, 1024))
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_, cl := c.lookup("", prompts[i%len(prompts)])
				c.insert(cl)
				i++
			}
		})
	}
}

// The cache's memory is sized by bytes: a full quickstart-sized cache
// (64-token blocks) costs what docs/reliability.md's limits table says a
// block costs, measured on the live heap.
func TestTrieBytesPerBlock(t *testing.T) {
	const block, capacity = 64, 1 << 15
	perBlock := func(fill func(c *trieCache)) float64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := newTrieCache(block, capacity, false, true)
		fill(c)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if st := c.state(); st.Blocks != capacity {
			t.Fatalf("state %+v, want a full cache", st)
		}
		runtime.KeepAlive(c)
		return float64(after.HeapAlloc-before.HeapAlloc) / capacity
	}
	// Prompts of 32 blocks sharing their first 8 with the one before, in
	// token ids of o200k_base's range.
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int, 32*block)
	got := perBlock(func(c *trieCache) {
		for range 2 * capacity / 24 {
			for i := 8 * block; i < len(prompt); i++ {
				prompt[i] = rng.IntN(200_000)
			}
			_, cl := c.lookup("", prompt)
			c.insert(cl)
		}
	})
	t.Logf("%.0f bytes a 64-token block (%d in the block, %d in its tokens)", got, cacheBlockBytes, tokenBytes*block)
	if limit := float64(cacheBlockBytes + tokenBytes*block + 64); got > limit {
		t.Fatalf("a 64-token block costs %.0f bytes, more than %.0f", got, limit)
	}
}
