package synth

// Stream names of the seeded random sources (see internal/rng). Each knob
// draws from its own stream, so changing one knob (say the prefix-root
// multiplier) does not reshuffle what another (say the sampled lengths)
// produces.
const (
	StreamPrefixRoot = "synthesis.prefix_root"
	StreamTrie       = "synthesis.trie_path"
	StreamCounts     = "synthesis.burst_counts"
	StreamGaps       = "synthesis.gaps"
	StreamLastBlock  = "synthesis.last_block"
	StreamOutputLen  = "synthesis.output_length"
	StreamLeafLen    = "synthesis.leaf_length"
)
