package idealcache

// A Stack computes LRU stack distances (Mattson et al., 1970) of weighted
// keys in one pass. The stack distance of an access is the total weight of
// the distinct keys used since the key's previous use, the key itself
// included. By LRU's inclusion property, a cache that keeps the most
// recently used keys whose weights fit in capacity C holds the key at that
// access exactly when its distance is at most C: one pass answers for every
// capacity at once.
//
// The distances are sums over a Fenwick tree indexed by the time of each
// key's last use. Memory stays bounded by a ceiling: keys beyond it (the
// least recently used, once the live weight exceeds it) are forgotten, and
// their next access counts as a miss at every capacity up to the ceiling.
//
// A ceiling in weight does not bound the keys where they weigh little (a
// trace block of one token, say). Sample bounds them: past a number of keys
// the stack keeps only a spatially hashed sample of them (SHARDS,
// Waldspurger et al., FAST '15): a key is tracked only when its hash falls
// under a threshold, a rate R of the hash space, and every distance and
// weight is scaled by 1/R. Each time the sample outgrows its bound the rate
// halves, and the keys above the new threshold are dropped. A key's
// sampled distance is an estimate of its exact one; summed over many keys,
// each counted 1/R times, the estimate of the hits at a capacity is
// unbiased.

import "math"

// InfiniteDistance is the distance of a key that is not tracked: never seen, or
// forgotten beyond the ceiling. It is larger than any capacity.
const InfiniteDistance = math.MaxInt64

// Stack holds the LRU stack of keys of type K. The zero value is not
// usable; call NewStack. It holds at most 2³¹ keys.
type Stack[K comparable] struct {
	ceiling int64 // live weight kept, scaled; 0 keeps everything
	maxKeys int   // live keys kept; 0 keeps everything

	// The spatial sample (Sample): hash picks the keys, and a key is
	// tracked when the top shift bits of its hash are 0, a rate of
	// 2^-shift. Without hash every key is tracked.
	hash       func(K) uint64
	shift      uint
	maxSampled int

	// A key's entry has a fixed place while the key is tracked, so that
	// renumbering the times (compact) touches no map, and a StackRef saves
	// the second lookup of a key looked up and then used.
	index   map[K]int32 // key -> its entry
	entries []stackEntry[K]
	free    []int32 // entries of keys forgotten, for reuse

	owner  []int32 // time -> the entry last used then; -1 once it moved on
	weight []int64 // time -> weight of that use; 0 once it moved on
	tree   fenwick // prefix sums of weight over time
	next   int     // the next time to hand out
	oldest int     // no live entry is older than this
	total  int64   // live weight
}

type stackEntry[K comparable] struct {
	key K
	at  int32  // the time of the key's last use
	gen uint32 // counts the times the entry was freed: a StackRef's check
}

// StackRef is where Lookup found a key. Passed to UseRef with the same key, it
// spares a second lookup; it goes stale, harmlessly, once the key is
// forgotten.
type StackRef struct {
	entry int32 // -1: not found
	gen   uint32
}

// NewStack returns a stack that keeps keys while their total weight is at most
// ceiling and their number at most maxKeys (0 for no bound on either).
func NewStack[K comparable](ceiling int64, maxKeys int) *Stack[K] {
	t := &Stack[K]{ceiling: max(ceiling, 0), maxKeys: max(maxKeys, 0), index: map[K]int32{}}
	t.resize(1024)
	return t
}

// Sample makes t keep at most maxSampled keys (at least 1), by the spatial
// sampling the type's comment describes; hash picks them and must mix its
// key's bits into its high bits. Call it before the first Use.
func (t *Stack[K]) Sample(maxSampled int, hash func(K) uint64) {
	t.maxSampled, t.hash = max(maxSampled, 1), hash
}

// Tracks tells whether key is in the sample: the only keys whose
// distances the stack knows, and the only ones Use records. Every key is
// while the stack is exact.
func (t *Stack[K]) Tracks(key K) bool {
	return t.shift == 0 || t.hash(key)>>(64-t.shift) == 0
}

// Scale is 1/R, what each tracked key stands for: 1 while the stack is
// exact, then 2, 4, ... as the sample's rate R halves. A sampled key's
// weight counts Scale times in every distance and in Weight.
func (t *Stack[K]) Scale() int64 { return 1 << t.shift }

// Distance is the stack distance key would have if used now: the weight of
// every key used since its last use, its own included, scaled (Scale). It
// is InfiniteDistance for a key not tracked.
func (t *Stack[K]) Distance(key K) int64 {
	_, d := t.Lookup(key)
	return d
}

// Lookup is Distance, with a StackRef for UseRef.
func (t *Stack[K]) Lookup(key K) (StackRef, int64) {
	e, ok := t.index[key]
	if !ok {
		return StackRef{entry: -1}, InfiniteDistance
	}
	return StackRef{entry: e, gen: t.entries[e].gen}, (t.total - t.tree.sum(int(t.entries[e].at))) << t.shift
}

// Use makes key, of weight w, the most recently used; a key out of the
// sample (Tracks) is not recorded. A key's weight is
// meant to be fixed. Where it changes, the new one counts from now and the
// distances stay right, but a key forgotten while the others weighed more
// stays forgotten, and an LRU cache is then no longer exactly the set of
// distances within its capacity.
func (t *Stack[K]) Use(key K, w int64) {
	if !t.Tracks(key) {
		return
	}
	e, ok := t.index[key]
	if ok {
		t.clear(int(t.entries[e].at))
	} else {
		e = t.alloc(key)
		t.index[key] = e
	}
	t.place(e, w)
}

// UseRef is Use of key, which ref is a Lookup of since (of key, not
// another): while the key is still tracked, it goes without a lookup.
func (t *Stack[K]) UseRef(ref StackRef, key K, w int64) {
	if ref.entry < 0 || t.entries[ref.entry].gen != ref.gen {
		t.Use(key, w)
		return
	}
	t.clear(int(t.entries[ref.entry].at))
	t.place(ref.entry, w)
}

// Remove forgets key, as if it had never been used.
func (t *Stack[K]) Remove(key K) {
	if e, ok := t.index[key]; ok {
		t.clear(int(t.entries[e].at))
		t.forget(e)
	}
}

// Len is the number of keys tracked.
func (t *Stack[K]) Len() int { return len(t.index) }

// Weight is the total weight of the keys tracked, scaled (Scale).
func (t *Stack[K]) Weight() int64 { return t.total << t.shift }

// place gives entry e, of weight w, the next time.
func (t *Stack[K]) place(e int32, w int64) {
	if t.next == len(t.owner) {
		t.compact()
	}
	at := t.next
	t.next++
	t.owner[at], t.weight[at] = e, w
	t.tree.add(at, w)
	t.entries[e].at = int32(at)
	t.total += w
	t.trim()
}

func (t *Stack[K]) alloc(key K) int32 {
	if n := len(t.free); n > 0 {
		e := t.free[n-1]
		t.free = t.free[:n-1]
		t.entries[e].key = key
		return e
	}
	t.entries = append(t.entries, stackEntry[K]{key: key})
	return int32(len(t.entries) - 1)
}

// forget drops entry e, whose time is cleared, from the index.
func (t *Stack[K]) forget(e int32) {
	var zero K
	delete(t.index, t.entries[e].key)
	t.entries[e].key = zero
	t.entries[e].gen++
	t.free = append(t.free, e)
}

func (t *Stack[K]) clear(at int) {
	t.tree.add(at, -t.weight[at])
	t.total -= t.weight[at]
	t.owner[at], t.weight[at] = -1, 0
}

// trim forgets the least recently used keys beyond the bounds, then
// halves the sample's rate while it holds too many keys.
func (t *Stack[K]) trim() {
	for (t.ceiling > 0 && t.total<<t.shift > t.ceiling) || (t.maxKeys > 0 && len(t.index) > t.maxKeys) {
		for t.owner[t.oldest] < 0 {
			t.oldest++
		}
		e := t.owner[t.oldest]
		t.clear(t.oldest)
		t.forget(e)
	}
	for t.hash != nil && len(t.index) > t.maxSampled && t.shift < 63 {
		t.shift++
		for key, e := range t.index {
			if !t.Tracks(key) {
				t.clear(int(t.entries[e].at))
				t.forget(e)
			}
		}
	}
}

// compact renumbers the live entries from time 0, in order, into arrays
// with room for half as many again or more: a compaction every O(live)
// uses keeps the cost per use O(log live) amortised. Arrays with that room,
// and not four times too large, are reused: the live entries only move
// down.
func (t *Stack[K]) compact() {
	owner, weight := t.owner, t.weight
	if live := len(t.index); len(owner) < live+live/2 || len(owner) > 4*max(live, 1024) {
		t.resize(max(2*live, 1024))
	}
	n := 0
	for at := t.oldest; at < t.next; at++ {
		e := owner[at]
		if e < 0 {
			continue
		}
		t.owner[n], t.weight[n] = e, weight[at]
		t.entries[e].at = int32(n)
		n++
	}
	for at := n; at < len(t.owner); at++ {
		t.owner[at], t.weight[at] = -1, 0
	}
	t.tree.build(t.weight[:n])
	t.next, t.oldest = n, 0
}

func (t *Stack[K]) resize(n int) {
	t.owner = make([]int32, n)
	t.weight = make([]int64, n)
	t.tree = make(fenwick, n+1)
	for at := range t.owner {
		t.owner[at] = -1
	}
}

// fenwick is a binary indexed tree of int64 over times 0..len-2.
type fenwick []int64

func (f fenwick) add(at int, v int64) {
	for i := at + 1; i < len(f); i += i & -i {
		f[i] += v
	}
}

// sum is the total over times before at (at itself excluded).
func (f fenwick) sum(at int) int64 {
	var s int64
	for i := at; i > 0; i -= i & -i {
		s += f[i]
	}
	return s
}

// build fills the tree from values (times 0..len(values)-1; later ones 0)
// in O(len(f)): each node passes its sum on to its parent, up to the end.
func (f fenwick) build(values []int64) {
	clear(f)
	copy(f[1:], values)
	for i := 1; i < len(f); i++ {
		if j := i + (i & -i); j < len(f) {
			f[j] += f[i]
		}
	}
}
