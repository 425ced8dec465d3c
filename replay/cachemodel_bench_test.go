package replay

import (
	"testing"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// BenchmarkCacheModelAccept is the model's cost per request, as a workload
// pays it when a response is in: one Accept per row, in schedule order,
// pass after pass, on the shared traces with a bounded and an unbounded
// cache (vLLM's 16-token blocks).
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
				for b.Loop() {
					it, ok := p.Next()
					if !ok {
						b.Fatal("no row")
					}
					m.Accept(it)
				}
			})
		}
	}
}
