// Package tokenizer turns text into token ids and back: the tiktoken
// encodings built into the binary and byte-level BPE models read from a
// Hugging Face tokenizer.json.
package tokenizer

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dlclark/regexp2/v2"
	tiktoken "github.com/tiktoken-go/tokenizer"
)

// Tokenizer turns text into token ids and back. Encode never adds special
// tokens (BOS, EOS, templates): it is Hugging Face's
// encode(text, add_special_tokens=False). Implementations are safe for
// concurrent use.
type Tokenizer interface {
	Encode(text string) ([]int, error)
	Decode(ids []int) (string, error)
	Name() string
}

// Names of the tokenizers built into the binary.
const (
	O200kBase  = "o200k_base"
	Cl100kBase = "cl100k_base"
)

// Load returns the tokenizer named by spec: "o200k_base" or
// "cl100k_base" (tiktoken encodings, embedded), or else the path of a
// Hugging Face tokenizer.json holding a byte-level BPE model.
func Load(spec string) (Tokenizer, error) {
	switch spec {
	case O200kBase, Cl100kBase:
		c, err := tiktoken.Get(tiktoken.Encoding(spec))
		if err != nil {
			return nil, fmt.Errorf("tokenizer %s: %w", spec, err)
		}
		return tiktokenTokenizer{c}, nil
	case "":
		return nil, errors.New("tokenizer: empty name")
	}
	data, err := os.ReadFile(spec)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %q is neither %s, %s nor a readable tokenizer.json: %w",
			spec, O200kBase, Cl100kBase, err)
	}
	t, err := parseHFTokenizer(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec, err)
	}
	t.name = spec
	return t, nil
}

// tiktokenTokenizer adapts tiktoken-go. Like tiktoken's encode_ordinary,
// text that spells a special token (<|endoftext|>) is encoded as plain text.
type tiktokenTokenizer struct{ c tiktoken.Codec }

func (t tiktokenTokenizer) Name() string { return t.c.GetName() }

func (t tiktokenTokenizer) Encode(text string) ([]int, error) {
	ids, _, err := t.c.Encode(text)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.c.GetName(), err)
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out, nil
}

func (t tiktokenTokenizer) Decode(ids []int) (string, error) {
	u := make([]uint, len(ids))
	for i, id := range ids {
		if id < 0 {
			return "", fmt.Errorf("%s: invalid token id %d", t.c.GetName(), id)
		}
		u[i] = uint(id)
	}
	s, err := t.c.Decode(u)
	if err != nil {
		return "", fmt.Errorf("%s: %w", t.c.GetName(), err)
	}
	return s, nil
}

// hfTokenizer is a byte-level BPE tokenizer read from a Hugging Face
// tokenizer.json, the kind Llama 3, Qwen2/3 and DeepSeek-V3 ship.
//
// Why our own code: the pure-Go ports of the tokenizers library
// (github.com/sugarme/tokenizer v0.3.0, the only version on the module
// proxy) compile Split patterns with the standard regexp package, which has
// no lookahead, so the "\s+(?!\S)" of every current byte-level model fails to
// load; the other options wrap the Rust library with cgo. The subset here is
// small: added tokens, a chain of Split pre-tokenizers (regexp2, which has
// lookahead), the GPT-2 byte-to-unicode map, and rank-ordered merges. It is
// checked against transformers.js on real vocabularies (testdata/).
//
// Choices and limits:
//   - Added tokens (special or not) are matched literally in the input,
//     leftmost-longest, before pre-tokenization, as the Rust library does
//     even with add_special_tokens=False; their lstrip/rstrip/single_word
//     options are not supported and make loading fail.
//   - An NFC normalizer is accepted but not applied (the standard library has
//     no Unicode composition tables): text already in NFC, which is almost
//     all text and everything the prompt builder writes, encodes exactly;
//     decomposed input may encode differently.
//   - Decode returns the raw bytes; ids that end inside a multi-byte
//     character give invalid UTF-8 rather than U+FFFD.
type hfTokenizer struct {
	name         string
	vocab        map[string]int // byte-level spelling → id
	tokens       []string       // id → byte-level spelling, or an added token's text
	isAdded      []bool         // by id: decode verbatim, no byte-level mapping
	merges       map[[2]int32]merge
	splits       []*regexp2.Regexp
	added        map[byte][]addedToken // by first byte, longest first
	ignoreMerges bool
	byteID       [256]int32 // id of each single byte
	byteRune     [256]rune
	runeByte     map[rune]byte
	// pieces caches the ids of pre-tokens seen, as Hugging Face's BPE
	// model does: text repeats its words, and the merges are most of the
	// cost of a word. At most maxCachedPieces are kept.
	pieces       sync.Map // string → []int32
	cachedPieces atomic.Int64
}

// maxCachedPieces bounds the pre-token cache (a few MB).
const maxCachedPieces = 1 << 16

type merge struct{ rank, id int32 }

type addedToken struct {
	content string
	id      int
}

// tokenizerJSON is the part of tokenizer.json this package reads.
type tokenizerJSON struct {
	AddedTokens  []addedTokenJSON       `json:"added_tokens"`
	Normalizer   *normalizerJSON        `json:"normalizer"`
	PreTokenizer *preTokenizerJSON      `json:"pre_tokenizer"`
	Model        modelJSON              `json:"model"`
	Decoder      *struct{ Type string } `json:"decoder"`
}

type addedTokenJSON struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
}

type normalizerJSON struct {
	Type        string           `json:"type"`
	Normalizers []normalizerJSON `json:"normalizers"`
}

type preTokenizerJSON struct {
	Type           string             `json:"type"`
	Pretokenizers  []preTokenizerJSON `json:"pretokenizers"`
	Pattern        map[string]string  `json:"pattern"`
	Behavior       string             `json:"behavior"`
	Invert         bool               `json:"invert"`
	AddPrefixSpace bool               `json:"add_prefix_space"`
	UseRegex       *bool              `json:"use_regex"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]int    `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
}

// gpt2Pattern is the pre-tokenizer regex of a ByteLevel pre-tokenizer with
// use_regex true (GPT-2 and RoBERTa style tokenizer.json files).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// parseHFTokenizer reads a tokenizer.json document. Anything outside the
// supported subset is an error that names it, never a silent approximation.
func parseHFTokenizer(data []byte) (*hfTokenizer, error) {
	var tj tokenizerJSON
	if err := json.Unmarshal(data, &tj); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if err := checkSupported(&tj); err != nil {
		return nil, err
	}
	m := tj.Model
	t := &hfTokenizer{vocab: m.Vocab, ignoreMerges: m.IgnoreMerges, runeByte: make(map[rune]byte, 256)}
	var err error
	if t.splits, err = splitPatterns(tj.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.fillVocab(m.Vocab, tj.AddedTokens); err != nil {
		return nil, err
	}
	if err := t.mapBytes(m.Vocab); err != nil {
		return nil, err
	}
	if err := t.readMerges(m.Vocab, m.Merges); err != nil {
		return nil, err
	}
	if err := t.addTokens(tj.AddedTokens); err != nil {
		return nil, err
	}
	return t, nil
}

// checkSupported rejects the model, normalizer and decoder options outside
// the subset this package implements.
func checkSupported(tj *tokenizerJSON) error {
	m := tj.Model
	switch {
	case m.Type != "BPE":
		return fmt.Errorf("tokenizer.json: model type %q is not supported (only byte-level BPE)", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return errors.New("tokenizer.json: BPE dropout is not supported")
	case m.ByteFallback:
		return errors.New("tokenizer.json: byte_fallback (SentencePiece-style BPE) is not supported")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return errors.New("tokenizer.json: subword prefixes/suffixes are not supported")
	case len(m.Vocab) == 0:
		return errors.New("tokenizer.json: empty vocab")
	}
	if err := checkNormalizer(tj.Normalizer); err != nil {
		return err
	}
	if tj.Decoder != nil && tj.Decoder.Type != "ByteLevel" {
		return fmt.Errorf("tokenizer.json: decoder %q is not supported (only ByteLevel)", tj.Decoder.Type)
	}
	return nil
}

// fillVocab sizes the id tables to the largest id, vocab or added, and
// spells each vocab id; the added tokens are spelled by addTokens.
func (t *hfTokenizer) fillVocab(vocab map[string]int, added []addedTokenJSON) error {
	maxID := 0
	for _, id := range vocab {
		maxID = max(maxID, id)
	}
	for _, a := range added {
		maxID = max(maxID, a.ID)
	}
	t.tokens = make([]string, maxID+1)
	t.isAdded = make([]bool, maxID+1)
	for s, id := range vocab {
		if id < 0 {
			return fmt.Errorf("tokenizer.json: negative id %d for %q", id, s)
		}
		t.tokens[id] = s
	}
	return nil
}

// mapBytes builds GPT-2's byte-to-unicode map: printable bytes stand for
// themselves, the others take code points from 256 upwards, in byte order.
// Every byte must be in the vocab, or some text could not be encoded.
func (t *hfTokenizer) mapBytes(vocab map[string]int) error {
	next := rune(256)
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE) {
			r = next
			next++
		}
		t.byteRune[b] = r
		t.runeByte[r] = byte(b)
		id, ok := vocab[string(r)]
		if !ok {
			return fmt.Errorf("tokenizer.json: vocab lacks byte 0x%02x (%q); not a byte-level BPE", b, string(r))
		}
		t.byteID[b] = int32(id)
	}
	return nil
}

// readMerges indexes the merges by the pair of ids they join, with their
// rank (their position in the file) and the id they make.
func (t *hfTokenizer) readMerges(vocab map[string]int, merges []json.RawMessage) error {
	t.merges = make(map[[2]int32]merge, len(merges))
	for rank, raw := range merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return fmt.Errorf("tokenizer.json: merge %d: %w", rank, err)
		}
		ia, oka := vocab[a]
		ib, okb := vocab[b]
		ic, okc := vocab[a+b]
		if !oka || !okb || !okc {
			return fmt.Errorf("tokenizer.json: merge %d (%q %q) uses tokens missing from the vocab", rank, a, b)
		}
		key := [2]int32{int32(ia), int32(ib)}
		if _, dup := t.merges[key]; !dup { // the first (lowest) rank wins
			t.merges[key] = merge{rank: int32(rank), id: int32(ic)}
		}
	}
	return nil
}

// addTokens records the added tokens, indexed by first byte and longest
// first so that the literal match in the input is leftmost-longest.
func (t *hfTokenizer) addTokens(added []addedTokenJSON) error {
	t.added = make(map[byte][]addedToken)
	for _, a := range added {
		if a.Content == "" {
			return fmt.Errorf("tokenizer.json: added token %d is empty", a.ID)
		}
		if a.LStrip || a.RStrip || a.SingleWord {
			return fmt.Errorf("tokenizer.json: added token %q uses lstrip/rstrip/single_word, which is not supported", a.Content)
		}
		t.tokens[a.ID] = a.Content
		t.isAdded[a.ID] = true
		t.added[a.Content[0]] = append(t.added[a.Content[0]], addedToken{a.Content, a.ID})
	}
	for _, list := range t.added {
		sort.SliceStable(list, func(i, j int) bool { return len(list[i].content) > len(list[j].content) })
	}
	return nil
}

func checkNormalizer(n *normalizerJSON) error {
	if n == nil {
		return nil
	}
	switch n.Type {
	case "NFC":
		return nil // assumed, see hfTokenizer
	case "Sequence":
		for i := range n.Normalizers {
			if err := checkNormalizer(&n.Normalizers[i]); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("tokenizer.json: normalizer %q is not supported", n.Type)
}

// splitPatterns flattens the pre-tokenizer into the chain of regexes that
// cut the text; every piece of one becomes the input of the next.
func splitPatterns(p *preTokenizerJSON) ([]*regexp2.Regexp, error) {
	if p == nil {
		return nil, errors.New("tokenizer.json: no pre_tokenizer; a byte-level BPE needs ByteLevel")
	}
	var out []*regexp2.Regexp
	sawByteLevel := false
	var walk func(p *preTokenizerJSON) error
	walk = func(p *preTokenizerJSON) error {
		if sawByteLevel {
			return errors.New("tokenizer.json: a pre-tokenizer after ByteLevel is not supported")
		}
		switch p.Type {
		case "Sequence":
			for i := range p.Pretokenizers {
				if err := walk(&p.Pretokenizers[i]); err != nil {
					return err
				}
			}
			return nil
		case "Split":
			if p.Behavior != "Isolated" || p.Invert {
				return fmt.Errorf("tokenizer.json: Split behavior %q (invert %v) is not supported, only Isolated", p.Behavior, p.Invert)
			}
			expr, ok := p.Pattern["Regex"]
			if !ok {
				s, ok := p.Pattern["String"]
				if !ok {
					return errors.New("tokenizer.json: Split pattern has neither Regex nor String")
				}
				expr = regexp2.Escape(s)
			}
			re, err := regexp2.Compile(expr, regexp2.None)
			if err != nil {
				return fmt.Errorf("tokenizer.json: Split pattern %q: %w", expr, err)
			}
			out = append(out, re)
			return nil
		case "ByteLevel":
			sawByteLevel = true
			if p.AddPrefixSpace {
				return errors.New("tokenizer.json: ByteLevel add_prefix_space is not supported")
			}
			if p.UseRegex == nil || *p.UseRegex {
				out = append(out, regexp2.MustCompile(gpt2Pattern, regexp2.None))
			}
			return nil
		}
		return fmt.Errorf("tokenizer.json: pre-tokenizer %q is not supported", p.Type)
	}
	if err := walk(p); err != nil {
		return nil, err
	}
	if !sawByteLevel {
		return nil, errors.New("tokenizer.json: pre_tokenizer lacks ByteLevel; not a byte-level BPE")
	}
	return out, nil
}

// parseMerge reads one merge, written "a b" (older files) or ["a", "b"].
func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return "", "", fmt.Errorf("%q is not two tokens", s)
		}
		return a, b, nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("%s is neither \"a b\" nor [a, b]", raw)
	}
	return pair[0], pair[1], nil
}

// Name returns the path the tokenizer was loaded from.
func (t *hfTokenizer) Name() string { return t.name }

// VocabSize returns one more than the largest id.
func (t *hfTokenizer) VocabSize() int { return len(t.tokens) }

// Encode tokenizes text without adding special tokens.
func (t *hfTokenizer) Encode(text string) ([]int, error) {
	out := make([]int, 0, len(text)/3+1)
	var err error
	start := 0
	for i := 0; i < len(text); i++ {
		cands := t.added[text[i]]
		for _, a := range cands {
			if strings.HasPrefix(text[i:], a.content) {
				if out, err = t.encodeOrdinary(out, text[start:i]); err != nil {
					return nil, err
				}
				out = append(out, a.id)
				i += len(a.content) - 1
				start = i + 1
				break
			}
		}
	}
	return t.encodeOrdinary(out, text[start:])
}

// encodeOrdinary encodes text that holds no added token.
func (t *hfTokenizer) encodeOrdinary(out []int, text string) ([]int, error) {
	if text == "" {
		return out, nil
	}
	return t.splitAndEncode(out, text, 0)
}

// splitAndEncode cuts text with the level-th split regex (matches and the
// gaps between them are pieces) and hands each piece to the next level.
func (t *hfTokenizer) splitAndEncode(out []int, text string, level int) ([]int, error) {
	if level == len(t.splits) {
		return t.bpe(out, text), nil
	}
	locs, err := t.splits[level].FindAllStringIndex(text, -1)
	if err != nil {
		return nil, fmt.Errorf("%s: pre-tokenizer: %w", t.name, err)
	}
	prev := 0
	for _, loc := range locs {
		if loc[0] > prev {
			if out, err = t.splitAndEncode(out, text[prev:loc[0]], level+1); err != nil {
				return nil, err
			}
		}
		if loc[1] > loc[0] {
			if out, err = t.splitAndEncode(out, text[loc[0]:loc[1]], level+1); err != nil {
				return nil, err
			}
		}
		prev = loc[1]
	}
	if prev < len(text) {
		return t.splitAndEncode(out, text[prev:], level+1)
	}
	return out, nil
}

// bpe appends the ids of one pre-token.
func (t *hfTokenizer) bpe(out []int, piece string) []int {
	if len(piece) == 1 {
		return append(out, int(t.byteID[piece[0]]))
	}
	if ids, ok := t.pieces.Load(piece); ok {
		for _, id := range ids.([]int32) {
			out = append(out, int(id))
		}
		return out
	}
	n := len(out)
	out = t.bpeUncached(out, piece)
	if len(piece) <= smallPiece && t.cachedPieces.Load() < maxCachedPieces {
		ids := make([]int32, len(out)-n)
		for i, id := range out[n:] {
			ids[i] = int32(id)
		}
		if _, loaded := t.pieces.LoadOrStore(strings.Clone(piece), ids); !loaded {
			t.cachedPieces.Add(1)
		}
	}
	return out
}

// bpeUncached is bpe without the cache.
func (t *hfTokenizer) bpeUncached(out []int, piece string) []int {
	if t.ignoreMerges {
		var sb strings.Builder
		sb.Grow(2 * len(piece))
		for i := 0; i < len(piece); i++ {
			sb.WriteRune(t.byteRune[piece[i]])
		}
		if id, ok := t.vocab[sb.String()]; ok {
			return append(out, id)
		}
	}
	return t.mergeBytes(out, piece)
}

// mergeBytes applies the merges to the bytes of piece: always the pair of
// lowest rank next, the leftmost on a tie, as the Rust library does. A heap
// keeps long pieces (a page of CJK text is one pre-token) O(n log n).
func (t *hfTokenizer) mergeBytes(out []int, piece string) []int {
	n := len(piece)
	if n <= smallPiece {
		return t.mergeSmall(out, piece)
	}
	id := make([]int32, n)
	prev := make([]int, n)
	next := make([]int, n)
	for i := 0; i < n; i++ {
		id[i] = t.byteID[piece[i]]
		prev[i] = i - 1
		next[i] = i + 1
	}
	next[n-1] = -1
	h := make(mergeHeap, 0, n)
	push := func(i int) {
		if i < 0 || next[i] < 0 {
			return
		}
		j := next[i]
		if m, ok := t.merges[[2]int32{id[i], id[j]}]; ok {
			heap.Push(&h, mergeCand{rank: m.rank, pos: i, left: id[i], right: id[j]})
		}
	}
	for i := 0; i < n-1; i++ {
		push(i)
	}
	for len(h) > 0 {
		c := heap.Pop(&h).(mergeCand)
		i := c.pos
		j := next[i]
		// Stale: a symbol was merged away or changed since the push.
		if id[i] != c.left || j < 0 || id[j] != c.right {
			continue
		}
		id[i] = t.merges[[2]int32{c.left, c.right}].id
		id[j] = -1
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if prev[i] >= 0 {
			push(prev[i])
		}
		push(i)
	}
	for i := 0; i >= 0; i = next[i] {
		out = append(out, int(id[i]))
	}
	return out
}

// smallPiece is the longest pre-token merged by mergeSmall: most pieces
// are words, and a quadratic scan over a stack array beats the heap there.
const smallPiece = 24

// mergeSmall is mergeBytes for short pieces, without allocating: each round
// merges the leftmost pair of lowest rank.
func (t *hfTokenizer) mergeSmall(out []int, piece string) []int {
	const none = math.MaxInt32
	var idBuf, rankBuf [smallPiece]int32
	ids, ranks := idBuf[:len(piece)], rankBuf[:len(piece)-1]
	for i := range ids {
		ids[i] = t.byteID[piece[i]]
	}
	// ranks[i] is the rank of the pair (ids[i], ids[i+1]); a merge changes
	// only its neighbours' pairs.
	rank := func(i int) int32 {
		if m, ok := t.merges[[2]int32{ids[i], ids[i+1]}]; ok {
			return m.rank
		}
		return none
	}
	for i := range ranks {
		ranks[i] = rank(i)
	}
	for len(ranks) > 0 {
		at := 0
		for i, r := range ranks {
			if r < ranks[at] {
				at = i
			}
		}
		if ranks[at] == none {
			break
		}
		ids[at] = t.merges[[2]int32{ids[at], ids[at+1]}].id
		ids = append(ids[:at+1], ids[at+2:]...)
		ranks = append(ranks[:at], ranks[at+1:]...)
		if at < len(ranks) {
			ranks[at] = rank(at)
		}
		if at > 0 {
			ranks[at-1] = rank(at - 1)
		}
	}
	for _, id := range ids {
		out = append(out, int(id))
	}
	return out
}

type mergeCand struct {
	rank        int32
	pos         int
	left, right int32
}

type mergeHeap []mergeCand

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(a, b int) bool {
	if h[a].rank != h[b].rank {
		return h[a].rank < h[b].rank
	}
	return h[a].pos < h[b].pos
}
func (h mergeHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(mergeCand)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Decode turns ids back into text: added tokens verbatim, the others through
// the byte-level map.
func (t *hfTokenizer) Decode(ids []int) (string, error) {
	var b []byte
	for _, id := range ids {
		if id < 0 || id >= len(t.tokens) || t.tokens[id] == "" {
			return "", fmt.Errorf("%s: invalid token id %d", t.name, id)
		}
		if t.isAdded[id] {
			b = append(b, t.tokens[id]...)
			continue
		}
		for _, r := range t.tokens[id] {
			c, ok := t.runeByte[r]
			if !ok {
				return "", fmt.Errorf("%s: token %d (%q) is not byte-level", t.name, id, t.tokens[id])
			}
			b = append(b, c)
		}
	}
	return string(b), nil
}
