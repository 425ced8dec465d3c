package replay

import (
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// BenchmarkCacheModelAccept is the model's cost per request, as a workload
// pays it when a response is in: one Accept per row, in schedule order,
// pass after pass, on the shared traces with a bounded and an unbounded
// cache (vLLM's 16-token blocks). Besides the time per request it reports
// the process's CPU per request (cpu-ns/op, the garbage collector's
// included), which other jobs on the machine disturb less.
func BenchmarkCacheModelAccept(b *testing.B) {
	traces := []struct{ name, path string }{
		{"conversation", "../../shared/traces/conversation_trace.jsonl"},
		{"synthetic", "../../shared/traces/synthetic_trace.jsonl"},
	}
	caches := []struct {
		name   string
		params CacheParams
	}{
		{"bounded", CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 65536}},
		{"unbounded", CacheParams{TraceBlock: 512, ServerBlock: 16}},
	}
	for _, tr := range traces {
		recs, err := trace.ReadFile(tr.path, trace.ReadOptions{BlockSize: 512})
		if err != nil {
			b.Fatalf("the shared traces are missing (../shared beside the checkout, as CI has it): %v", err)
		}
		for _, c := range caches {
			b.Run(tr.name+"/"+c.name, func(b *testing.B) {
				p, err := NewPacer(recs, PacerOptions{Loop: LoopFresh})
				if err != nil {
					b.Fatal(err)
				}
				m := NewCacheModel(p, c.params)
				b.ReportAllocs()
				cpu0, ok0 := testutil.ProcessCPUSeconds()
				n := 0
				for b.Loop() {
					it, ok := p.Next()
					if !ok {
						b.Fatal("no row")
					}
					m.Accept(it)
					n++
				}
				if cpu1, ok1 := testutil.ProcessCPUSeconds(); ok0 && ok1 && n > 0 {
					b.ReportMetric((cpu1-cpu0)*1e9/float64(n), "cpu-ns/op")
				}
			})
		}
	}
}

// BenchmarkCacheModelWarmUp: the CPU the cache model takes per request, as
// the workload asks it once a response is in, on the shared conversation
// trace's first 3,000 rows (12k prompt tokens a row on average) with loop
// repeat, from a start at the top of a pass: an unbounded cache, and one
// of 20,000 blocks of 16 tokens (about a hundredth of a pass). With
// observed, each request comes with a cached count (0, as from a cold
// server) and the model learns its warm-up from them (AcceptObserved).
func BenchmarkCacheModelWarmUp(b *testing.B) {
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
