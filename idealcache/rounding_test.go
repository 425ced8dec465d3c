package idealcache

import (
	"testing"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

var (
	vllm   = Rounding{TraceBlock: 512, ServerBlock: 16, Granularity: engine.GranularityBlock}
	trtllm = Rounding{TraceBlock: 512, ServerBlock: 32, Granularity: engine.GranularityBlock}
	sglang = Rounding{TraceBlock: 512, ServerBlock: 1, Granularity: engine.GranularityToken}
	// A token-granular engine with blocks of 16, and block-granular ones
	// whose blocks do not divide the trace's or are larger than them.
	token16  = Rounding{TraceBlock: 512, ServerBlock: 16, Granularity: engine.GranularityToken}
	block100 = Rounding{TraceBlock: 512, ServerBlock: 100, Granularity: engine.GranularityBlock}
	block1k  = Rounding{TraceBlock: 512, ServerBlock: 1024, Granularity: engine.GranularityBlock}
	token1k  = Rounding{TraceBlock: 512, ServerBlock: 1024, Granularity: engine.GranularityToken}
)

// TestCachedTokens: the rounding of docs/cache-model.md's table, at the
// edges (nothing held, the last prompt token, a partial block).
func TestCachedTokens(t *testing.T) {
	tests := []struct {
		name   string
		r      Rounding
		k, isl int
		want   int
		note   string
	}{
		{"nothing held", vllm, 0, 1100, 0, ""},
		{"one block of a longer prompt", vllm, 1, 1100, 512, ""},
		{"every block: the last token recomputed, whole blocks", vllm, 3, 1100, 1088, "1099 → 68 blocks of 16"},
		{"a prompt of whole blocks", vllm, 2, 1024, 1008, "1023 → 63 blocks"},
		{"a one-token prompt", vllm, 1, 1, 0, ""},
		{"an empty prompt", vllm, 1, 0, 0, ""},
		{"TensorRT-LLM's blocks of 32", trtllm, 3, 1100, 1088, "1099 → 34 blocks of 32"},
		{"TensorRT-LLM, a prompt of whole blocks", trtllm, 2, 1024, 992, "1023 → 31 blocks"},
		{"token granularity", sglang, 3, 1100, 1099, ""},
		{"token granularity, one block", sglang, 1, 1100, 512, ""},
		{"token granularity ignores the block size", token16, 3, 1100, 1099, ""},
		{"blocks that do not divide the trace's", block100, 1, 1100, 500, ""},
		{"blocks larger than the trace's", block1k, 1, 1100, 0, ""},
		{"blocks larger than the trace's, two held", block1k, 2, 1100, 1024, ""},
		{"token granularity, blocks larger than the trace's", token1k, 1, 1100, 512, ""},
		{"more blocks held than the prompt fills", vllm, 5, 1100, 1088, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.CachedTokens(tt.k, tt.isl); got != tt.want {
				t.Errorf("%+v.CachedTokens(%d, %d) = %d, want %d %s", tt.r, tt.k, tt.isl, got, tt.want, tt.note)
			}
		})
	}
}

// TestBlockTokensAndWeight: a row's blocks, the last partial, and the
// server blocks each fills under either granularity.
func TestBlockTokensAndWeight(t *testing.T) {
	tests := []struct {
		name        string
		r           Rounding
		i, n, isl   int
		wantTokens  int
		wantWeight  int
		wantPerFull int // the weight of a whole trace block
	}{
		{"a whole block", vllm, 0, 3, 1100, 512, 32, 32},
		{"the last block, partial: whole server blocks only", vllm, 2, 3, 1100, 76, 4, 32},
		{"the last block, partial, token granularity", token16, 2, 3, 1100, 76, 5, 32},
		{"the last block, full", vllm, 1, 2, 1024, 512, 32, 32},
		{"a one-block row", vllm, 0, 1, 20, 20, 1, 32},
		{"a short one-block row weighs nothing", vllm, 0, 1, 15, 15, 0, 32},
		{"a short one-block row, token granularity", token16, 0, 1, 15, 15, 1, 32},
		{"more blocks than the tokens fill", vllm, 2, 3, 900, 0, 0, 32},
		{"more blocks than the tokens fill, token granularity", token16, 2, 3, 900, 0, 0, 32},
		{"pages of one token", sglang, 2, 3, 1100, 76, 76, 512},
		{"blocks larger than the trace's", block1k, 0, 3, 1100, 512, 0, 0},
		{"blocks larger than the trace's, token granularity", token1k, 0, 3, 1100, 512, 1, 1},
		{"blocks that do not divide the trace's", block100, 1, 3, 1100, 512, 5, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tokens := tt.r.BlockTokens(tt.i, tt.n, tt.isl)
			if tokens != tt.wantTokens {
				t.Fatalf("BlockTokens(%d, %d, %d) = %d, want %d", tt.i, tt.n, tt.isl, tokens, tt.wantTokens)
			}
			if got := tt.r.BlockWeight(tokens); got != tt.wantWeight {
				t.Errorf("BlockWeight(%d) = %d, want %d", tokens, got, tt.wantWeight)
			}
			if got := tt.r.BlockWeight(tt.r.TraceBlock); got != tt.wantPerFull {
				t.Errorf("a whole trace block weighs %d, want %d", got, tt.wantPerFull)
			}
		})
	}
	if got := vllm.BlockWeight(-5); got != 0 {
		t.Errorf("a block of negative tokens weighs %d, want 0", got)
	}
}

// TestMaxEntries: a cache of C server blocks holds at most C·⌈S/T⌉ trace
// blocks, whatever the granularity.
func TestMaxEntries(t *testing.T) {
	tests := []struct {
		name     string
		r        Rounding
		capacity int
		wantPer  int
		want     int
	}{
		{"server blocks smaller than the trace's", vllm, 1000, 1, 1000},
		{"pages of one token", sglang, 1000, 1, 1000},
		{"server blocks twice the trace's", block1k, 10, 2, 20},
		{"the same, token granularity", token1k, 10, 2, 20},
		{"server blocks not a multiple of the trace's", Rounding{TraceBlock: 512, ServerBlock: 1100}, 10, 3, 30},
		{"equal blocks", Rounding{TraceBlock: 512, ServerBlock: 512}, 7, 1, 7},
		{"unbounded", vllm, 0, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.EntriesPerServerBlock(); got != tt.wantPer {
				t.Errorf("EntriesPerServerBlock() = %d, want %d", got, tt.wantPer)
			}
			if got := tt.r.MaxEntries(tt.capacity); got != tt.want {
				t.Errorf("MaxEntries(%d) = %d, want %d", tt.capacity, got, tt.want)
			}
		})
	}
}
