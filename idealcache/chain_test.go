package idealcache

import (
	"runtime"
	"slices"
	"testing"
)

// A block's key is its whole chain's: the same id after another prefix is
// another block, and the same prefix gives the same keys in every row.
func TestChainKeys(t *testing.T) {
	a := AppendChainKeys(nil, []int64{0, 1, 2})
	b := AppendChainKeys(nil, []int64{0, 3, 4, 5})
	c := AppendChainKeys(nil, []int64{1, 4, 6})
	if a[0] != b[0] {
		t.Errorf("the shared first block: keys %x and %x", a[0], b[0])
	}
	if !slices.Equal(AppendChainKeys(nil, []int64{0, 1}), a[:2]) {
		t.Error("a prefix of a row does not key as the row's first blocks")
	}
	seen := map[uint64]bool{}
	for _, k := range append(append(slices.Clone(a), b[1:]...), c...) {
		if seen[k] {
			t.Errorf("key %x given to two chains", k)
		}
		seen[k] = true
	}
	// One-block chains are a bijection of the id.
	first := map[uint64]int64{}
	for id := int64(-1000); id < 100_000; id++ {
		k := AppendChainKeys(nil, []int64{id})[0]
		if other, ok := first[k]; ok {
			t.Fatalf("ids %d and %d share the key %x", other, id, k)
		}
		first[k] = id
	}
}

func TestChainReuse(t *testing.T) {
	tests := []struct {
		name    string
		rows    [][]int64
		reusing int
		first   int
	}{
		{"prefix-consistent", [][]int64{{0, 1, 2}, {0, 1, 3}, {0, 4}, {5}, nil, {0, 1, 2, 6}}, 0, 0},
		{"AIPerf's documentation trace", [][]int64{{0, 1, 2}, {0, 3, 4, 5}, {1, 4, 6}}, 1, 3},
		{"an id at the same position after another prefix", [][]int64{{0, 1}, {2, 1}, {0, 1}, {2, 1}}, 2, 2},
		{"an id again later in its own row", [][]int64{{7, 7}}, 1, 1},
	}
	for _, tt := range tests {
		for _, dense := range []bool{true, false} {
			c := NewChainReuse(0, 10, dense)
			for i, ids := range tt.rows {
				c.Row(ids, i+1)
			}
			if c.Reusing != tt.reusing || c.FirstLine != tt.first {
				t.Errorf("%s (dense %v): %d rows reusing, the first on line %d; want %d and %d",
					tt.name, dense, c.Reusing, c.FirstLine, tt.reusing, tt.first)
			}
		}
	}
	// Ids outside the span the check was made for go to the map.
	c := NewChainReuse(0, 1, true)
	c.Row([]int64{5, 1 << 40}, 1)
	c.Row([]int64{1 << 40}, 2)
	if c.Reusing != 1 || c.Rows != 2 {
		t.Errorf("ids outside the span: %d of %d rows reusing, want 1 of 2", c.Reusing, c.Rows)
	}
}

// TestChainReuseBytesPerID: the check of a trace whose ids are dense holds
// 4 bytes an id of their span, the figure of docs/reliability.md.
func TestChainReuseBytesPerID(t *testing.T) {
	const span = 1 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := NewChainReuse(0, span-1, true)
	ids := make([]int64, 0, 16)
	for id := int64(0); id < span; id += 16 {
		ids = ids[:0]
		for j := range int64(16) {
			ids = append(ids, id+j)
		}
		c.Row(ids, 1)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perID := float64(after.HeapAlloc-before.HeapAlloc) / span
	t.Logf("%.2f bytes an id", perID)
	if perID > 4.1 {
		t.Errorf("%.2f bytes an id of the span, want 4", perID)
	}
	runtime.KeepAlive(c)
}
