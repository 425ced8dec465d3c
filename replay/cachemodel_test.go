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
