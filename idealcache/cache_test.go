package idealcache

import (
	"testing"
	"unsafe"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// chainKeys is a row's blocks as the ideal cache keys them.
func chainKeys(ids []int64) []uint64 { return AppendChainKeys(nil, ids) }

// TestIdealCache checks the cache's arithmetic request by request.
func TestIdealCache(t *testing.T) {
	type req struct {
		ns   uint64
		ids  []int64
		isl  int
		want int
	}
	tests := []struct {
		name                    string
		trace, server, capacity int
		gran                    engine.Granularity
		reqs                    []req
	}{
		{"infinite, prefix reuse", 512, 16, 0, engine.GranularityBlock, []req{
			{0, []int64{0, 1, 2}, 1300, 0},
			{0, []int64{0, 1, 3}, 1100, 1024},    // two leading blocks seen
			{0, []int64{0, 1, 2}, 1300, 1296},    // all seen: capped at isl−1 = 1299, floored to 16s
			{0, []int64{4, 1, 2}, 1300, 0},       // a new first block hides the rest
			{1, []int64{0, 1, 2}, 1300, 0},       // another namespace shares nothing
			{0, []int64{0}, 1, 0},                // one-token prompt: isl−1 = 0
			{0, []int64{0, 1, 2, 3}, 1600, 1536}, // k=3: block 3 came after 0, 1 and not after 0, 1, 2
		}},
		{"a block is keyed by its chain, as an engine keys it", 512, 16, 0, engine.GranularityBlock, []req{
			{0, []int64{0, 1, 2}, 1200, 0},
			{0, []int64{0, 3, 4, 5}, 1800, 512},
			{0, []int64{1, 4, 6}, 1300, 0}, // 1 and 4 were seen after other blocks
			{0, []int64{3, 4}, 1000, 0},
			{0, []int64{0, 3, 4}, 1300, 1296}, // the prefix of the second row
			{0, []int64{1, 4, 6}, 1300, 1296},
		}},
		{"server block 1 (SGLang pages)", 512, 1, 0, engine.GranularityBlock, []req{
			{0, []int64{7, 8}, 700, 0},
			{0, []int64{7, 8}, 700, 699},
		}},
		{"token granularity with 32-token blocks (TensorRT-LLM partial reuse)", 512, 32, 0, engine.GranularityToken, []req{
			{0, []int64{7, 8}, 700, 0},
			{0, []int64{7, 8}, 700, 699}, // not floored to 32s
			{0, []int64{7, 9}, 600, 512},
		}},
		{"LRU keeps prefixes, drops tails", 512, 16, 64, engine.GranularityBlock, []req{
			{0, []int64{0, 1}, 1024, 0},    // 64 server blocks: full
			{0, []int64{0, 2}, 1024, 512},  // 0 hit; inserting 2 evicts tail 1
			{0, []int64{0, 1}, 1024, 512},  // 1 was evicted
			{0, []int64{5, 6, 7}, 1536, 0}, // larger than the cache: only its head stays
			{0, []int64{5}, 512, 496},      // min(512, 511) floored to 16s
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCache(Params{TraceBlock: tt.trace, ServerBlock: tt.server, CapacityBlocks: tt.capacity, Granularity: tt.gran})
			for i, r := range tt.reqs {
				if got := c.Visit(r.ns, chainKeys(r.ids), r.isl, true, false).Tokens; got != r.want {
					t.Errorf("request %d %v/%d: theoretical %d, want %d", i, r.ids, r.isl, got, r.want)
				}
			}
		})
	}
}

// TestIdealCacheForgetsOldPasses: an unbounded cache holds the current and
// the previous fresh pass only, so an always-on daemon does not grow every
// pass; a bounded one keeps dead blocks until its LRU evicts them.
func TestIdealCacheForgetsOldPasses(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		want     []int // blocks held after each pass's request
	}{
		{"unbounded", 0, []int{3, 6, 6, 6}},
		{"bounded", 1000, []int{3, 6, 9, 12}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCache(Params{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: tt.capacity})
			for pass, want := range tt.want {
				c.Visit(uint64(pass), chainKeys([]int64{0, 1, 2}), 1536, true, false)
				if got := c.lru.Len(); got != want {
					t.Errorf("after pass %d: %d blocks, want %d", pass, got, want)
				}
			}
		})
	}
}

// TestIdealCacheBounded: a cache of bounded capacity holds a bounded number
// of blocks whatever the requests, including blocks that weigh nothing.
func TestIdealCacheBounded(t *testing.T) {
	for _, tc := range []struct {
		name          string
		trace, server int
		gran          engine.Granularity
		capacity      int
		lastTokens    int // tokens of each request's last block
		wantMax       int
	}{
		{"whole blocks", 512, 16, engine.GranularityBlock, 640, 512, 640},
		{"short last blocks weigh nothing", 512, 16, engine.GranularityBlock, 640, 5, 640},
		{"server blocks larger than trace blocks", 512, 2048, engine.GranularityBlock, 10, 512, 40},
		{"token granularity", 512, 1, engine.GranularityToken, 4096, 3, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCache(Params{TraceBlock: tc.trace, ServerBlock: tc.server, CapacityBlocks: tc.capacity, Granularity: tc.gran})
			next := int64(0)
			for range 5000 {
				ids := make([]int64, 4) // four fresh blocks: nothing is ever hit
				for i := range ids {
					ids[i] = next
					next++
				}
				c.Visit(0, chainKeys(ids), 3*tc.trace+tc.lastTokens, true, false)
				if c.lru.Len() > tc.wantMax || len(c.index) > tc.wantMax {
					t.Fatalf("after %d blocks: %d held, %d indexed, want at most %d", next, c.lru.Len(), len(c.index), tc.wantMax)
				}
			}
		})
	}
}

// TestBlockKeySize: a block keyed by its chain costs what a block keyed by
// its id did, 16 bytes with its namespace, in the ideal cache's index and
// in the profile's stack (docs/reliability.md).
func TestBlockKeySize(t *testing.T) {
	if got := unsafe.Sizeof(BlockKey{}); got != 16 {
		t.Errorf("a block key takes %d bytes, want 16", got)
	}
}
