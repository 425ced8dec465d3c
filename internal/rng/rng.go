// Package rng derives the seeded random streams that synthesis and the
// prompt builder draw from, so that one workload seed reproduces both.
package rng

import (
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
)

// Seed returns the seed of the stream called name under root. Like
// AIPerf's child seeds it is the first 8 bytes, big-endian, of
// SHA-256("root:name"), so streams are independent and stable across runs.
func Seed(root uint64, name string) uint64 {
	sum := sha256.Sum256([]byte(strconv.FormatUint(root, 10) + ":" + name))
	return binary.BigEndian.Uint64(sum[:8])
}

// New returns the deterministic generator of the stream called name.
func New(root uint64, name string) *rand.Rand {
	s := Seed(root, name)
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}
