package prompt

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Hasher assigns Mooncake hash ids to token sequences the way Dynamo's
// datagen hasher does (trace-semantics §7): the tokens are cut into
// consecutive BlockSize chunks (the last may be shorter), and each chunk gets
// the id interned under (id of the previous chunk, the chunk's tokens), the
// first chunk's parent being a root sentinel. Ids are consecutive from 0 in
// order of first appearance across every sequence given to one Hasher, so two
// sequences share an id exactly when they share the whole token prefix up to
// and including that block.
//
// The key holds a SHA-256 digest of the block's tokens rather than the
// tokens, so memory grows by a few dozen bytes per distinct block instead of
// 4·BlockSize; two different blocks colliding is a 2⁻¹²⁸-scale event,
// far below Dynamo's own use of Python's 64-bit hash. A Hasher is not safe
// for concurrent use.
type Hasher struct {
	blockSize int
	intern    map[hasherKey]int64
	buf       []byte
}

type hasherKey struct {
	parent int64
	digest [sha256.Size]byte
}

// hasherRoot is the parent of every first block; real ids are ≥ 0.
const hasherRoot = -1

// NewHasher returns a Hasher for blocks of blockSize tokens.
func NewHasher(blockSize int) (*Hasher, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("hasher: block size must be positive, got %d", blockSize)
	}
	return &Hasher{blockSize: blockSize, intern: make(map[hasherKey]int64)}, nil
}

// Len returns the number of distinct ids assigned so far.
func (h *Hasher) Len() int { return len(h.intern) }

// Append appends the hash ids of tokens to dst: ⌈len(tokens)/BlockSize⌉ ids.
func (h *Hasher) Append(dst []int64, tokens []int) []int64 {
	parent := int64(hasherRoot)
	for start := 0; start < len(tokens); start += h.blockSize {
		block := tokens[start:min(start+h.blockSize, len(tokens))]
		// Eight bytes per token keep any int exact; the length is implied
		// by the digest input's size.
		h.buf = h.buf[:0]
		for _, t := range block {
			h.buf = binary.LittleEndian.AppendUint64(h.buf, uint64(t))
		}
		k := hasherKey{parent: parent, digest: sha256.Sum256(h.buf)}
		id, ok := h.intern[k]
		if !ok {
			id = int64(len(h.intern))
			h.intern[k] = id
		}
		dst = append(dst, id)
		parent = id
	}
	return dst
}
