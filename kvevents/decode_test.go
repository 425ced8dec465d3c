package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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
		for _, ev := range b.Events {
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
