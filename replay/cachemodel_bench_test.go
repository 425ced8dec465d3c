package replay

import (
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// BenchmarkCacheModelAccept: the CPU the cache model takes per request, as
// the workload asks it once a response is in, on the shared conversation
// trace's first 3,000 rows (12k prompt tokens a row on average) with loop
// repeat, from a start at the top of a pass: an unbounded cache, and one
// of 20,000 blocks of 16 tokens (about a hundredth of a pass). With
// observed, each request comes with a cached count (0, as from a cold
// server) and the model learns its warm-up from them (AcceptObserved).
func BenchmarkCacheModelAccept(b *testing.B) {
	recs := wlTestReadSlice(b, 3000)
	for _, tc := range []struct {
		name     string
		capacity int
		observed bool
	}{
		{"unbounded", 0, false},
		{"capacity=20000", 20000, false},
		{"unbounded/observed", 0, true},
		{"capacity=20000/observed", 20000, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Seek(TracePosition{Pass: 1}); err != nil {
				b.Fatal(err)
			}
			items := benchPassItems(p, 1)
			m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: tc.capacity})
			accept := m.Accept
			if tc.observed {
				m.LearnWarmUp(nil)
				accept = func(it PacerItem) (int, bool) { return m.AcceptObserved(it, 0) }
			}
			accept(items[0]) // the warm-up, outside the timing
			b.ReportAllocs()
			cpu0, ok0 := testutil.ProcessCPUSeconds()
			b.ResetTimer()
			for i := range b.N {
				it := items[(i+1)%len(items)]
				it.Pass += (i + 1) / len(items)
				accept(it)
			}
			b.StopTimer()
			// CPU time, which other work on a shared machine moves far
			// less than the wall time of ns/op.
			if cpu1, ok1 := testutil.ProcessCPUSeconds(); ok0 && ok1 {
				b.ReportMetric((cpu1-cpu0)/float64(b.N)*1e9, "cpu-ns/req")
			}
		})
	}
}

// benchPassItems lists every row of pass, later turns included, in the
// order a replay that sends each turn at once dispatches them.
func benchPassItems(p *Pacer, pass int) []PacerItem {
	var out []PacerItem
	for {
		it, ok := p.Next()
		if !ok || it.Pass != pass {
			return out
		}
		for ok {
			out = append(out, it)
			it, _, ok = p.NextTurn(it)
		}
	}
}
