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
		span        int64
		occurrences int
		want        bool
	}{
		{30_000_000, 48_000_000, true}, // make bench-scale's trace
		{182_789, 288_500, true},       // the conversation trace
		{1 << 40, 20, false},
		{1 << 30, 1000, false},
		{1000, 1, true},
	} {
		if got := idSpanIsDense(tc.span, tc.occurrences); got != tc.want {
			t.Errorf("span %d, %d occurrences: dense %v, want %v", tc.span, tc.occurrences, got, tc.want)
		}
	}
}
