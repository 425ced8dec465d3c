package synth

import (
	"math/rand/v2"
	"testing"
)

// The bitmaps of a dense id span tell the shared ids and the largest of
// them as a plain count does.
func TestIDBitsMatchCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		lo := int64(r.IntN(1000))
		span := int64(1 + r.IntN(300))
		var ids []int64
		for range r.IntN(400) {
			ids = append(ids, lo+r.Int64N(span))
		}
		count := idCounts{}
		bits := newIDBits(lo, lo+span-1)
		for _, h := range ids {
			count[h]++
			bits.add(h)
		}
		if got, want := bits.maxShared(), count.maxShared(); got != want {
			t.Fatalf("trial %d: largest shared id %d, want %d", trial, got, want)
		}
		for h := lo - 70; h < lo+span+70; h++ {
			if bits.isShared(h) != count.isShared(h) {
				t.Fatalf("trial %d: id %d shared %v, want %v", trial, h, bits.isShared(h), count.isShared(h))
			}
		}
	}
}

func TestIDSpanIsDense(t *testing.T) {
	for _, tc := range []struct {
		span       int64
		tableBytes int
		want       bool
	}{
		{30_000_000, 110 << 20, true}, // make bench-scale's trace
		{182_789, 660_000, true},      // the conversation trace
		{1 << 40, 1000, false},
		{1 << 62, 1 << 40, false},
		{1 << 30, 100 << 20, false},
		{1000, 10, true},
		{-1, 1 << 40, false}, // ids from 2^63 apart
	} {
		if got := idSpanIsDense(tc.span, tc.tableBytes); got != tc.want {
			t.Errorf("span %d, %d bytes of table: dense %v, want %v", tc.span, tc.tableBytes, got, tc.want)
		}
	}
}
