// Package stackdist computes LRU stack distances (Mattson et al., 1970) of
// weighted keys in one pass. The stack distance of an access is the total
// weight of the distinct keys used since the key's previous use, the key
// itself included. By LRU's inclusion property, a cache that keeps the most
// recently used keys whose weights fit in capacity C holds the key at that
// access exactly when its distance is at most C: one pass answers for every
// capacity at once.
//
// The distances are sums over a Fenwick tree indexed by the time of each
// key's last use. Memory stays bounded by a ceiling: keys beyond it (the
// least recently used, once the live weight exceeds it) are forgotten, and
// their next access counts as a miss at every capacity up to the ceiling.
package stackdist

import "math"

// Infinite is the distance of a key that is not tracked: never seen, or
// forgotten beyond the ceiling. It is larger than any capacity.
const Infinite = math.MaxInt64

// Tracker holds the LRU stack of keys of type K. The zero value is not
// usable; call New.
type Tracker[K comparable] struct {
	ceiling int64 // live weight kept; 0 keeps everything
	maxKeys int   // live keys kept; 0 keeps everything

	slot   map[K]int // key -> time of its last use
	keys   []K       // time -> key
	weight []int64   // time -> weight of the key last used then; 0 once it moved on
	live   []bool    // time -> a key's last use is at this time
	tree   fenwick   // prefix sums of weight over time
	next   int       // the next time to hand out
	oldest int       // no live entry is older than this
	total  int64     // live weight
}

// New returns a tracker that keeps keys while their total weight is at most
// ceiling and their number at most maxKeys (0 for no bound on either).
func New[K comparable](ceiling int64, maxKeys int) *Tracker[K] {
	t := &Tracker[K]{ceiling: max(ceiling, 0), maxKeys: max(maxKeys, 0), slot: map[K]int{}}
	t.resize(1024)
	return t
}

// Distance is the stack distance key would have if used now: the weight of
// every key used since its last use, its own included. It is Infinite for a
// key not tracked.
func (t *Tracker[K]) Distance(key K) int64 {
	at, ok := t.slot[key]
	if !ok {
		return Infinite
	}
	return t.total - t.tree.sum(at)
}

// Use makes key, of weight w, the most recently used. A key's weight is
// meant to be fixed. Where it changes, the new one counts from now and the
// distances stay right, but a key forgotten while the others weighed more
// stays forgotten, and an LRU cache is then no longer exactly the set of
// distances within its capacity.
func (t *Tracker[K]) Use(key K, w int64) {
	if at, ok := t.slot[key]; ok {
		t.clear(at)
	}
	if t.next == len(t.keys) {
		t.compact()
	}
	at := t.next
	t.next++
	t.keys[at], t.weight[at], t.live[at] = key, w, true
	t.tree.add(at, w)
	t.slot[key] = at
	t.total += w
	t.trim()
}

// Remove forgets key, as if it had never been used.
func (t *Tracker[K]) Remove(key K) {
	if at, ok := t.slot[key]; ok {
		t.clear(at)
		delete(t.slot, key)
	}
}

// Len is the number of keys tracked.
func (t *Tracker[K]) Len() int { return len(t.slot) }

// Weight is the total weight of the keys tracked.
func (t *Tracker[K]) Weight() int64 { return t.total }

func (t *Tracker[K]) clear(at int) {
	t.tree.add(at, -t.weight[at])
	t.total -= t.weight[at]
	var zero K
	t.keys[at], t.weight[at], t.live[at] = zero, 0, false
}

// trim forgets the least recently used keys beyond the bounds.
func (t *Tracker[K]) trim() {
	for (t.ceiling > 0 && t.total > t.ceiling) || (t.maxKeys > 0 && len(t.slot) > t.maxKeys) {
		for !t.live[t.oldest] {
			t.oldest++
		}
		key := t.keys[t.oldest]
		t.clear(t.oldest)
		delete(t.slot, key)
	}
}

// compact renumbers the live entries from time 0, in order, into arrays
// with room for as many again: a compaction every O(live) uses keeps the
// cost per use O(log live) amortised.
func (t *Tracker[K]) compact() {
	keys, weight := t.keys, t.weight
	live := t.live
	t.resize(max(2*len(t.slot), 1024))
	n := 0
	for at := t.oldest; at < len(keys); at++ {
		if !live[at] {
			continue
		}
		t.keys[n], t.weight[n], t.live[n] = keys[at], weight[at], true
		t.slot[keys[at]] = n
		n++
	}
	t.tree.build(t.weight[:n])
	t.next, t.oldest = n, 0
}

func (t *Tracker[K]) resize(n int) {
	t.keys = make([]K, n)
	t.weight = make([]int64, n)
	t.live = make([]bool, n)
	t.tree = make(fenwick, n+1)
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
