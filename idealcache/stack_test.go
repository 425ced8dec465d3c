package idealcache

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// bruteStack is the definition, kept naively: a list of keys, most recent
// first, with their weights.
type bruteStack struct {
	keys   []int
	weight map[int]int64
}

func (b *bruteStack) distance(key int) int64 {
	var d int64
	for _, k := range b.keys {
		d += b.weight[k]
		if k == key {
			return d
		}
	}
	return InfiniteDistance
}

func (b *bruteStack) use(key int, w int64) {
	for i, k := range b.keys {
		if k == key {
			b.keys = append(b.keys[:i], b.keys[i+1:]...)
			break
		}
	}
	b.keys = append([]int{key}, b.keys...)
	b.weight[key] = w
}

// bruteLRU is a capacity-bounded LRU cache, evicting from the back.
type bruteLRU struct {
	capacity int64
	bruteStack
	used int64
}

func (c *bruteLRU) holds(key int) bool { _, ok := c.weight[key]; return ok && c.distanceOK(key) }

func (c *bruteLRU) distanceOK(key int) bool {
	for _, k := range c.keys {
		if k == key {
			return true
		}
	}
	return false
}

func (c *bruteLRU) use(key int, w int64) {
	if c.distanceOK(key) {
		c.used -= c.weight[key]
	}
	c.bruteStack.use(key, w)
	c.used += w
	for c.used > c.capacity {
		last := c.keys[len(c.keys)-1]
		c.keys = c.keys[:len(c.keys)-1]
		c.used -= c.weight[last]
		delete(c.weight, last)
	}
}

func TestDistanceMatchesDefinition(t *testing.T) {
	tests := []struct {
		name     string
		keys     int
		maxW     int64
		ceiling  int64
		maxKeys  int
		accesses int
	}{
		{name: "unit weights, unbounded", keys: 50, maxW: 1, accesses: 5000},
		{name: "weights, unbounded", keys: 300, maxW: 32, accesses: 20000},
		{name: "zero weights allowed", keys: 40, maxW: 2, accesses: 5000},
		{name: "weight ceiling", keys: 300, maxW: 32, ceiling: 700, accesses: 20000},
		{name: "key bound", keys: 300, maxW: 8, maxKeys: 37, accesses: 20000},
		{name: "many compactions", keys: 3000, maxW: 4, ceiling: 2000, accesses: 60000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tt.keys)))
			tr := NewStack[int](tt.ceiling, tt.maxKeys)
			b := &bruteStack{weight: map[int]int64{}}
			for i := range tt.accesses {
				// Skewed keys, so that distances are short and long.
				key := int(r.ExpFloat64() * float64(tt.keys) / 4)
				// A key's weight is fixed, as a block's is (see Use).
				w := int64(key*7919) % (tt.maxW + 1)
				if tt.name == "unit weights, unbounded" {
					w = 1
				}
				want := b.distance(key)
				if tt.ceiling > 0 && want > tt.ceiling {
					want = InfiniteDistance
				}
				if tt.maxKeys > 0 && b.rank(key) > tt.maxKeys {
					want = InfiniteDistance
				}
				if got := tr.Distance(key); got != want {
					t.Fatalf("access %d of key %d: distance %d, want %d", i, key, got, want)
				}
				tr.Use(key, w)
				b.use(key, w)
			}
		})
	}
}

// rank is the position of key in the stack, from 1; beyond the end for a
// key not in it.
func (b *bruteStack) rank(key int) int {
	for i, k := range b.keys {
		if k == key {
			return i + 1
		}
	}
	return len(b.keys) + 1
}

// TestInclusion checks the property the package rests on: an LRU cache of
// capacity C holds a key exactly when its distance is at most C, for many C
// at once from one tracker.
func TestInclusion(t *testing.T) {
	capacities := []int64{1, 5, 17, 64, 200, 1000}
	caches := make([]*bruteLRU, len(capacities))
	for i, c := range capacities {
		caches[i] = &bruteLRU{capacity: c, bruteStack: bruteStack{weight: map[int]int64{}}}
	}
	tr := NewStack[int](0, 0)
	r := rand.New(rand.NewPCG(7, 7))
	for i := range 20000 {
		key := int(r.ExpFloat64() * 80)
		w := 1 + int64(key*7919)%8
		d := tr.Distance(key)
		for _, c := range caches {
			if got, want := d <= c.capacity, c.holds(key); got != want {
				t.Fatalf("access %d of key %d, capacity %d: distance %d says held=%v, the cache says %v", i, key, c.capacity, d, got, want)
			}
			c.use(key, w)
		}
		tr.Use(key, w)
	}
}

func TestRemove(t *testing.T) {
	tr := NewStack[string](0, 0)
	tr.Use("a", 3)
	tr.Use("b", 2)
	tr.Use("c", 1)
	if d := tr.Distance("a"); d != 6 {
		t.Fatalf("distance of a: %d, want 6", d)
	}
	tr.Remove("b")
	if d := tr.Distance("a"); d != 4 {
		t.Errorf("distance of a after removing b: %d, want 4", d)
	}
	if d := tr.Distance("b"); d != InfiniteDistance {
		t.Errorf("removed b has distance %d", d)
	}
	if tr.Len() != 2 || tr.Weight() != 4 {
		t.Errorf("Len %d Weight %d, want 2 and 4", tr.Len(), tr.Weight())
	}
}

// TestUseRef: looking keys up in batches and using them through their
// Refs, as the cache model does with a prompt's blocks, gives the stack
// that Use gives, even when a use in between forgets a key looked up (its
// Ref is then stale) or a batch names a key twice.
func TestUseRef(t *testing.T) {
	for _, tt := range []struct {
		name    string
		ceiling int64
		maxKeys int
	}{
		{name: "unbounded"},
		{name: "weight ceiling", ceiling: 300},
		{name: "key bound", maxKeys: 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			plain, byRef := NewStack[int](tt.ceiling, tt.maxKeys), NewStack[int](tt.ceiling, tt.maxKeys)
			r := rand.New(rand.NewPCG(3, 4))
			stale := 0
			for range 5000 {
				batch := make([]int, 1+r.IntN(12))
				refs := make([]StackRef, len(batch))
				for i := range batch {
					batch[i] = int(r.ExpFloat64() * 40)
					var d int64
					refs[i], d = byRef.Lookup(batch[i])
					if want := plain.Distance(batch[i]); d != want {
						t.Fatalf("key %d: Lookup says %d, Distance %d", batch[i], d, want)
					}
				}
				for i := len(batch) - 1; i >= 0; i-- {
					w := 1 + int64(batch[i]*7919)%16
					if refs[i].entry >= 0 && byRef.entries[refs[i].entry].gen != refs[i].gen {
						stale++
					}
					plain.Use(batch[i], w)
					byRef.UseRef(refs[i], batch[i], w)
				}
				if plain.Len() != byRef.Len() || plain.Weight() != byRef.Weight() {
					t.Fatalf("Len %d and %d, Weight %d and %d", plain.Len(), byRef.Len(), plain.Weight(), byRef.Weight())
				}
			}
			if tt.name != "unbounded" && stale == 0 {
				t.Errorf("no Ref went stale: the case tests nothing")
			}
		})
	}
}

// stackKey is the key the cache model tracks: a prompt namespace and a
// trace hash id.
type stackKey struct {
	ns uint64
	id int64
}

// BenchmarkUse is one access: the distance, then the use, over a working
// set of a million blocks with skewed reuse.
func BenchmarkUse(b *testing.B) {
	tr := NewStack[stackKey](0, 0)
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]stackKey, 1<<16)
	for i := range keys {
		keys[i] = stackKey{ns: 1, id: int64(r.ExpFloat64() * 250_000)}
	}
	b.ResetTimer()
	for i := range b.N {
		k := keys[i&(len(keys)-1)]
		_ = tr.Distance(k)
		tr.Use(k, 32)
	}
}

// BenchmarkMemoryPerKey reports the heap one tracked block costs, with the
// arrays as full as compaction lets them get (the worst case) and right
// after a compaction (the best).
func BenchmarkMemoryPerKey(b *testing.B) {
	const n = 1 << 20
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr := NewStack[stackKey](0, 0)
		for i := range n {
			tr.Use(stackKey{ns: 1, id: int64(i)}, 32)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/key")
		runtime.KeepAlive(tr)
	}
}

// mixKey is a sample's hash of an int key.
func mixKey(k int) uint64 { return fmix64(uint64(k)) }

// TestStackSampleBound: a sampled stack never holds more keys than its
// bound, however many distinct keys it is fed, and its weight estimates
// the exact one.
func TestStackSampleBound(t *testing.T) {
	tests := []struct {
		name       string
		keys       int
		maxSampled int
		ceiling    int64
	}{
		{"fits: exact", 900, 1000, 0},
		{"ten times the bound", 10_000, 1000, 0},
		{"a thousand times the bound", 1_000_000, 1000, 0},
		{"a ceiling in weight", 1_000_000, 1000, 200_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewStack[int](tt.ceiling, 0)
			tr.Sample(tt.maxSampled, mixKey)
			most := 0
			for k := range tt.keys {
				tr.Use(k, 1)
				most = max(most, tr.Len())
			}
			if most > tt.maxSampled {
				t.Errorf("held %d keys, over the bound of %d", most, tt.maxSampled)
			}
			want := int64(tt.keys)
			if tt.ceiling > 0 {
				want = tt.ceiling
			}
			if tt.keys <= tt.maxSampled && (tr.Scale() != 1 || tr.Weight() != want) {
				t.Errorf("under the bound: scale %d, weight %d; want exact, %d", tr.Scale(), tr.Weight(), want)
			}
			if got := float64(tr.Weight()); math.Abs(got-float64(want)) > 0.15*float64(want) {
				t.Errorf("weight %d (scale %d), want %d within 15 %%", tr.Weight(), tr.Scale(), want)
			}
		})
	}
}

// TestStackSampleHits: the hits of LRU caches of several capacities, as
// sampled distances estimate them (each tracked access counting Scale
// times), are within 2 % of all accesses of the exact hits.
func TestStackSampleHits(t *testing.T) {
	capacities := []int64{1_000, 10_000, 50_000}
	r := rand.New(rand.NewPCG(3, 4))
	exact, sampled := NewStack[int](0, 0), NewStack[int](0, 0)
	sampled.Sample(8_000, mixKey)
	exactHits, sampledHits := make([]int64, len(capacities)), make([]int64, len(capacities))
	const accesses = 400_000
	for range accesses {
		key := int(r.ExpFloat64() * 20_000)
		de := exact.Distance(key)
		exact.Use(key, 1)
		for i, c := range capacities {
			if de <= c {
				exactHits[i]++
			}
		}
		if !sampled.Tracks(key) {
			continue
		}
		scale := sampled.Scale()
		ds := sampled.Distance(key)
		sampled.Use(key, 1)
		for i, c := range capacities {
			if ds <= c {
				sampledHits[i] += scale
			}
		}
	}
	if sampled.Scale() == 1 || sampled.Len() > 8_000 {
		t.Fatalf("scale %d, %d keys: the sample never left the exact path, or outgrew its bound", sampled.Scale(), sampled.Len())
	}
	for i, c := range capacities {
		diff := math.Abs(float64(sampledHits[i]-exactHits[i])) / accesses
		t.Logf("capacity %d: %d hits exact, %d sampled (scale %d): %.4f of the accesses apart", c, exactHits[i], sampledHits[i], sampled.Scale(), diff)
		if diff > 0.02 {
			t.Errorf("capacity %d: %d hits sampled, %d exact: %.4f of the accesses apart, want at most 0.02", c, sampledHits[i], exactHits[i], diff)
		}
	}
}
