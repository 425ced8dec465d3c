package kvevents

import "math/bits"

// seenSet remembers, approximately, every block a stream stored over its
// last generation to 2*generation stores: two Bloom filters, the current
// one and the one before, the older dropped when the current one fills. A
// block the store no longer holds (its removal long forgotten) but seen
// here was stored and let go: evicted, not never stored. A false positive
// (1.6 % with both filters full, 0.8 % a full filter) reads a block never
// stored as evicted.
type seenSet struct {
	generation int
	bits       uint64   // of each filter: 10 a key
	cur, prev  []uint64 // the filters
	added      int      // keys added to cur
}

const (
	// seenGeneration is 4 Mi blocks: 64 Mi tokens of 16-token blocks; the
	// two filters take 10 MB.
	seenGeneration = 1 << 22
	seenHashes     = 7 // the best number of probes at 10 bits a key
)

func newSeenSet(generation int) seenSet {
	return seenSet{generation: generation, bits: 10 * uint64(generation)}
}

// add remembers k.
func (s *seenSet) add(k chainKey) {
	if s.cur == nil {
		s.cur = make([]uint64, s.bits/64)
	}
	if s.added == s.generation {
		s.prev, s.cur, s.added = s.cur, s.prev, 0
		if s.cur == nil {
			s.cur = make([]uint64, s.bits/64)
		} else {
			clear(s.cur)
		}
	}
	h1, h2 := probes(k)
	for i := range uint64(seenHashes) {
		b := (h1 + i*h2) % s.bits
		s.cur[b/64] |= 1 << (b % 64)
	}
	s.added++
}

// has tells whether k was added (or collides with keys that were).
func (s *seenSet) has(k chainKey) bool {
	h1, h2 := probes(k)
	return s.in(s.cur, h1, h2) || s.in(s.prev, h1, h2)
}

func (s *seenSet) in(set []uint64, h1, h2 uint64) bool {
	if set == nil {
		return false
	}
	for i := range uint64(seenHashes) {
		b := (h1 + i*h2) % s.bits
		if set[b/64]&(1<<(b%64)) == 0 {
			return false
		}
	}
	return true
}

// probes are the two hashes whose combinations pick a key's bits (Kirsch
// and Mitzenmacher's double hashing): the key is a hash already, mixed
// once more for the second.
func probes(k chainKey) (uint64, uint64) {
	h1 := uint64(k)
	h2 := bits.RotateLeft64(h1*0x9e3779b97f4a7c15, 31) | 1
	return h1, h2
}
