// Package prompt turns trace rows into what is sent: prompts of exactly
// input_length tokens whose blocks repeat where the row's hash ids repeat
// (Builder), hash ids for token sequences (Hasher), and the ChatML rendering
// of chat messages shared with the emulator. It is pure: no clocks, no
// network.
package prompt

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/kvload-exporter/kvload-exporter/internal/rng"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

//go:generate go run ./internal/wordgen -tokenizers ../.cache/tokenizers -o words.go

// The prompt builder turns a trace row into a prompt of exactly input_length
// tokens whose blocks repeat wherever the row's hash ids repeat.
//
// Construction: a prompt is a run of words from promptWords, each written
// with its leading space (" word"). Every such word is one token in
// o200k_base, cl100k_base, Qwen3 and Llama-3 (checked by tests), and under
// all their pre-tokenizer regexes " word" is a chunk of its own, so BPE never
// merges across a word, and therefore never across a block: n words are n
// tokens, and a block's tokens do not depend on what precedes or follows it.
// This avoids the decode/re-encode drift of joining independently decoded
// token blocks (trace-semantics §5.3).
//
// Word i of the block of hash id h is picked by a counter-based hash of
// (seed, namespace, h, i), so blocks do not depend on row order, a partial
// block is a prefix of the full block of the same id, and a new namespace
// (one per replay pass) gives all-new prompts.

// ErrInconsistentLength reports a row whose input_length does not fit its
// hash_ids at the block size.
var ErrInconsistentLength = errors.New("input_length inconsistent with hash_ids")

// Names of the builder's seeded streams (internal/rng): streamPrompt keys
// the blocks of hash ids, and streamFreshPrompt the prompts of rows without
// hash ids, apart so that a row key can never reproduce a hash-id block.
const (
	streamPrompt      = "prompt.blocks"
	streamFreshPrompt = "prompt.fresh"
)

const wordBits = 12 // log2(len(promptWords))

// Options configures a Builder.
type Options struct {
	// BlockSize is the trace's hash block size in tokens (512 for Mooncake).
	BlockSize int
	// Seed is the workload seed.
	Seed uint64
	// CacheBytes bounds the block cache; 0 disables it.
	CacheBytes int64
	// Tokenizer is needed only by AppendTokenIDs: each word is mapped to its
	// id once, in NewBuilder.
	Tokenizer tokenizer.Tokenizer
}

// Builder builds prompts for trace rows. It is safe for concurrent use.
type Builder struct {
	blockSize int
	blockKey  uint64
	freshKey  uint64
	wordIDs   []int // by word index; nil without a tokenizer
	cache     *blockCache
	avgWord   int // bytes per word, rounded up; sizes buffers
}

// NewBuilder returns a builder. With a tokenizer, every word must be a
// single token of it, or the builder could not promise exact lengths.
func NewBuilder(o Options) (*Builder, error) {
	if o.BlockSize <= 0 {
		return nil, fmt.Errorf("prompt builder: block size must be positive, got %d", o.BlockSize)
	}
	if o.CacheBytes < 0 {
		return nil, fmt.Errorf("prompt builder: cache bytes must be ≥ 0, got %d", o.CacheBytes)
	}
	total := 0
	for _, w := range promptWords {
		total += len(w)
	}
	b := &Builder{
		blockSize: o.BlockSize,
		blockKey:  rng.Seed(o.Seed, streamPrompt),
		freshKey:  rng.Seed(o.Seed, streamFreshPrompt),
		avgWord:   (total + len(promptWords) - 1) / len(promptWords),
	}
	if o.CacheBytes > 0 {
		b.cache = newBlockCache(o.CacheBytes)
	}
	if o.Tokenizer != nil {
		b.wordIDs = make([]int, len(promptWords))
		for i, w := range promptWords {
			ids, err := o.Tokenizer.Encode(w)
			if err != nil {
				return nil, fmt.Errorf("prompt builder: %w", err)
			}
			if len(ids) != 1 {
				return nil, fmt.Errorf("prompt builder: word %q is %d tokens in %s, not 1; this tokenizer cannot get exact prompt lengths",
					w, len(ids), o.Tokenizer.Name())
			}
			b.wordIDs[i] = ids[0]
		}
	}
	return b, nil
}

// BlockSize returns the block size in tokens.
func (b *Builder) BlockSize() int { return b.blockSize }

// blockSizes checks rec and returns the size of its last block (the others
// are full), or for a row without hash ids its whole length.
func (b *Builder) blockSizes(rec *trace.Record) (int, error) {
	if rec.InputLength == nil {
		return 0, errors.New("prompt: row has no input_length")
	}
	isl := *rec.InputLength
	n := len(rec.HashIDs)
	if n == 0 {
		if isl <= 0 {
			return 0, fmt.Errorf("prompt: input_length must be positive for a row without hash_ids, got %d", isl)
		}
		return isl, nil
	}
	last := isl - (n-1)*b.blockSize
	if last <= 0 || last > b.blockSize {
		return 0, fmt.Errorf("%w: input_length %d with %d hash_ids at block size %d leaves %d tokens for the last block, outside 1..%d",
			ErrInconsistentLength, isl, n, b.blockSize, last, b.blockSize)
	}
	return last, nil
}

// AppendText appends the prompt of rec to dst: input_length tokens (as words)
// built from rec's hash ids in namespace ns. A row without hash ids gets text
// of its own, keyed by rowKey, which the caller keeps unique per row.
func (b *Builder) AppendText(dst []byte, rec *trace.Record, ns, rowKey uint64) ([]byte, error) {
	dst, _, err := b.AppendTextRoom(dst, rec, ns, rowKey, 0)
	return dst, err
}

// AppendTextRoom is AppendText leaving room for up to room tokens that the
// server adds (a chat template), and returns how many tokens it built. The
// room comes off the end of the last block only, and a token of that block
// stays: earlier blocks are shared with other rows, the last one keeps the
// prompt its own, and a shorter block is a prefix of the whole one.
func (b *Builder) AppendTextRoom(dst []byte, rec *trace.Record, ns, rowKey uint64, room int) ([]byte, int, error) {
	last, err := b.blockSizes(rec)
	if err != nil {
		return dst, 0, err
	}
	cut := min(max(room, 0), last-1)
	n := rec.ISL() - cut
	dst = grow(dst, n*b.avgWord)
	if len(rec.HashIDs) == 0 {
		return appendWordsText(dst, b.rowKey(ns, rowKey), last-cut), n, nil
	}
	for i, h := range rec.HashIDs {
		k := b.blockSize
		if i == len(rec.HashIDs)-1 {
			k = last - cut
		}
		dst = b.appendBlockText(dst, ns, h, k)
	}
	return dst, n, nil
}

// AppendTokenIDs is AppendText as token ids of the builder's tokenizer, for
// sending prompt_format token_ids; decoding them gives AppendText's text.
func (b *Builder) AppendTokenIDs(dst []int, rec *trace.Record, ns, rowKey uint64) ([]int, error) {
	if b.wordIDs == nil {
		return dst, errors.New("prompt: token ids need a tokenizer in Options")
	}
	last, err := b.blockSizes(rec)
	if err != nil {
		return dst, err
	}
	dst = grow(dst, rec.ISL())
	if len(rec.HashIDs) == 0 {
		return b.appendWordIDs(dst, b.rowKey(ns, rowKey), last), nil
	}
	for i, h := range rec.HashIDs {
		n := b.blockSize
		if i == len(rec.HashIDs)-1 {
			n = last
		}
		dst = b.appendBlockIDs(dst, ns, h, n)
	}
	return dst, nil
}

// AppendBlockText appends the first n tokens of the block of hash id h in
// namespace ns.
func (b *Builder) AppendBlockText(dst []byte, ns uint64, h int64, n int) []byte {
	return b.appendBlockText(dst, ns, h, n)
}

func (b *Builder) appendBlockText(dst []byte, ns uint64, h int64, n int) []byte {
	if b.cache == nil {
		return appendWordsText(dst, b.hashKey(ns, h), n)
	}
	k := cacheKey{ns: ns, h: h, n: int32(n)}
	e, hit, admit := b.cache.get(k)
	if hit {
		return append(dst, e.text...)
	}
	// Built in place, then copied at its exact size: a block's length is
	// known only once built, and an estimate would leave slack in every
	// entry that the cache's bound does not see.
	start := len(dst)
	dst = appendWordsText(dst, b.hashKey(ns, h), n)
	if admit {
		b.cache.put(k, cacheEntry{text: bytes.Clone(dst[start:])})
	}
	return dst
}

func (b *Builder) appendBlockIDs(dst []int, ns uint64, h int64, n int) []int {
	if b.cache == nil {
		return b.appendWordIDs(dst, b.hashKey(ns, h), n)
	}
	k := cacheKey{ns: ns, h: h, n: int32(n), ids: true}
	e, hit, admit := b.cache.get(k)
	if hit {
		return append(dst, e.ids...)
	}
	if !admit {
		return b.appendWordIDs(dst, b.hashKey(ns, h), n)
	}
	ids := b.appendWordIDs(make([]int, 0, n), b.hashKey(ns, h), n)
	b.cache.put(k, cacheEntry{ids: ids})
	return append(dst, ids...)
}

// hashKey and rowKey give the key of one block's word stream.
func (b *Builder) hashKey(ns uint64, h int64) uint64 {
	return mix64(b.blockKey ^ mix64(ns^0x243f6a8885a308d3) ^ mix64(uint64(h)+0x13198a2e03707344))
}

func (b *Builder) rowKey(ns, row uint64) uint64 {
	return mix64(b.freshKey ^ mix64(ns^0x243f6a8885a308d3) ^ mix64(row+0x13198a2e03707344))
}

// mix64 is the SplitMix64 finaliser: a bijection with good avalanche, so
// counters in give independent-looking words out.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Word i of the stream key is 12 bits of mix64(key + ⌊i/5⌋·φ): one hash
// gives five picks, and word i depends on (key, i) only, which makes every
// shorter stream a prefix of a longer one.
const (
	wordsPerHash = 64 / wordBits
	wordMask     = 1<<wordBits - 1
	golden64     = 0x9e3779b97f4a7c15
)

func appendWordsText(dst []byte, key uint64, n int) []byte {
	for i := 0; i < n; i += wordsPerHash {
		r := mix64(key + uint64(i/wordsPerHash)*golden64)
		for j := i; j < min(i+wordsPerHash, n); j++ {
			dst = append(dst, promptWords[r&wordMask]...)
			r >>= wordBits
		}
	}
	return dst
}

func (b *Builder) appendWordIDs(dst []int, key uint64, n int) []int {
	for i := 0; i < n; i += wordsPerHash {
		r := mix64(key + uint64(i/wordsPerHash)*golden64)
		for j := i; j < min(i+wordsPerHash, n); j++ {
			dst = append(dst, b.wordIDs[r&wordMask])
			r >>= wordBits
		}
	}
	return dst
}

func grow[S ~[]E, E any](s S, n int) S {
	if cap(s)-len(s) < n {
		t := make(S, len(s), len(s)+n)
		copy(t, s)
		return t
	}
	return s
}
