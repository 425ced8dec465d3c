package synth_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// everyFieldRows is a trace with every kind of field, absent and present
// (the trace package's table test rows, less the row of ids too big for the
// multipliers).
const everyFieldRows = `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]}
{"timestamp": 1.5, "input_length": 10, "output_length": 900, "hash_ids": [9], "session_id": "a"}

{"input_length": 600, "hash_ids": [9, 3], "session_id": "a", "delay": 20}
{"timestamp": 3, "input_length": 4, "hash_ids": []}
{"timestamp": 4, "text_input": "hi", "extra": {"x": 1}, "custom": [1]}
{"timestamp": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}], "session_id": "b"}
{"timestamp": 6, "payload": {"model": "m"}, "type": "mooncake_trace"}
{"input_length": 1, "session_id": "b"}
`

// interleavedRows: sessions that interleave with each other and with rows
// of no session, a session whose first row is over max_isl (5000), output
// lengths past what an int32 holds, ids 2⁴⁰ apart (counted in a map rather
// than bitmaps), a partial all-shared row and an empty id list.
const interleavedRows = `{"timestamp": 10, "input_length": 9000, "output_length": 4, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "session_id": "a"}
{"timestamp": 20, "input_length": 1024, "output_length": 3000000000, "hash_ids": [0, 1], "session_id": "b"}
{"timestamp": 30, "input_length": 700, "output_length": 7, "hash_ids": [0, 1]}
{"timestamp": 40, "input_length": 600, "output_length": 9, "hash_ids": [0, 20], "session_id": "a", "delay": 5}
{"timestamp": 50, "input_length": 1500, "output_length": 4000000000, "hash_ids": [0, 1, 21], "session_id": "b", "note": 1}
{"timestamp": 60.7, "input_length": 3, "output_length": 1, "hash_ids": [1099511627776]}
{"timestamp": 70, "input_length": 513, "output_length": 2, "hash_ids": [1099511627776, 22], "session_id": "c"}
{"input_length": 100, "output_length": 1, "session_id": "a", "delay": 0}
{"timestamp": 80, "input_length": 1, "output_length": 0, "hash_ids": [], "session_id": "c"}
{"timestamp": 90, "text_input": "hi", "output_length": 700, "session_id": "b"}
`

// sharedTraceText is the text of one of the real traces beside the checkout.
func sharedTraceText(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "mooncake", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tableOfText reads text as the daemon does, into a Table.
func tableOfText(t testing.TB, text string) *trace.Table {
	t.Helper()
	tab, err := trace.ReadTable(strings.NewReader(text), "x", trace.ReadOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// everySetting is each synthesis option alone and in the combinations the
// daemon meets.
func everySetting() []struct {
	name string
	k    synth.Knobs
} {
	return []struct {
		name string
		k    synth.Knobs
	}{
		{"defaults", synth.DefaultKnobs()}, // sessions are regrouped
		{"speedup_ratio 2", knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2 })},
		{"speedup_ratio 147", knobs(func(k *synth.Knobs) { k.SpeedupRatio = 147 })},
		{"speedup_ratio 0.5", knobs(func(k *synth.Knobs) { k.SpeedupRatio = 0.5 })},
		{"prefix_len_multiplier 2", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 2 })},
		{"prefix_len_multiplier 1.5", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 1.5 })},
		{"prefix_len_multiplier 0.5", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 0.5 })},
		{"prompt_len_multiplier 2.5", knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 2.5 })},
		{"prompt_len_multiplier 0.001", knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 0.001 })},
		{"prefix_root_multiplier 4", knobs(func(k *synth.Knobs) { k.PrefixRootMultiplier = 4; k.Seed = 7 })},
		{"output_len_multiplier 0.5", knobs(func(k *synth.Knobs) { k.OutputLenMultiplier = 0.5 })},
		{"output_len_multiplier 0", knobs(func(k *synth.Knobs) { k.OutputLenMultiplier = 0 })},
		{"max_isl", knobs(func(k *synth.Knobs) { k.MaxISL = 5000 })},
		{"max_osl", knobs(func(k *synth.Knobs) { k.MaxOSL = 100 })},
		{"speedup_ratio max_isl", knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2; k.MaxISL = 5000 })},
		{"speedup_ratio max_osl", knobs(func(k *synth.Knobs) { k.SpeedupRatio = 147; k.MaxOSL = 16 })},
		{"everything", knobs(func(k *synth.Knobs) {
			*k = synth.Knobs{BlockSize: 512, Synthesis: synth.Synthesis{SpeedupRatio: 147, PrefixLenMultiplier: 3, PrefixRootMultiplier: 4,
				PromptLenMultiplier: 0.5, OutputLenMultiplier: 1.5, MaxISL: 20000, MaxOSL: 100}, Seed: 3}
		})},
	}
}

// TestTransformTableMatchesTransform: every synthesis option, on the
// columns, gives the rows Transform gives on Records: timestamps, lengths,
// hash ids, sessions, every other field and the line of each row, in the
// same order, with the same counts.
func TestTransformTableMatchesTransform(t *testing.T) {
	inputs := []struct {
		name string
		text string
	}{
		{"every field", everyFieldRows},
		{"interleaved", interleavedRows},
		{"conversation", sharedTraceText(t, "conversation_trace.jsonl")},
		{"synthetic", sharedTraceText(t, "synthetic_trace.jsonl")},
	}
	for _, in := range inputs {
		tab := tableOfText(t, in.text)
		want := tab.Records()
		for _, s := range everySetting() {
			t.Run(in.name+"/"+s.name, func(t *testing.T) {
				if err := assertSameTransform(t, tab, want, s.k); err != nil {
					t.Fatal(err)
				}
			})
		}
		if firstDifference(tab.Records(), want) >= 0 {
			t.Errorf("%s: TransformTable modified its input", in.name)
		}
	}
}

// TestTransformTableErrors: where Transform fails, TransformTable fails
// with the same message.
func TestTransformTableErrors(t *testing.T) {
	// A row the reader refuses, which a table built from Records holds.
	noISL, err := trace.TableOf([]trace.Record{{Timestamp: trace.Ptr(0.0), HashIDs: []int64{1}, Line: 1}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		text string // or tab
		tab  *trace.Table
		k    synth.Knobs
	}{
		{"ids do not fit 16-token blocks", interleavedRows,
			nil, knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2; k.BlockSize = 16 })},
		{"ids without input_length", "", noISL, knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2 })},
		{"prefix overflows the ids", `{"timestamp": 0, "input_length": 1, "hash_ids": [2305843009213693952]}` + "\n" +
			`{"timestamp": 0, "input_length": 1, "hash_ids": [2305843009213693952]}` + "\n",
			nil, knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 4 })},
		{"roots overflow the ids", `{"timestamp": 0, "input_length": 1, "hash_ids": [1152921504606846976]}` + "\n" +
			`{"timestamp": 0, "input_length": 1, "hash_ids": [1152921504606846976]}` + "\n",
			nil, knobs(func(k *synth.Knobs) { k.PrefixRootMultiplier = 8 })},
		{"prompt too long", interleavedRows, nil, knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 1e12 })},
		{"bad knob", everyFieldRows, nil, knobs(func(k *synth.Knobs) { k.SpeedupRatio = -1 })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab := tc.tab
			if tab == nil {
				tab = tableOfText(t, tc.text)
			}
			if err := assertSameTransform(t, tab, tab.Records(), tc.k); err == nil {
				t.Error("no error")
			}
		})
	}
}

// assertSameTransform runs Transform on recs and TransformTable on tab,
// which holds the same rows, and reports any difference; it returns their
// error.
func assertSameTransform(t *testing.T, tab *trace.Table, recs []trace.Record, k synth.Knobs) error {
	t.Helper()
	want, wst, werr := synth.Transform(recs, k)
	got, gst, gerr := synth.TransformTable(tab, k)
	if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
		t.Fatalf("error %v, want %v", gerr, werr)
	}
	if werr != nil {
		return werr
	}
	if gst != wst {
		t.Errorf("stats %+v, want %+v", gst, wst)
	}
	if i := firstDifference(got.Records(), want); i >= 0 {
		rows := got.Records()
		if i >= len(rows) || i >= len(want) {
			t.Fatalf("%d rows, want %d", len(rows), len(want))
		}
		t.Fatalf("row %d (line %d, want line %d):\n got %s\nwant %s",
			i, rows[i].Line, want[i].Line, rows[i].AppendJSON(nil), want[i].AppendJSON(nil))
	}
	return nil
}

// firstDifference is the index of the first row where a and b differ, -1
// when none does. A row is its line and its JSON, which writes every field
// it has, and an empty hash_ids apart from none.
func firstDifference(a, b []trace.Record) int {
	var ja, jb []byte
	for i := range min(len(a), len(b)) {
		ja, jb = a[i].AppendJSON(ja[:0]), b[i].AppendJSON(jb[:0])
		if a[i].Line != b[i].Line || string(ja) != string(jb) {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestTransformTableStaysCompact: synthesis of a table allocates for its
// columns, never per row, whatever the options: the rows are never
// unpacked into Records on the way. A transform that changes nothing
// returns the table itself.
func TestTransformTableStaysCompact(t *testing.T) {
	for _, in := range []struct {
		name string
		tab  *trace.Table
	}{
		{"conversation", tableOfText(t, sharedTraceText(t, "conversation_trace.jsonl"))},
		// sessions, delays and the rare fields
		{"synthetic and every field", tableOfText(t, everyFieldRows+sharedTraceText(t, "synthetic_trace.jsonl"))},
	} {
		for _, s := range everySetting() {
			t.Run(in.name+"/"+s.name, func(t *testing.T) {
				allocs := testing.AllocsPerRun(1, func() {
					if _, _, err := synth.TransformTable(in.tab, s.k); err != nil {
						t.Fatal(err)
					}
				})
				// A Record costs three allocations or more; the columns
				// and their growth take a few dozen in all.
				t.Logf("%.0f allocations for %d rows", allocs, in.tab.Len())
				if perRow := allocs / float64(in.tab.Len()); perRow > 0.05 {
					t.Errorf("%.0f allocations for %d rows (%.3f a row), want none per row", allocs, in.tab.Len(), perRow)
				}
			})
		}
	}
	plain := tableOfText(t, sharedTraceText(t, "conversation_trace.jsonl"))
	if got, _, _ := synth.TransformTable(plain, synth.DefaultKnobs()); got != plain {
		t.Error("a trace without sessions was copied by a transform that changes nothing")
	}
}
