// Package kvevents explains a prefix-cache shortfall from an engine's KV
// cache events (vLLM's --kv-events-config): it subscribes to each event
// stream over ZMQ, decodes the msgpack batches, keeps the blocks each
// stream stored and removed, and classifies the blocks of a request that
// the engine served from its cache less than the theoretical model said:
// evicted, never stored there, cleared, or unexplained.
//
// Blocks are known by their token ids, chained to their parent's, and by
// their extra keys where the events carry them (a salted prompt's cache
// salt, on its first block), never by the engine's hashes, whose seed is
// the engine's own: a hash only links a block to its parent.
// docs/engines.md says which vLLM versions send what.
package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is the type of one event.
type Kind uint8

// The event types vLLM publishes.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// BlockHash is an engine's name of a block, opaque: an integer hash (the
// default, the low 64 bits of vLLM's digest) as "i" and its 8 bytes, a
// byte-string hash as "b" and its bytes.
type BlockHash string

// ExtraKeys is what else than its tokens one block's hash covers, one entry
// of vLLM's extra_keys (a cache salt, an adapter's name, multimodal ids),
// in a canonical form of its values that does not depend on how they were
// encoded; "" for none.
type ExtraKeys string

// Event is one decoded KV cache event.
type Event struct {
	Kind   Kind
	Hashes []BlockHash
	// Parent is the block before the first of Hashes; "" when they start
	// a prompt (BlockStored only).
	Parent BlockHash
	// Tokens are the stored blocks' token ids, BlockSize of them a block
	// (BlockStored only).
	Tokens    []uint32
	BlockSize int
	// Medium is where the blocks are: "" (older vLLM, which had only the
	// GPU), "GPU", or an offload tier such as "CPU".
	Medium string
	// LoRA names the adapter whose blocks these are: lora_name, else
	// lora_id in decimal; "" for the base model.
	LoRA string
	// Group is the KV cache group (group_idx), 0 when not sent.
	Group int
	// SpecKind is the group's attention kind (kv_cache_spec_kind:
	// full_attention, sliding_window, mamba, ...), "" when not sent; and
	// SlidingWindow its window in tokens (kv_cache_spec_sliding_window),
	// 0 for none (BlockStored only).
	SpecKind      string
	SlidingWindow int
	// Extra is each stored block's extra keys, in the order of Hashes;
	// nil when the event has none (vLLM before extra_keys).
	Extra []ExtraKeys
}

// Batch is one EventBatch: the events of one engine step, in order.
type Batch struct {
	TS     float64 // the engine's clock, seconds since the epoch
	Events []Event
	Rank   int // data_parallel_rank; -1 when not sent
}

// Bounds on one payload's contents. A payload's length bounds every list
// too (each element takes at least one byte), so a list header claiming
// more than what is left is refused before anything is allocated. What
// one batch's decoding allocates, kept or not, is bounded by
// MaxBatchBytes: a hash costs 32 bytes and takes 1 byte on the wire, so
// the payload's length alone would let a 32 MiB message take 1 GiB.
const (
	maxEvents    = 1 << 16 // events in one batch
	maxHashes    = 1 << 16 // blocks in one event
	maxTokens    = 1 << 22 // token ids in one event
	maxHashBytes = 64      // a byte-string hash (vLLM's sha256: 32)
	maxStrBytes  = 1 << 10 // a tag, field name, medium or LoRA name
	maxDepth     = 16      // nesting of a value skipped as unknown, or of extra keys
	maxExtra     = 1 << 12 // the canonical form of one block's extra keys, in bytes
	maxTokenID   = math.MaxUint32
)

// MaxBatchBytes bounds what decoding one batch allocates: its events, the
// hashes and token ids they carry, their strings. A step of vLLM storing
// a 128k-token prefill in blocks of 16 takes 0.8 MiB.
const MaxBatchBytes = 16 << 20

// What the decoder charges each value it allocates against MaxBatchBytes:
// what the Go runtime gives for it (a string header, and its bytes in the
// smallest size class that holds them).
const (
	eventCost   = int(unsafe.Sizeof(Event{}))
	headerCost  = int(unsafe.Sizeof(""))
	intHashCost = headerCost + 16 // 'i' and 8 bytes, in a 16-byte block
	tokenCost   = 4
)

// errBudget is a batch whose decoding would allocate more than
// MaxBatchBytes.
var errBudget = errors.New("more than the batch's bound")

var errMalformed = errors.New("malformed")

// decoder reads one payload.
type decoder struct {
	r   *bytes.Reader
	dec *msgpack.Decoder
	// left is what the decoder may still allocate, in bytes.
	left int
}

// charge takes n bytes from what the decoder may allocate, before it does.
func (d *decoder) charge(n int, what string) error {
	if n < 0 || n > d.left {
		return fmt.Errorf("%s: %d bytes, with %d of the batch's %d left: %w", what, n, d.left, MaxBatchBytes, errBudget)
	}
	d.left -= n
	return nil
}

// stringCost is what a string of n bytes costs, its header included: Go
// allocates small objects in size classes, 8 and 16 bytes below 32, then
// steps of 16 below 128, and at most an eighth more above.
func stringCost(n int) int {
	switch {
	case n == 0:
		return headerCost
	case n <= 8:
		return headerCost + 8
	case n <= 128:
		return headerCost + (n+15)&^15
	}
	return headerCost + n + n/8
}

// Decode reads one EventBatch payload: [ts, events, data_parallel_rank]
// (the rank optional, later fields skipped), each event a tagged array
// (vLLM before its map encoding) or a map with a "type" tag (since).
// Unknown fields and event types are skipped; what is not an event batch
// is an error naming the event and field, never a panic.
func Decode(payload []byte) (Batch, error) {
	r := bytes.NewReader(payload)
	d := &decoder{r: r, dec: msgpack.NewDecoder(r), left: MaxBatchBytes}
	b, err := d.batch()
	if err != nil {
		return Batch{}, err
	}
	if r.Len() != 0 {
		return Batch{}, fmt.Errorf("%d bytes after the batch", r.Len())
	}
	return b, nil
}

func (d *decoder) batch() (Batch, error) {
	b := Batch{Rank: -1}
	n, err := d.arrayLen("batch")
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, fmt.Errorf("batch: %d fields, want ts and events", n)
	}
	if b.TS, err = d.dec.DecodeFloat64(); err != nil {
		return b, fmt.Errorf("batch: ts: %w", err)
	}
	if b.Events, err = d.events(); err != nil {
		return b, err
	}
	if n >= 3 {
		if b.Rank, err = d.optInt("batch: data_parallel_rank", -1); err != nil {
			return b, err
		}
	}
	for i := 3; i < n; i++ {
		if err := d.skip(0); err != nil {
			return b, fmt.Errorf("batch: field %d: %w", i, err)
		}
	}
	return b, nil
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.arrayLen("batch: events")
	if err != nil {
		return nil, err
	}
	if n > maxEvents {
		return nil, fmt.Errorf("batch: %d events, more than %d", n, maxEvents)
	}
	if err := d.charge(n*eventCost, "batch: events"); err != nil {
		return nil, err
	}
	out := make([]Event, 0, n)
	for i := range n {
		ev, ok, err := d.event()
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if ok {
			out = append(out, ev)
		}
	}
	return out, nil
}

// event reads one event; ok is false for an event type it does not know.
func (d *decoder) event() (ev Event, ok bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return ev, false, err
	}
	var f fields
	switch {
	case isMap(c):
		f, err = d.mapFields()
	case isArray(c):
		f, err = d.arrayFields()
	default:
		return ev, false, fmt.Errorf("neither a tagged array nor a tagged map (code %#x): %w", c, errMalformed)
	}
	if err != nil {
		return ev, false, err
	}
	return f.event()
}

// fields are an event's values by name, as read.
type fields struct {
	tag       string
	hashes    []BlockHash
	hasHashes bool
	parent    BlockHash
	tokens    []uint32
	hasTokens bool
	blockSize int
	medium    string
	loraName  string
	loraID    int
	group     int
	specKind  string
	window    int
	extra     []ExtraKeys
}

func (f *fields) event() (Event, bool, error) {
	ev := Event{Hashes: f.hashes, Parent: f.parent, Tokens: f.tokens, BlockSize: f.blockSize,
		Medium: f.medium, LoRA: f.loraName, Group: f.group, SpecKind: f.specKind, SlidingWindow: max(f.window, 0),
		Extra: f.extra}
	if ev.LoRA == "" && f.loraID >= 0 {
		ev.LoRA = strconv.Itoa(f.loraID)
	}
	switch f.tag {
	case "BlockStored":
		ev.Kind = BlockStored
		switch {
		case !f.hasHashes:
			return ev, false, errors.New("BlockStored: no block_hashes")
		case !f.hasTokens:
			return ev, false, errors.New("BlockStored: no token_ids")
		case f.blockSize <= 0:
			return ev, false, fmt.Errorf("BlockStored: block_size %d", f.blockSize)
		}
	case "BlockRemoved":
		ev.Kind = BlockRemoved
		if !f.hasHashes {
			return ev, false, errors.New("BlockRemoved: no block_hashes")
		}
	case "AllBlocksCleared":
		ev.Kind = AllBlocksCleared
	default:
		return ev, false, nil // a later addition: skipped
	}
	return ev, true, nil
}

// positional names the fields of a tagged array, after its tag, in the
// order vLLM declares them (later versions append).
var positional = map[string][]string{
	"BlockStored": {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
		"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"},
	"BlockRemoved": {"block_hashes", "medium", "group_idx"},
}

func (d *decoder) arrayFields() (fields, error) {
	f := fields{loraID: -1}
	n, err := d.arrayLen("event")
	if err != nil {
		return f, err
	}
	if n == 0 {
		return f, fmt.Errorf("an empty array, without its tag: %w", errMalformed)
	}
	if f.tag, err = d.str("tag"); err != nil {
		return f, err
	}
	names := positional[f.tag]
	for i := 1; i < n; i++ {
		name := ""
		if i-1 < len(names) {
			name = names[i-1]
		}
		if err := d.field(&f, name); err != nil {
			return f, err
		}
	}
	return f, nil
}

func (d *decoder) mapFields() (fields, error) {
	f := fields{loraID: -1}
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return f, err
	}
	if n < 0 || 2*n > d.r.Len() {
		return f, fmt.Errorf("a map of %d entries in %d bytes: %w", n, d.r.Len(), errMalformed)
	}
	for range n {
		name, err := d.str("field name")
		if err != nil {
			return f, err
		}
		if name == "type" {
			if f.tag, err = d.str("type"); err != nil {
				return f, err
			}
			continue
		}
		if err := d.field(&f, name); err != nil {
			return f, err
		}
	}
	if f.tag == "" {
		return f, fmt.Errorf("a map without its type: %w", errMalformed)
	}
	return f, nil
}

// field reads the value of the named field into f; a field it does not use
// is skipped.
func (d *decoder) field(f *fields, name string) error {
	var err error
	switch name {
	case "block_hashes":
		f.hashes, err = d.hashes()
		f.hasHashes = err == nil
	case "parent_block_hash":
		f.parent, err = d.optHash()
	case "token_ids":
		f.tokens, err = d.tokens()
		f.hasTokens = err == nil
	case "block_size":
		f.blockSize, err = d.optInt("block_size", 0)
	case "lora_id":
		f.loraID, err = d.optInt("lora_id", -1)
	case "lora_name":
		f.loraName, err = d.optStr("lora_name")
	case "medium":
		f.medium, err = d.optStr("medium")
	case "group_idx":
		f.group, err = d.optInt("group_idx", 0)
	case "kv_cache_spec_kind":
		f.specKind, err = d.optStr("kv_cache_spec_kind")
	case "kv_cache_spec_sliding_window":
		f.window, err = d.optInt("kv_cache_spec_sliding_window", 0)
	case "extra_keys":
		f.extra, err = d.extraKeys()
	default:
		err = d.skip(0)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", f.tag, name, err)
	}
	return nil
}

// arrayLen reads an array header whose length the rest of the payload can
// hold.
func (d *decoder) arrayLen(what string) (int, error) {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if n < 0 || n > d.r.Len() {
		return 0, fmt.Errorf("%s: a list of %d in %d bytes: %w", what, n, d.r.Len(), errMalformed)
	}
	return n, nil
}

func (d *decoder) hashes() ([]BlockHash, error) {
	n, err := d.arrayLen("list")
	if err != nil {
		return nil, err
	}
	if n > maxHashes {
		return nil, fmt.Errorf("%d hashes, more than %d", n, maxHashes)
	}
	if err := d.charge(n*headerCost, "hashes"); err != nil {
		return nil, err
	}
	out := make([]BlockHash, n)
	for i := range out {
		if out[i], err = d.hash(); err != nil {
			return nil, fmt.Errorf("hash %d: %w", i, err)
		}
	}
	return out, nil
}

// optHash reads a hash or nil ("").
func (d *decoder) optHash() (BlockHash, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", err
	}
	if c == msgpcode.Nil {
		return "", d.dec.DecodeNil()
	}
	return d.hash()
}

// hash reads an integer hash (signed or not: the same 64 bits name the same
// block) or a byte-string one.
func (d *decoder) hash() (BlockHash, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", err
	}
	var v uint64
	switch {
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := d.bytes(maxHashBytes)
		if err != nil {
			return "", err
		}
		if len(b) == 0 {
			return "", fmt.Errorf("an empty hash: %w", errMalformed)
		}
		if err := d.charge(stringCost(1+len(b))-headerCost, "hash"); err != nil {
			return "", err
		}
		return BlockHash("b" + string(b)), nil
	case isSigned(c):
		i, err := d.dec.DecodeInt64()
		if err != nil {
			return "", err
		}
		v = uint64(i)
	case isUnsigned(c):
		if v, err = d.dec.DecodeUint64(); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("neither an integer nor bytes (code %#x): %w", c, errMalformed)
	}
	if err := d.charge(intHashCost-headerCost, "hash"); err != nil {
		return "", err
	}
	var b [9]byte
	b[0] = 'i'
	binary.BigEndian.PutUint64(b[1:], v)
	return BlockHash(b[:]), nil
}

func (d *decoder) tokens() ([]uint32, error) {
	n, err := d.arrayLen("list")
	if err != nil {
		return nil, err
	}
	if n > maxTokens {
		return nil, fmt.Errorf("%d token ids, more than %d", n, maxTokens)
	}
	if err := d.charge(n*tokenCost, "token ids"); err != nil {
		return nil, err
	}
	out := make([]uint32, n)
	for i := range out {
		c, err := d.dec.PeekCode()
		if err != nil {
			return nil, err
		}
		if !isUnsigned(c) && !isSigned(c) {
			return nil, fmt.Errorf("token %d: not an integer (code %#x): %w", i, c, errMalformed)
		}
		v, err := d.dec.DecodeInt64()
		if err != nil {
			return nil, fmt.Errorf("token %d: %w", i, err)
		}
		if v < 0 || v > maxTokenID {
			return nil, fmt.Errorf("token %d: id %d out of range: %w", i, v, errMalformed)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// extraKeys reads extra_keys: nil, or one entry a block, each nil or a
// tuple of values, kept in their canonical form.
func (d *decoder) extraKeys() ([]ExtraKeys, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, err
	}
	if c == msgpcode.Nil {
		return nil, d.dec.DecodeNil()
	}
	n, err := d.arrayLen("list")
	if err != nil {
		return nil, err
	}
	if n > maxHashes {
		return nil, fmt.Errorf("%d blocks' extra keys, more than %d", n, maxHashes)
	}
	if err := d.charge(n*headerCost, "extra keys"); err != nil {
		return nil, err
	}
	out := make([]ExtraKeys, n)
	var buf []byte
	for i := range out {
		if c, err = d.dec.PeekCode(); err != nil {
			return nil, err
		}
		if c == msgpcode.Nil {
			if err := d.dec.DecodeNil(); err != nil {
				return nil, err
			}
			continue
		}
		if buf, err = d.canonical(buf[:0], 0); err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
		if len(buf) > maxExtra {
			return nil, fmt.Errorf("block %d: extra keys of more than %d bytes: %w", i, maxExtra, errMalformed)
		}
		if err := d.charge(stringCost(len(buf))-headerCost, "extra keys"); err != nil {
			return nil, err
		}
		out[i] = ExtraKeys(buf)
	}
	return out, nil
}

// canonical appends one value to b in a form that depends on the value
// alone, not on its encoding (an integer's width, a string's header): a
// type letter, then integers as 8 bytes, and strings, byte strings, lists
// and maps after their lengths. At most maxExtra bytes, nested at most
// maxDepth deep.
func (d *decoder) canonical(b []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("extra keys nested more than %d deep: %w", maxDepth, errMalformed)
	}
	if len(b) > maxExtra {
		return nil, fmt.Errorf("extra keys of more than %d bytes: %w", maxExtra, errMalformed)
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return append(b, 'n'), d.dec.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		v, err := d.dec.DecodeBool()
		if v {
			return append(b, 't'), err
		}
		return append(b, 'f'), err
	case isUnsigned(c) || isSigned(c):
		return d.canonicalInt(b, c)
	case c == msgpcode.Float || c == msgpcode.Double:
		v, err := d.dec.DecodeFloat64()
		return binary.BigEndian.AppendUint64(append(b, 'd'), math.Float64bits(v)), err
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		v, err := d.bytes(min(maxExtra, d.r.Len()))
		if err != nil {
			return nil, err
		}
		tag := byte('s')
		if msgpcode.IsBin(c) {
			tag = 'b'
		}
		return appendCanonBytes(b, tag, v), nil
	case isArray(c):
		n, err := d.arrayLen("list")
		if err != nil {
			return nil, err
		}
		return d.canonicalSeq(appendCanonLen(b, 'a', n), n, depth)
	case isMap(c):
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		if n < 0 || 2*n > d.r.Len() {
			return nil, fmt.Errorf("a map of %d entries in %d bytes: %w", n, d.r.Len(), errMalformed)
		}
		return d.canonicalSeq(appendCanonLen(b, 'm', n), 2*n, depth)
	case msgpcode.IsExt(c):
		id, n, err := d.dec.DecodeExtHeader()
		if err != nil {
			return nil, err
		}
		if n < 0 || n > maxExtra || n > d.r.Len() {
			return nil, fmt.Errorf("an extension of %d bytes: %w", n, errMalformed)
		}
		if err := d.charge(n, "extra keys"); err != nil {
			return nil, err
		}
		v := make([]byte, n)
		if err := d.dec.ReadFull(v); err != nil {
			return nil, err
		}
		return append(binary.AppendUvarint(append(b, 'x', byte(id)), uint64(n)), v...), nil
	}
	return nil, fmt.Errorf("extra keys: code %#x: %w", c, errMalformed)
}

// canonicalInt appends an integer: 'u' and its 64 bits when it is not
// negative, however it was encoded, else 'i' and its two's complement.
func (d *decoder) canonicalInt(b []byte, c byte) ([]byte, error) {
	if isUnsigned(c) {
		v, err := d.dec.DecodeUint64()
		return binary.BigEndian.AppendUint64(append(b, 'u'), v), err
	}
	v, err := d.dec.DecodeInt64()
	tag := byte('i')
	if v >= 0 {
		tag = 'u'
	}
	return binary.BigEndian.AppendUint64(append(b, tag), uint64(v)), err
}

// canonicalSeq appends the n values of a list or map.
func (d *decoder) canonicalSeq(b []byte, n, depth int) ([]byte, error) {
	var err error
	for range n {
		if b, err = d.canonical(b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func appendCanonLen(b []byte, tag byte, n int) []byte {
	return binary.AppendUvarint(append(b, tag), uint64(n))
}

func appendCanonBytes(b []byte, tag byte, v []byte) []byte {
	return append(appendCanonLen(b, tag, len(v)), v...)
}

// saltExtraKeys are the extra keys of a prompt's first block under cache
// salt salt, as vLLM sends them for a text prompt without an adapter: a
// tuple of the salt alone ("" for no salt: no extra keys).
func saltExtraKeys(salt string) ExtraKeys {
	if salt == "" {
		return ""
	}
	return ExtraKeys(appendCanonBytes(appendCanonLen(nil, 'a', 1), 's', []byte(salt)))
}

// optInt reads an integer, or nil as def.
func (d *decoder) optInt(what string, def int) (int, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if c == msgpcode.Nil {
		return def, d.dec.DecodeNil()
	}
	if !isUnsigned(c) && !isSigned(c) {
		return 0, fmt.Errorf("%s: not an integer (code %#x): %w", what, c, errMalformed)
	}
	v, err := d.dec.DecodeInt64()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, fmt.Errorf("%s: %d out of range: %w", what, v, errMalformed)
	}
	return int(v), nil
}

// str reads a string of at most maxStrBytes.
func (d *decoder) str(what string) (string, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("%s: not a string (code %#x): %w", what, c, errMalformed)
	}
	b, err := d.bytes(maxStrBytes)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if err := d.charge(stringCost(len(b))-headerCost, what); err != nil {
		return "", err
	}
	return string(b), nil
}

// optStr reads a string, or nil as "".
func (d *decoder) optStr(what string) (string, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", err
	}
	if c == msgpcode.Nil {
		return "", d.dec.DecodeNil()
	}
	return d.str(what)
}

// bytes reads a string or byte string of at most limit bytes.
func (d *decoder) bytes(limit int) ([]byte, error) {
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > limit || n > d.r.Len() {
		return nil, fmt.Errorf("%d bytes, more than %d or than the %d left: %w", n, limit, d.r.Len(), errMalformed)
	}
	if err := d.charge(stringCost(n), "bytes"); err != nil {
		return nil, err
	}
	b := make([]byte, n)
	if err := d.dec.ReadFull(b); err != nil {
		return nil, err
	}
	return b, nil
}

// skip passes over one value of any type, nested at most maxDepth deep.
func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested more than %d deep: %w", maxDepth, errMalformed)
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.arrayLen("list")
		if err != nil {
			return err
		}
		for range n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return err
		}
		if n < 0 || 2*n > d.r.Len() {
			return fmt.Errorf("a map of %d entries in %d bytes: %w", n, d.r.Len(), errMalformed)
		}
		for range 2 * n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		// Passed over in the payload, not copied.
		n, err := d.dec.DecodeBytesLen()
		if err != nil {
			return err
		}
		if n < 0 || n > d.r.Len() {
			return fmt.Errorf("%d bytes, more than the %d left: %w", n, d.r.Len(), errMalformed)
		}
		_, err = d.r.Seek(int64(n), io.SeekCurrent)
		return err
	}
	// A scalar or an extension, whose length the library checks as it
	// reads: none nests.
	return d.dec.Skip()
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isUnsigned(c byte) bool {
	return c <= msgpcode.PosFixedNumHigh || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64)
}

func isSigned(c byte) bool {
	return c >= msgpcode.NegFixedNumLow || (c >= msgpcode.Int8 && c <= msgpcode.Int64)
}
