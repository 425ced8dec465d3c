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
