package synth

import (
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
)

// Stream names of the seeded random sources. Each knob draws from its own
// stream, so changing one knob (say the prefix-root multiplier) does not
// reshuffle what another (say the sampled lengths) produces.
const (
	StreamPrefixRoot = "synthesis.prefix_root"
	StreamTrie       = "synthesis.trie_path"
	StreamCounts     = "synthesis.burst_counts"
	StreamGaps       = "synthesis.gaps"
	StreamLastBlock  = "synthesis.last_block"
	StreamOutputLen  = "synthesis.output_length"
	StreamLeafLen    = "synthesis.leaf_length"
	StreamPrompt     = "prompt.blocks"
)

// DeriveSeed returns the seed of the stream called name under root. Like
// AIPerf's child seeds it is the first 8 bytes, big-endian, of
// SHA-256("root:name"), so streams are independent and stable across runs.
func DeriveSeed(root uint64, name string) uint64 {
	sum := sha256.Sum256([]byte(strconv.FormatUint(root, 10) + ":" + name))
	return binary.BigEndian.Uint64(sum[:8])
}

// NewRand returns the deterministic generator of the stream called name.
func NewRand(root uint64, name string) *rand.Rand {
	s := DeriveSeed(root, name)
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}
