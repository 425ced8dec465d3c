package kvevents

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

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

// saltedStored is stored with extra_keys as vLLM sends them for a text
// prompt under salt ("" for none): the salt on the first block when parent
// is "", nothing on the others.
func saltedStored(salt string, parent BlockHash, tokens []uint32, hashes ...uint64) Event {
	ev := stored(parent, tokens, hashes...)
	ev.Extra = make([]ExtraKeys, len(hashes))
	if parent == "" {
		ev.Extra[0] = saltExtraKeys(salt)
	}
	return ev
}

// TestClassifySalt: on a stream whose events carry extra_keys, a block is
// known by its salt as well as its tokens: another salt's block (or an
// unsalted one) with the same tokens is another block, and a request is
// looked up under its own salt. On a stream without them (vLLM before
// extra_keys) a salted request matches the same tokens under any salt, as
// before.
func TestClassifySalt(t *testing.T) {
	const a, b = "salt-a", "salt-b"
	cases := []struct {
		name  string
		steps []step
		salt  string
		want  Tally
	}{
		{"held under the request's salt: unexplained", []step{{1, []Event{saltedStored(a, "", toks(1, 12), 11, 12, 13)}, -1}},
			a, Tally{ClassUnexplained: 12}},
		{"held under another salt only: never stored", []step{{1, []Event{saltedStored(b, "", toks(1, 12), 21, 22, 23)}, -1}},
			a, Tally{ClassNeverStored: 12}},
		{"held unsalted only: never stored", []step{{1, []Event{saltedStored("", "", toks(1, 12), 31, 32, 33)}, -1}},
			a, Tally{ClassNeverStored: 12}},
		{"held salted only, an unsalted request: never stored", []step{{1, []Event{saltedStored(a, "", toks(1, 12), 11, 12, 13)}, -1}},
			"", Tally{ClassNeverStored: 12}},
		{"evicted, then the same tokens stored under another salt: evicted", []step{
			{1, []Event{saltedStored(a, "", toks(1, 12), 11, 12, 13)}, -1},
			{2, []Event{removed(13), removed(12), removed(11)}, -1},
			{3, []Event{saltedStored(b, "", toks(1, 12), 21, 22, 23)}, -1}},
			a, Tally{ClassEvicted: 12}},
		{"an extension keeps its parent's salt", []step{
			{1, []Event{saltedStored(a, "", toks(1, 8), 11, 12)}, -1},
			{2, []Event{saltedStored(a, ih(12), toks(9, 4), 13)}, -1},
			{3, []Event{saltedStored(b, "", toks(1, 8), 21, 22)}, -1},
			{4, []Event{removed(22)}, -1}},
			a, Tally{ClassUnexplained: 12}},
		{"an extension of another salt's blocks is not the request's", []step{
			{1, []Event{saltedStored(b, "", toks(1, 8), 21, 22)}, -1},
			{2, []Event{saltedStored(b, ih(22), toks(9, 4), 23)}, -1}},
			a, Tally{ClassNeverStored: 12}},
		{"events without extra_keys: the same tokens match", []step{
			{1, []Event{stored("", toks(1, 12), 11, 12, 13)}, -1}},
			a, Tally{ClassUnexplained: 12}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, applied := replay(t, c.steps...)
			if applied != (Applied{}) {
				t.Fatalf("applying the events: %+v", applied)
			}
			got, err := Classify([]*Stream{s}, Miss{Tokens: prompt, From: 0, To: 12, BlockSize: 4, Sent: at(5), Until: at(6), Salt: c.salt})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("Classify: %v, want %v", got, c.want)
			}
		})
	}
}

// TestStoreExtraKeysNotOneABlock: a BlockStored whose extra keys are not
// one a block is not taken.
func TestStoreExtraKeysNotOneABlock(t *testing.T) {
	ev := saltedStored("salt-a", "", toks(1, 8), 11, 12)
	ev.Extra = ev.Extra[:1]
	s, applied := replay(t, step{1, []Event{ev}, -1})
	if applied.Inconsistent != 1 || len(s.blocks) != 0 {
		t.Errorf("%+v, %d blocks kept; want one inconsistent event and none kept", applied, len(s.blocks))
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
