package replay

import "testing"

func TestCacheModel(t *testing.T) {
	type req struct {
		ns   uint64
		ids  []int64
		isl  int
		want int
	}
	tests := []struct {
		name                    string
		trace, server, capacity int
		reqs                    []req
	}{
		{"infinite, prefix reuse", 512, 16, 0, []req{
			{0, []int64{0, 1, 2}, 1300, 0},
			{0, []int64{0, 1, 3}, 1100, 1024},    // two leading blocks seen
			{0, []int64{0, 1, 2}, 1300, 1296},    // all seen: capped at isl−1 = 1299, floored to 16s
			{0, []int64{4, 1, 2}, 1300, 0},       // a new first block hides the rest
			{1, []int64{0, 1, 2}, 1300, 0},       // another namespace shares nothing
			{0, []int64{0}, 1, 0},                // one-token prompt: isl−1 = 0
			{0, []int64{0, 1, 2, 3}, 1600, 1584}, // k=4: min(2048, 1599) floored to 16s
		}},
		{"server block 1 (SGLang pages)", 512, 1, 0, []req{
			{0, []int64{7, 8}, 700, 0},
			{0, []int64{7, 8}, 700, 699},
		}},
		{"LRU keeps prefixes, drops tails", 512, 16, 64, []req{
			{0, []int64{0, 1}, 1024, 0},    // 64 server blocks: full
			{0, []int64{0, 2}, 1024, 512},  // 0 hit; inserting 2 evicts tail 1
			{0, []int64{0, 1}, 1024, 512},  // 1 was evicted
			{0, []int64{5, 6, 7}, 1536, 0}, // larger than the cache: only its head stays
			{0, []int64{5}, 512, 496},      // min(512, 511) floored to 16s
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewCacheModel(tt.trace, tt.server, tt.capacity)
			for i, r := range tt.reqs {
				if got := m.Admit(r.ns, r.ids, r.isl); got != r.want {
					t.Errorf("request %d %v/%d: theoretical %d, want %d", i, r.ids, r.isl, got, r.want)
				}
			}
		})
	}
}

// TestCacheModelForgetsOldPasses: an infinite model holds the current and the
// previous fresh pass only, so an always-on daemon does not grow every pass;
// a bounded model keeps dead blocks until its LRU evicts them.
func TestCacheModelForgetsOldPasses(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		// blocks held after each pass's request
		want []int
		// theoretical tokens of a late pass-1 request sent after pass 3 began
		lateHit int
	}{
		{"infinite", 0, []int{3, 6, 6, 6}, 0},
		{"bounded", 1 << 20, []int{3, 6, 9, 12}, 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewCacheModel(512, 16, tt.capacity)
			for pass, want := range tt.want {
				m.Admit(uint64(pass), []int64{0, 1, 2}, 1536)
				if got := m.Blocks(); got != want {
					t.Errorf("after pass %d: %d blocks, want %d", pass, got, want)
				}
			}
			// A late turn of the pass before the current one still hits.
			if got := m.Admit(2, []int64{0, 1, 9}, 1536); got != 1024 {
				t.Errorf("late turn of the previous pass: theoretical %d, want 1024", got)
			}
			if got := m.Admit(1, []int64{0, 1, 9}, 1536); got != tt.lateHit {
				t.Errorf("turn of a forgotten pass: theoretical %d, want %d", got, tt.lateHit)
			}
		})
	}
}
