package trace

import (
	"reflect"
	"strings"
	"testing"
)

// TestFastRowAgreesWithParseRecord: on every line, the fast path either
// declines or gives the row ParseRecord gives; it never accepts a line
// ParseRecord rejects.
func TestFastRowAgreesWithParseRecord(t *testing.T) {
	lines := []string{
		`{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]}`,
		`{"timestamp":3,"input_length":1000,"output_length":5,"hash_ids":[7,8]}`,
		`{"timestamp": 3, "input_length": 10}`,
		`{"timestamp": 3, "input_length": 10, "output_length": 2}`,
		`{"timestamp": 3, "input_length": 10, "hash_ids": [1]}`,
		`{"timestamp": 3, "input_length": 0, "hash_ids": []}`,
		`{"timestamp": 3, "input_length": 0, "hash_ids": [1]}`,                              // does not fit
		`{"timestamp": 3, "input_length": 1000, "hash_ids": [1]}`,                           // needs 2 ids
		`{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [0, 1, 2]}`, // an id to spare
		`{"timestamp": 3, "input_length": 10, "hash_ids": [01]}`,
		`{"timestamp": 3.5, "input_length": 10}`,
		`{"timestamp": 1e3, "input_length": 10}`,
		`{"timestamp": -1, "input_length": 10}`,
		`{"timestamp": 3, "input_length": 10.0}`,
		`{"timestamp": 3, "input_length": 99999999999999999999}`,
		`{"timestamp": 3, "input_length": 3000000000}`,
		`{"timestamp": 3, "input_length": 10, "hash_ids": [1, 2,]}`,
		`{"timestamp": 3, "input_length": 10, "hash_ids": [1 2]}`,
		`{"timestamp": 3, "input_length": 10,}`,
		`{"timestamp": 3, "input_length": 10} x`,
		`{"timestamp": 3, "input_length": 10, "session_id": "a"}`,
		`{"timestamp": 3, "output_length": 10, "input_length": 10}`,
		`{"timestamp": 3, "input_length": 10, "output_length": 2, "output_length": 3}`,
		`{"timestamp": 3, "input_length": 10, "hash_ids": [9223372036854775807]}`,
		`{"input_length": 10, "timestamp": 3}`,
		`{"timestamp": 3,	"input_length": 10}`,
		`{"timestamp": 3, "input_length": 10, "hash_ids": null}`,
	}
	lines = append(lines, strings.Split(strings.TrimSpace(readShared(t, "conversation_trace.jsonl")), "\n")[:500]...)
	for _, bs := range []int{0, 512} {
		for i, l := range lines {
			fast := NewTableBuilder(1)
			ok := fastRow([]byte(l), bs, fast, i+1)
			rec, err := ParseRecord([]byte(l), ReadOptions{BlockSize: bs})
			if !ok {
				continue
			}
			if err != nil {
				t.Errorf("block size %d: fast path took %s, which ParseRecord rejects: %v", bs, l, err)
				continue
			}
			rec.Line = i + 1
			slow := NewTableBuilder(1)
			if err := slow.Append(&rec); err != nil {
				t.Errorf("block size %d: fast path took %s, which a table cannot hold: %v", bs, l, err)
				continue
			}
			if got, want := fast.Table().Records(), slow.Table().Records(); !reflect.DeepEqual(got, want) {
				t.Errorf("block size %d: %s: fast %s, want %s", bs, l, got[0].AppendJSON(nil), want[0].AppendJSON(nil))
			}
		}
	}
	// The common shapes do take the fast path.
	for _, l := range lines[:6] {
		if !fastRow([]byte(l), 512, NewTableBuilder(1), 1) {
			t.Errorf("fast path declined %s", l)
		}
	}
}

// TestReadTableBlocks: blocks of any size, down to lines longer than a
// block, give the rows and line numbers of the sequential reader, and its
// first error.
func TestReadTableBlocks(t *testing.T) {
	text := tableRows + readShared(t, "synthetic_trace.jsonl")
	want, err := ReadAll(strings.NewReader(text), "x", ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range []int{1, 64, 1000, 1 << 16} {
		got, err := readTable(strings.NewReader(text), "x", ReadOptions{}, int64(len(text)), block)
		if err != nil {
			t.Fatalf("block %d: %v", block, err)
		}
		if !reflect.DeepEqual(got.Records(), want) {
			t.Errorf("block %d: rows differ from ReadAll's", block)
		}
	}
	bad := text + `{"timestamp": 1, "input_length": "x"}` + "\n" + text + "{\n"
	_, werr := ReadAll(strings.NewReader(bad), "x", ReadOptions{})
	for _, block := range []int{1, 64, 1 << 16} {
		_, err := readTable(strings.NewReader(bad), "x", ReadOptions{}, 0, block)
		if err == nil || werr == nil || err.Error() != werr.Error() {
			t.Errorf("block %d: error %v, want %v", block, err, werr)
		}
	}
	if _, err := readTable(strings.NewReader("\n\n"), "x", ReadOptions{}, 2, 1); err == nil || !strings.Contains(err.Error(), "no rows") {
		t.Errorf("blank file: %v", err)
	}
}
