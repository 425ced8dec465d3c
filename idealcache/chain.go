package idealcache

// An engine's prefix cache keys a block by the whole chain of blocks before
// it (vLLM hashes the parent block's hash with the block's tokens, SGLang
// walks a radix tree), so a block is reused only after the same prefix:
// [1, 4, 6] after [0, 1, 2] and [0, 3, 4, 5] hits nothing. The ideal cache
// keys its blocks the same way. On a trace whose ids are prefix-consistent
// (each id always follows the same ids, as in Mooncake's traces and
// Dynamo's hasher) the chain key of a block and its id name the same
// blocks, and the model counts exactly what it would count by id.

// chainRoot is the key of the empty chain before a row's first block.
const chainRoot uint64 = 0x9e3779b97f4a7c15

// ChainKey is the key of block id after the chain of blocks whose key is
// parent (ChainKeys' first block follows chainRoot). Keys are 64-bit
// hashes: two chains share a key with probability 2⁻⁶⁴ a pair, some 10⁻⁵
// over a cache of 10⁷ blocks; where they do, one block reads as cached.
// Chains of one block never collide (a bijection of the id).
func ChainKey(parent uint64, id int64) uint64 {
	return fmix64(parent*0xbf58476d1ce4e5b9 + uint64(id))
}

// AppendChainKeys appends to dst the chain key of each block of ids, a
// row's hash ids in order.
func AppendChainKeys(dst []uint64, ids []int64) []uint64 {
	key := chainRoot
	for _, id := range ids {
		key = ChainKey(key, id)
		dst = append(dst, key)
	}
	return dst
}

// fmix64 is MurmurHash3's 64-bit finalizer: a bijection whose every output
// bit depends on every input bit.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// ChainReuse finds the rows of a trace that reuse a hash id after another
// chain of blocks than the one it followed where it first appeared: the
// ids a prefix cache cannot serve as the id alone would suggest. Feed it
// every row, in file order. The zero value keeps every id in a map;
// NewChainReuse makes one for a trace's id span.
type ChainReuse struct {
	// first is a fingerprint of each id's chain key where it first
	// appeared (its high 32 bits, the lowest set so that 0 means not
	// seen): in a slice indexed by id − lo where the ids are dense, else
	// in a map. Two chains' fingerprints agree with probability 2⁻³¹,
	// which can only leave a reuse uncounted.
	dense  []uint32
	lo     int64
	sparse map[int64]uint32

	keys []uint64 // scratch

	Rows      int // rows with hash ids seen
	Reusing   int // of those, rows with an id after another chain
	FirstLine int // the first reusing row's place, as Row was told; 0 when none
}

// NewChainReuse returns a check of a trace whose ids lie in [lo, hi]; dense
// says whether a slice of hi − lo + 1 entries (4 bytes each) is the right
// size for it, else ids are kept in a map.
func NewChainReuse(lo, hi int64, dense bool) *ChainReuse {
	c := &ChainReuse{lo: lo}
	if dense && hi >= lo && hi-lo < 1<<32 {
		c.dense = make([]uint32, hi-lo+1)
	}
	return c
}

// Row checks one row's ids; line names it in FirstLine. It tells whether
// the row reuses an id after another chain.
func (c *ChainReuse) Row(ids []int64, line int) bool {
	if len(ids) == 0 {
		return false
	}
	c.Rows++
	c.keys = AppendChainKeys(c.keys[:0], ids)
	reuses := false
	for i, id := range ids {
		key := uint32(c.keys[i]>>32) | 1
		var first uint32
		if c.dense != nil && id >= c.lo && id-c.lo < int64(len(c.dense)) {
			first = c.dense[id-c.lo]
			if first == 0 {
				c.dense[id-c.lo] = key
			}
		} else {
			if c.sparse == nil {
				c.sparse = map[int64]uint32{}
			}
			first = c.sparse[id]
			if first == 0 {
				c.sparse[id] = key
			}
		}
		reuses = reuses || (first != 0 && first != key)
	}
	if reuses {
		c.Reusing++
		if c.FirstLine == 0 {
			c.FirstLine = line
		}
	}
	return reuses
}

// SampleHash is the hash a sampled Stack (Stack.Sample) picks a block by:
// its chain key in its namespace, every bit mixed into the high ones. It
// is a function of the block alone, so every row that uses a block finds
// it in the sample or out of it alike.
func SampleHash(ns, chain uint64) uint64 {
	return fmix64(chain ^ fmix64(ns))
}
