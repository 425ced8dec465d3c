package kvevents

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// goldenBatch is a .json file of testdata: what gen.py encoded.
type goldenBatch struct {
	TS     float64 `json:"ts"`
	Rank   int     `json:"rank"`
	Events []struct {
		Kind      string          `json:"kind"`
		Hashes    []string        `json:"hashes"`
		Parent    string          `json:"parent"`
		Tokens    []uint32        `json:"tokens"`
		BlockSize int             `json:"block_size"`
		Medium    string          `json:"medium"`
		LoRA      string          `json:"lora"`
		Group     int             `json:"group"`
		ExtraKeys json.RawMessage `json:"extra_keys"`
	} `json:"events"`
}

// renderHash writes a hash as gen.py does: i:HEX for an integer, b:HEX for
// bytes.
func renderHash(h BlockHash) string {
	if h == "" {
		return ""
	}
	return string(h[0]) + ":" + hex.EncodeToString([]byte(h[1:]))
}

// TestDecodeGolden: every payload of testdata, encoded by msgpack-python in
// vLLM's layouts of each release (gen.py), decodes to what was encoded.
func TestDecodeGolden(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("testdata", "*.msgpack"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden payloads: %v", err)
	}
	for _, p := range paths {
		name := strings.TrimSuffix(filepath.Base(p), ".msgpack")
		t.Run(name, func(t *testing.T) {
			payload, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			js, err := os.ReadFile(strings.TrimSuffix(p, ".msgpack") + ".json")
			if err != nil {
				t.Fatal(err)
			}
			var want goldenBatch
			if err := json.Unmarshal(js, &want); err != nil {
				t.Fatal(err)
			}
			got, err := Decode(payload)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got.TS != want.TS || got.Rank != want.Rank || len(got.Events) != len(want.Events) {
				t.Fatalf("ts %v rank %d, %d events; want ts %v rank %d, %d events", got.TS, got.Rank, len(got.Events),
					want.TS, want.Rank, len(want.Events))
			}
			for i, ev := range got.Events {
				w := want.Events[i]
				var hashes []string
				for _, h := range ev.Hashes {
					hashes = append(hashes, renderHash(h))
				}
				if ev.Kind.String() != w.Kind || !reflect.DeepEqual(hashes, orNil(w.Hashes)) || renderHash(ev.Parent) != w.Parent ||
					!reflect.DeepEqual(ev.Tokens, orNil(w.Tokens)) || ev.BlockSize != w.BlockSize || ev.Medium != w.Medium ||
					ev.LoRA != w.LoRA || ev.Group != w.Group {
					t.Errorf("event %d: %s %v parent %q tokens %v block %d medium %q lora %q group %d;\nwant %+v",
						i, ev.Kind, hashes, renderHash(ev.Parent), ev.Tokens, ev.BlockSize, ev.Medium, ev.LoRA, ev.Group, w)
				}
				if want := goldenExtraKeys(t, w.ExtraKeys); !reflect.DeepEqual(ev.Extra, want) {
					t.Errorf("event %d: extra keys %q, want %q (%s)", i, ev.Extra, want, w.ExtraKeys)
				}
			}
		})
	}
}

func orNil[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// TestDecodeRejects: what is not an event batch is an error that says
// where, never a panic, and a list or string longer than the payload is
// refused before it is allocated.
func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name    string
		payload string // hex
		want    string
	}{
		{"empty", "", "batch"},
		{"not an array", "a3616263", "batch"},
		{"one field", "91cb3ff0000000000000", "1 fields"},
		{"events not a list", "92cb3ff0000000000000c0", "events"},
		{"event of a number", "92cb3ff00000000000009101", "event 0: neither a tagged array nor a tagged map"},
		{"event without its tag", "92cb3ff00000000000009190", "event 0: an empty array"},
		{"map without its type", "92cb3ff0000000000000918001", "event 0: a map without its type"},
		{"stored without tokens", "92cb3ff00000000000009193ab426c6f636b53746f72656491070a", "token_ids"},
		// ["BlockStored", [7], nil, [-1], 16]
		{"negative token", "92cb3ff00000000000009195ab426c6f636b53746f72656491" + "07c091ff10", "out of range"},
		// ["BlockStored", [7], nil, [2^32], 16]
		{"token beyond 32 bits", "92cb3ff00000000000009195ab426c6f636b53746f72656491" + "07c091cf000000010000000010", "out of range"},
		// ["BlockStored", [1.5], ...]
		{"float hash", "92cb3ff00000000000009195ab426c6f636b53746f72656491" + "cb3ff8000000000000c09101" + "10", "hash 0"},
		{"list longer than the payload", "92cb3ff0000000000000dd7fffffff", "a list of 2147483647"},
		{"string longer than the payload", "92cb3ff00000000000009191db7fffffff", "bytes"},
		{"map longer than the payload", "92cb3ff000000000000091df7fffffff", "a map of"},
		{"bytes after the batch", "92cb3ff00000000000009000", "1 bytes after"},
		{"block size nil", "92cb3ff00000000000009195ab426c6f636b53746f726564910" + "7c09101c0", "block_size 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := hex.DecodeString(c.payload)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(b)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Decode: %+v, %v; want an error with %q", got, err, c.want)
			}
		})
	}
}

// TestDecodeDeepNesting: an unknown field nested deeper than maxDepth is
// refused, not followed down the stack.
func TestDecodeDeepNesting(t *testing.T) {
	// {"type": "AllBlocksCleared", "x": [[[[...]]]]}
	payload, _ := hex.DecodeString("92cb3ff00000000000009182a474797065b0416c6c426c6f636b73436c6561726564a178")
	payload = append(payload, []byte(strings.Repeat("\x91", 100000))...)
	payload = append(payload, 0x01)
	if _, err := Decode(payload); err == nil || !errors.Is(err, errMalformed) || !strings.Contains(err.Error(), "nested") {
		t.Fatalf("Decode: %v, want a nesting error", err)
	}
}

// FuzzDecode: no input panics, and what decodes keeps the bounds.
func FuzzDecode(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join("testdata", "*.msgpack"))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			return
		}
		if len(b.Events) > maxEvents {
			t.Fatalf("%d events", len(b.Events))
		}
		held := 0
		for _, ev := range b.Events {
			held += len(ev.Hashes)*intHashCost + len(ev.Tokens)*tokenCost
			if held > MaxBatchBytes {
				t.Fatalf("a batch holding %d bytes of hashes and token ids", held)
			}
			if len(ev.Hashes) > maxHashes || len(ev.Tokens) > maxTokens || len(ev.Tokens) > len(payload) {
				t.Fatalf("%s: %d hashes, %d tokens from %d bytes", ev.Kind, len(ev.Hashes), len(ev.Tokens), len(payload))
			}
			if ev.Kind == BlockStored && ev.BlockSize <= 0 {
				t.Fatalf("BlockStored with block size %d", ev.BlockSize)
			}
			for _, x := range ev.Extra {
				if len(x) > maxExtra {
					t.Fatalf("%s: extra keys of %d bytes", ev.Kind, len(x))
				}
			}
		}
	})
}

// goldenExtraKeys is what a golden file's extra_keys (gen.py's JSON of the
// values it encoded) must decode to: nil when the event had none, else
// each block's values in the canonical form, written out here from the
// JSON rather than from the decoder's helpers.
func goldenExtraKeys(t *testing.T, raw json.RawMessage) []ExtraKeys {
	t.Helper()
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var blocks []any
	if err := dec.Decode(&blocks); err != nil {
		t.Fatalf("extra_keys %s: %v", raw, err)
	}
	out := make([]ExtraKeys, len(blocks))
	for i, v := range blocks {
		if v != nil {
			out[i] = ExtraKeys(canonJSON(t, nil, v))
		}
	}
	return out
}

func canonJSON(t *testing.T, b []byte, v any) []byte {
	t.Helper()
	withLen := func(b []byte, tag byte, n int) []byte { return binary.AppendUvarint(append(b, tag), uint64(n)) }
	switch v := v.(type) {
	case nil:
		return append(b, 'n')
	case bool:
		if v {
			return append(b, 't')
		}
		return append(b, 'f')
	case string:
		return append(withLen(b, 's', len(v)), v...)
	case json.Number:
		if strings.ContainsAny(string(v), ".eE") {
			f, err := v.Float64()
			if err != nil {
				t.Fatal(err)
			}
			return binary.BigEndian.AppendUint64(append(b, 'd'), math.Float64bits(f))
		}
		if strings.HasPrefix(string(v), "-") {
			i, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return binary.BigEndian.AppendUint64(append(b, 'i'), uint64(i))
		}
		u, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return binary.BigEndian.AppendUint64(append(b, 'u'), u)
	case []any:
		b = withLen(b, 'a', len(v))
		for _, x := range v {
			b = canonJSON(t, b, x)
		}
		return b
	case map[string]any: // {"bytes": HEX}
		raw, err := hex.DecodeString(v["bytes"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return append(withLen(b, 'b', len(raw)), raw...)
	}
	t.Fatalf("extra key %v (%T): not from gen.py", v, v)
	return nil
}

// TestSaltExtraKeysAsVLLMSends: the extra keys a salted request's first
// block is looked up with are those that a payload encoded as vLLM sends
// it (gen.py's map_salt, by msgpack-python) decodes to, so that the
// classifier finds the blocks the engine stored under the salt.
func TestSaltExtraKeysAsVLLMSends(t *testing.T) {
	payload, err := os.ReadFile("testdata/map_salt.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	first := b.Events[0].Extra
	if want := []ExtraKeys{saltExtraKeys("0123456789abcdef"), ""}; !reflect.DeepEqual(first, want) {
		t.Errorf("a salted prompt's blocks: extra keys %q, want %q", first, want)
	}
	if saltExtraKeys("") != "" {
		t.Errorf("no salt: extra keys %q, want none", saltExtraKeys(""))
	}
	if saltExtraKeys("a") == saltExtraKeys("b") {
		t.Error("two salts with the same extra keys")
	}
}

// TestDecodeExtraKeysRejects: extra keys nested too deep, too large, or of
// a type msgpack does not have are an error, never a panic or an
// allocation the payload does not back.
func TestDecodeExtraKeysRejects(t *testing.T) {
	// {"type": "BlockStored", "block_hashes": [7], "token_ids": [1],
	// "block_size": 1, "extra_keys": ...}
	head, _ := hex.DecodeString("85a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573910" +
		"7a9746f6b656e5f69647391" + "01aa626c6f636b5f73697a6501aa65787472615f6b657973")
	batch := func(extra []byte) []byte {
		p := []byte{0x92, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x91}
		return append(append(p, head...), extra...)
	}
	if b, err := Decode(batch([]byte{0x91, 0x91, 0xa1, 'x'})); err != nil || len(b.Events) != 1 || len(b.Events[0].Extra) != 1 {
		t.Fatalf("the well-formed payload: %+v, %v", b, err)
	}
	long := append([]byte{0x91, 0x91, 0xdb, 0, 0, 0x20, 0x01}, bytes.Repeat([]byte{'x'}, maxExtra+1)...)
	many := []byte{0x91, 0xdc, 0x04, 0x00} // a tuple of 1,024 strings of 8 bytes
	for range 1024 {
		many = append(many, 0xa8, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h')
	}
	for _, c := range []struct {
		name  string
		extra []byte
		want  string
	}{
		{"nested too deep", append([]byte{0x91}, append(bytes.Repeat([]byte{0x91}, 100), 0x01)...), "nested"},
		{"a string too long", long, "more than"},
		{"too many bytes in all", many, "more than"},
		{"a reserved code", []byte{0x91, 0x91, 0xc1}, "code 0xc1"},
		{"a list longer than the payload", []byte{0x91, 0xdd, 0x7f, 0xff, 0xff, 0xff}, "a list of"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(batch(c.extra))
			if err == nil || !errors.Is(err, errMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Decode: %v, want a malformed error with %q", err, c.want)
			}
		})
	}
}

// hostilePayload encodes a batch of events events, each made by event.
func hostilePayload(t testing.TB, events int, event func(enc *msgpack.Encoder) error) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	err := errors.Join(enc.EncodeArrayLen(3), enc.EncodeFloat64(1), enc.EncodeArrayLen(events))
	for range events {
		err = errors.Join(err, event(enc))
	}
	if err = errors.Join(err, enc.EncodeInt(0)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// removedOf encodes a BlockRemoved of n hashes of one byte each.
func removedOf(n int) func(*msgpack.Encoder) error {
	return func(enc *msgpack.Encoder) error {
		err := errors.Join(enc.EncodeMapLen(2), enc.EncodeString("type"), enc.EncodeString("BlockRemoved"),
			enc.EncodeString("block_hashes"), enc.EncodeArrayLen(n))
		for i := range n {
			err = errors.Join(err, enc.EncodeUint(uint64(i%100)))
		}
		return err
	}
}

// storedOf encodes a BlockStored of n one-token blocks, token ids of one
// byte, each block's extra keys a tuple of extra one-byte integers.
func storedOf(n, extra int) func(*msgpack.Encoder) error {
	return func(enc *msgpack.Encoder) error {
		err := errors.Join(enc.EncodeMapLen(6), enc.EncodeString("type"), enc.EncodeString("BlockStored"),
			enc.EncodeString("block_size"), enc.EncodeInt(1), enc.EncodeString("parent_block_hash"), enc.EncodeNil(),
			enc.EncodeString("block_hashes"), enc.EncodeArrayLen(n))
		for i := range n {
			err = errors.Join(err, enc.EncodeUint(uint64(i%100)))
		}
		err = errors.Join(err, enc.EncodeString("token_ids"), enc.EncodeArrayLen(n))
		for i := range n {
			err = errors.Join(err, enc.EncodeUint(uint64(i%100)))
		}
		err = errors.Join(err, enc.EncodeString("extra_keys"), enc.EncodeArrayLen(n))
		for range n {
			err = errors.Join(err, enc.EncodeArrayLen(extra))
			for j := range extra {
				err = errors.Join(err, enc.EncodeUint(uint64(j%100)))
			}
		}
		return err
	}
}

// loraEvent encodes an AllBlocksCleared with a skipped field of n bytes
// and a lora_name of 1 KiB.
func loraEvent(n int) func(*msgpack.Encoder) error {
	return func(enc *msgpack.Encoder) error {
		return errors.Join(enc.EncodeMapLen(3), enc.EncodeString("type"), enc.EncodeString("AllBlocksCleared"),
			enc.EncodeString("unknown"), enc.EncodeString(strings.Repeat("x", n)),
			enc.EncodeString("lora_name"), enc.EncodeString(strings.Repeat("y", maxStrBytes)))
	}
}

// TestDecodeBatchBound: what decoding one batch allocates stays within
// MaxBatchBytes whatever the payload, a batch that would need more being
// refused before it is allocated: one-byte hashes (32 bytes each once
// decoded), token ids, extra keys, many events, long skipped strings.
// A payload of the same shape within the bound decodes.
func TestDecodeBatchBound(t *testing.T) {
	cases := []struct {
		name    string
		payload []byte
		refused bool
	}{
		{"hashes of one byte, 2.6 MB of them", hostilePayload(t, 40, removedOf(maxHashes)), true},
		{"hashes of one byte, within the bound", hostilePayload(t, 6, removedOf(maxHashes)), false},
		{"blocks with extra keys", hostilePayload(t, 8, storedOf(maxHashes/2, 8)), true},
		{"events with long names and skipped strings", hostilePayload(t, 15_000, loraEvent(1000)), true},
		{"a skipped string of 30 MiB", hostilePayload(t, 1, loraEvent(30<<20)), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b, err := Decode(c.payload)
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d bytes of payload: %d events, %d bytes allocated, %v", len(c.payload), len(b.Events), allocated, err)
			if refused := errors.Is(err, errBudget); refused != c.refused {
				t.Errorf("refused for its size: %v (%v), want %v", refused, err, c.refused)
			}
			// The decoder's own reader and a few small values besides.
			if allocated > MaxBatchBytes+64<<10 {
				t.Errorf("%d bytes allocated, more than the %d of the bound", allocated, MaxBatchBytes)
			}
		})
	}
}

// TestDecodeCacheSpec: the KV cache group of a BlockStored, its attention
// kind and sliding window (vllm#40984, appended after group_idx), read in
// both encodings; BlockRemoved carries the group only.
func TestDecodeCacheSpec(t *testing.T) {
	stored := []any{"BlockStored", []uint64{7}, nil, []uint32{1, 2, 3, 4}, 4, nil, "GPU", nil, nil, 1, "sliding_window", 1024}
	removed := []any{"BlockRemoved", []uint64{7}, "GPU", 1}
	storedMap := map[string]any{"type": "BlockStored", "block_hashes": []uint64{7}, "parent_block_hash": nil,
		"token_ids": []uint32{1, 2, 3, 4}, "block_size": 4, "medium": "GPU", "group_idx": 1,
		"kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 1024}
	removedMap := map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{7}, "medium": "GPU", "group_idx": 1}
	for name, events := range map[string][]any{"array": {stored, removed}, "map": {storedMap, removedMap}} {
		payload, err := msgpack.Marshal([]any{1.5, events, 0})
		if err != nil {
			t.Fatal(err)
		}
		b, err := Decode(payload)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s, r := b.Events[0], b.Events[1]
		if s.Group != 1 || s.SpecKind != "sliding_window" || s.SlidingWindow != 1024 || r.Group != 1 || r.SpecKind != "" {
			t.Errorf("%s: stored group %d kind %q window %d, removed group %d; want 1, sliding_window, 1024, 1",
				name, s.Group, s.SpecKind, s.SlidingWindow, r.Group)
		}
	}
}
