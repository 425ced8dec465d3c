package trace

import (
	"bytes"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

// tableRows is a trace with every kind of field, absent and present.
const tableRows = `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]}
{"timestamp": 1.5, "input_length": 10, "output_length": 900, "hash_ids": [9], "session_id": "a"}

{"input_length": 600, "hash_ids": [9, 3], "session_id": "a", "delay": 20}
{"timestamp": 3, "input_length": 4, "hash_ids": []}
{"timestamp": 4, "text_input": "hi", "extra": {"x": 1}, "custom": [1]}
{"timestamp": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}], "session_id": "b"}
{"timestamp": 6, "payload": {"model": "m"}, "type": "mooncake_trace"}
{"timestamp": 7, "input_length": 2000, "output_length": 1, "hash_ids": [4611686018427387904, 0, 5, 4611686018427387904]}
{"input_length": 1, "session_id": "b"}
`

func TestTableRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(t *testing.T) string
	}{
		{"every field", func(t *testing.T) string { return tableRows }},
		{"conversation trace", func(t *testing.T) string { return readShared(t, "conversation_trace.jsonl") }},
		{"synthetic trace", func(t *testing.T) string { return readShared(t, "synthetic_trace.jsonl") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := tc.open(t)
			want, err := ReadAll(strings.NewReader(text), "x", ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tab, err := ReadTable(strings.NewReader(text), "x", ReadOptions{}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := tab.Records(); !reflect.DeepEqual(got, want) {
				for i := range want {
					if !reflect.DeepEqual(got[i], want[i]) {
						t.Fatalf("row %d: got %s, want %s", i, got[i].AppendJSON(nil), want[i].AppendJSON(nil))
					}
				}
				t.Fatalf("got %d rows, want %d", len(got), len(want))
			}
			lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
			size := 0
			for i := range want {
				size += HashIDsSize(want[i].HashIDs, want[i].HashIDs != nil)
				if tab.ISL(i) != want[i].ISL() || tab.OSL(i) != want[i].OSL() || tab.Line(i) != want[i].Line ||
					tab.HashIDCount(i) != len(want[i].HashIDs) {
					t.Fatalf("row %d: columns differ from the record", i)
				}
				for _, h := range want[i].HashIDs {
					lo, hi = min(lo, h), max(hi, h)
				}
			}
			if size != tab.HashIDBytes() {
				t.Errorf("HashIDsSize adds up to %d bytes, the column holds %d", size, tab.HashIDBytes())
			}
			if glo, ghi, ok := tab.HashIDRange(); glo != lo || ghi != hi || !ok {
				t.Errorf("id range %d..%d (%v), want %d..%d", glo, ghi, ok, lo, hi)
			}
		})
	}
}

func readShared(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(sharedTraceFile(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A Mooncake row costs a few dozen bytes, not the hundreds of a Record.
func TestTableBytesPerRow(t *testing.T) {
	tab, err := ReadTable(strings.NewReader(readShared(t, "conversation_trace.jsonl")), "x", ReadOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	perRow := float64(tab.Bytes()) / float64(tab.Len())
	t.Logf("%d rows, %.1f bytes per row", tab.Len(), perRow)
	if perRow > 80 {
		t.Errorf("%.1f bytes per row, want at most 80", perRow)
	}
}

// Counts above 2³¹ are rare and kept apart, so that the daemon can reject
// them with its own message.
func TestTableBigCounts(t *testing.T) {
	text := `{"timestamp": 0, "input_length": 3000000000, "output_length": 4000000000}` + "\n" +
		`{"timestamp": 1, "input_length": 5, "output_length": 6}` + "\n"
	tab, err := ReadTable(strings.NewReader(text), "x", ReadOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tab.ISL(0) != 3000000000 || tab.OSL(0) != 4000000000 || tab.ISL(1) != 5 || tab.OSL(1) != 6 {
		t.Errorf("counts %d %d %d %d", tab.ISL(0), tab.OSL(0), tab.ISL(1), tab.OSL(1))
	}
	if r := tab.Record(0); *r.InputLength != 3000000000 || *r.OutputLength != 4000000000 {
		t.Errorf("record %s", r.AppendJSON(nil))
	}
}

// AppendEdited copies a row whole but for the fields it is given: the rows
// of a table copied with their own Row are the same rows; an edit changes
// only what it names, moving counts in and out of the rare fields.
func TestTableAppendEdited(t *testing.T) {
	text := tableRows + `{"timestamp": 8, "input_length": 3000000000, "output_length": 4000000000, "session_id": "a"}` + "\n"
	src, err := ReadTable(strings.NewReader(text), "x", ReadOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := src.Records()
	copied := NewTableBuilder(src.Len())
	copied.ReserveHashIDs(src.HashIDBytes())
	for i := range src.Len() {
		r := src.Row(i, nil)
		if err := copied.AppendEdited(src, i, &r); err != nil {
			t.Fatal(err)
		}
	}
	ct := copied.Table()
	if got := ct.Records(); !reflect.DeepEqual(got, want) {
		t.Fatalf("copied rows differ:\n got %v\nwant %v", got, want)
	}
	if lo, hi, _ := ct.HashIDRange(); lo != 0 || hi != 1<<62 {
		t.Errorf("id range %d..%d, want 0..2^62", lo, hi)
	}
	if _, _, ok := NewTableBuilder(0).Table().HashIDRange(); ok {
		t.Error("an empty table has an id range")
	}

	// Edits, in reverse order so that sessions are numbered afresh.
	edited := NewTableBuilder(0)
	for i := src.Len() - 1; i >= 0; i-- {
		r := src.Row(i, nil)
		switch {
		case r.ISL > 1<<31: // big counts become small ones
			r.ISL, r.OSL = 5, -1
		case r.ISL == 1000: // and small ones big
			r.ISL, r.OSL = 1<<33, 1<<34
		case r.HasIDs:
			r.Timestamp, r.HashIDs, r.HasIDs = 42, nil, false
		}
		if err := edited.AppendEdited(src, i, &r); err != nil {
			t.Fatal(err)
		}
	}
	et := edited.Table()
	for n := range et.Len() {
		i := src.Len() - 1 - n
		got, w := et.Record(n), want[i]
		switch {
		case w.ISL() > 1<<31:
			w.InputLength, w.OutputLength = Ptr(5), nil
		case w.ISL() == 1000:
			w.InputLength, w.OutputLength = Ptr(1<<33), Ptr(1<<34)
		case w.HashIDs != nil:
			w.Timestamp, w.HashIDs = Ptr(42.0), nil
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("row %d: got %s, want %s", n, got.AppendJSON(nil), w.AppendJSON(nil))
		}
		if s, _ := et.SessionID(n); s != "" && et.SessionOrdinal(n) != map[string]int{"a": 0, "b": 1}[s] {
			t.Errorf("row %d: session %q numbered %d, want by first appearance", n, s, et.SessionOrdinal(n))
		}
	}
	if got := src.Records(); !reflect.DeepEqual(got, want) {
		t.Error("the source table changed")
	}
}

// Copying rows with AppendEdited allocates for the columns, never per row.
func TestTableAppendEditedAllocations(t *testing.T) {
	src, err := ReadTable(strings.NewReader(readShared(t, "synthetic_trace.jsonl")+tableRows), "x", ReadOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	allocs := testing.AllocsPerRun(3, func() {
		b := NewTableBuilder(src.Len())
		b.ReserveHashIDs(src.HashIDBytes())
		for i := range src.Len() {
			r := src.Row(i, ids)
			ids = r.HashIDs
			if err := b.AppendEdited(src, i, &r); err != nil {
				t.Fatal(err)
			}
		}
		b.Table()
	})
	if perRow := allocs / float64(src.Len()); perRow > 0.01 {
		t.Errorf("%.0f allocations for %d rows (%.3f a row), want none per row", allocs, src.Len(), perRow)
	}
}

// BenchmarkReadTableConversation: the conversation trace into a Table, on
// every CPU, as the daemon reads traces.
func BenchmarkReadTableConversation(b *testing.B) {
	data := readSharedBytes(b, "conversation_trace.jsonl")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var tab *Table
	for b.Loop() {
		var err error
		tab, err = ReadTable(bytes.NewReader(data), "conversation_trace.jsonl", ReadOptions{BlockSize: DefaultBlockSize}, int64(len(data)))
		if err != nil {
			b.Fatal(err)
		}
		if tab.Len() != conversationRows {
			b.Fatalf("read %d rows, want %d", tab.Len(), conversationRows)
		}
	}
	b.ReportMetric(float64(conversationRows)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(tab.Bytes())/float64(tab.Len()), "B/row")
}
