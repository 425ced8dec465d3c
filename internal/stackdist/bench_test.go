package stackdist

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// blockKey is the key the cache model tracks: a prompt namespace and a
// trace hash id.
type blockKey struct {
	ns uint64
	id int64
}

// BenchmarkUse is one access: the distance, then the use, over a working
// set of a million blocks with skewed reuse.
func BenchmarkUse(b *testing.B) {
	tr := New[blockKey](0, 0)
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]blockKey, 1<<16)
	for i := range keys {
		keys[i] = blockKey{ns: 1, id: int64(r.ExpFloat64() * 250_000)}
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
		tr := New[blockKey](0, 0)
		for i := range n {
			tr.Use(blockKey{ns: 1, id: int64(i)}, 32)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/key")
		runtime.KeepAlive(tr)
	}
}
