package synth_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// row is a compact way to write a trace row in a table: ids/isl.
type row struct {
	ids []int64
	isl int
}

func rowsOf(rs ...row) []trace.Record {
	out := make([]trace.Record, len(rs))
	for i, r := range rs {
		out[i] = trace.Record{InputLength: trace.Ptr(r.isl), HashIDs: r.ids, Line: i + 1}
	}
	return out
}

func knobs(f func(*synth.Knobs)) synth.Knobs {
	k := synth.DefaultKnobs()
	f(&k)
	return k
}

func TestTransformIDs(t *testing.T) {
	worked := []row{{[]int64{0, 1, 2, 3}, 1900}, {[]int64{0, 1}, 1024}, {[]int64{0, 1, 2}, 1536}, {[]int64{0, 4, 5}, 1300}}
	// 0 and 1 are shared; row 0 is all prefix with a 188-token last block,
	// the case AIPerf rejects with "input_len < prefix_len".
	partial := []row{{[]int64{0, 1}, 700}, {[]int64{0, 1}, 1024}}
	tests := []struct {
		name string
		in   []row
		k    synth.Knobs
		want []row
	}{
		// trace-semantics §4.1 worked examples, B = 512.
		{"worked P=2", worked, knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 2 }),
			[]row{{[]int64{0, 1, 2, 3, 4, 5, 7}, 3436}, {[]int64{0, 1, 2, 3}, 2048}, {[]int64{0, 1, 2, 3, 4, 5}, 3072}, {[]int64{0, 1, 8, 9}, 1812}}},
		{"worked P=1.5", worked, knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 1.5 }),
			[]row{{[]int64{0, 1, 2, 4, 5, 6}, 2924}, {[]int64{0, 1, 7}, 1536}, {[]int64{0, 1, 2, 8, 9}, 2560}, {[]int64{0, 10, 11, 12}, 1812}}},
		{"worked Q=2", worked, knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 2 }),
			[]row{{[]int64{0, 1, 2, 4, 5}, 2264}, {[]int64{0, 1}, 1024}, {[]int64{0, 1, 2}, 1536}, {[]int64{0, 6, 7, 8, 9}, 2088}}},
		// Speedup alone still runs the synthesizer, which renumbers
		// every unshared block (3, 4, 5 here).
		{"worked speedup renumbers", worked, knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2 }),
			[]row{{[]int64{0, 1, 2, 4}, 1900}, {[]int64{0, 1}, 1024}, {[]int64{0, 1, 2}, 1536}, {[]int64{0, 5, 6}, 1300}}},
		// max_isl caps after synthesis and trims ids to match.
		{"worked P=2 max_isl", worked, knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 2; k.MaxISL = 3000 }),
			[]row{{[]int64{0, 1, 2, 3, 4, 5}, 3000}, {[]int64{0, 1, 2, 3}, 2048}, {[]int64{0, 1, 2, 3, 4, 5}, 3000}, {[]int64{0, 1, 8, 9}, 1812}}},

		// All-prefix rows with a partial last block: the new prefix ends
		// with a block short by the same 324 tokens.
		{"partial P=1", partial, knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2 }),
			[]row{{[]int64{0, 1}, 700}, {[]int64{0, 1}, 1024}}},
		{"partial P=2", partial, knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 2 }),
			[]row{{[]int64{0, 1, 2, 3}, 1724}, {[]int64{0, 1, 2, 3}, 2048}}},
		{"partial P=1.5", partial, knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 1.5 }),
			[]row{{[]int64{0, 1, 3}, 1212}, {[]int64{0, 1, 4}, 1536}}},
		{"partial P=0.5 cuts the partial block", partial, knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 0.5 }),
			[]row{{[]int64{0}, 512}, {[]int64{0}, 512}}},
		{"partial P=0.5 keeps a lone partial block", []row{{[]int64{7}, 100}, {[]int64{7}, 300}},
			knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 0.5 }),
			[]row{{[]int64{7}, 100}, {[]int64{7}, 300}}},
		{"partial Q=3 has no prompt to scale", partial, knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 3 }),
			[]row{{[]int64{0, 1}, 700}, {[]int64{0, 1}, 1024}}},

		// P < 1 without a shared prefix keeps no prefix block (AIPerf
		// would count 512 tokens without an id: 1512 and 522).
		{"P<1 no prefix", []row{{[]int64{0, 1}, 1000}, {[]int64{2}, 10}},
			knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 0.5 }),
			[]row{{[]int64{2, 3}, 1000}, {[]int64{4}, 10}}},
		// A prompt scaled below one token keeps one.
		{"tiny Q keeps a token", []row{{[]int64{0}, 3}, {[]int64{1, 2}, 600}},
			knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 0.1 }),
			[]row{{[]int64{2}, 1}, {[]int64{3}, 60}}},
		// Rows without ids keep input_length and ignore Q; an empty list
		// is dropped.
		{"no ids", []row{{nil, 900}, {[]int64{}, 50}, {[]int64{0}, 10}},
			knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 2 }),
			[]row{{nil, 900}, {nil, 50}, {[]int64{2}, 20}}},
		// Only max_isl/max_osl: filter, no renumbering.
		{"max_isl alone filters", worked, knobs(func(k *synth.Knobs) { k.MaxISL = 1536 }),
			[]row{{[]int64{0, 1}, 1024}, {[]int64{0, 1, 2}, 1536}, {[]int64{0, 4, 5}, 1300}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := rowsOf(tc.in...)
			before := rowsOf(tc.in...)
			out, _, err := synth.Transform(in, tc.k)
			if err != nil {
				t.Fatal(err)
			}
			var got []row
			for _, r := range out {
				got = append(got, row{r.HashIDs, r.ISL()})
			}
			if !rowsEqual(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
			if !recordsEqual(in, before) {
				t.Error("Transform modified its input")
			}
		})
	}
}

func rowsEqual(a, b []row) bool {
	return slices.EqualFunc(a, b, func(x, y row) bool {
		return x.isl == y.isl && slices.Equal(x.ids, y.ids) && (x.ids == nil) == (y.ids == nil)
	})
}

func recordsEqual(a, b []trace.Record) bool {
	return slices.EqualFunc(a, b, func(x, y trace.Record) bool {
		return string(x.AppendJSON(nil)) == string(y.AppendJSON(nil))
	})
}

func TestTransformFields(t *testing.T) {
	raw := []string{
		`{"timestamp": 1001, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1], "session_id": "a", "x": [1]}`,
		`{"timestamp": 7.9, "input_length": 512, "output_length": 7, "hash_ids": [0], "session_id": "b"}`,
		`{"timestamp": 3, "text_input": "hi", "output_length": 1, "session_id": "a", "delay": 250}`,
		`{"messages": [{"role": "user", "content": "x"}], "output_length": 1000}`,
		`{"timestamp": 4, "input_length": 10, "output_length": 0, "session_id": "b"}`,
	}
	var in []trace.Record
	for i, s := range raw {
		r, err := trace.ParseRecord([]byte(s), trace.ReadOptions{BlockSize: 512})
		if err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		in = append(in, r)
	}
	tests := []struct {
		name string
		k    synth.Knobs
		want []string
	}{
		{"speedup and output multiplier", knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2; k.OutputLenMultiplier = 0.5; k.MaxOSL = 300 }), []string{
			// Session order: a, a, b, b, then the session-less row.
			// 2.5 → 2 and 3.5 → 4 (half to even), 0 → 1, 1000·0.5 capped at 300.
			`{"timestamp": 500, "input_length": 1024, "output_length": 2, "hash_ids": [0, 2], "session_id": "a", "x": [1]}`,
			`{"timestamp": 1, "output_length": 1, "session_id": "a", "delay": 250, "text_input": "hi"}`,
			`{"timestamp": 3, "input_length": 512, "output_length": 4, "hash_ids": [0], "session_id": "b"}`,
			`{"timestamp": 2, "input_length": 10, "output_length": 1, "session_id": "b"}`,
			`{"output_length": 300, "messages": [{"role":"user","content":"x"}]}`,
		}},
		{"max_osl alone caps only", knobs(func(k *synth.Knobs) { k.MaxOSL = 6 }), []string{
			`{"timestamp": 1001, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1], "session_id": "a", "x": [1]}`,
			`{"timestamp": 3, "output_length": 1, "session_id": "a", "delay": 250, "text_input": "hi"}`,
			`{"timestamp": 7.9, "input_length": 512, "output_length": 6, "hash_ids": [0], "session_id": "b"}`,
			`{"timestamp": 4, "input_length": 10, "output_length": 0, "session_id": "b"}`,
			`{"output_length": 6, "messages": [{"role":"user","content":"x"}]}`,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, st, err := synth.Transform(in, tc.k)
			if err != nil {
				t.Fatal(err)
			}
			if st.RowsIn != 5 || st.RowsOut != 5 || st.DroppedMaxISL != 0 {
				t.Errorf("stats %+v", st)
			}
			for i, r := range out {
				if got := string(r.AppendJSON(nil)); i >= len(tc.want) || got != tc.want[i] {
					t.Errorf("row %d:\n got %s", i, got)
				}
			}
		})
	}
}

func TestTransformRootMultiplier(t *testing.T) {
	in := rowsOf(row{[]int64{0, 1, 2, 3}, 1900}, row{[]int64{0, 1}, 1024}, row{[]int64{0, 1, 2}, 1536},
		row{[]int64{0, 4, 5}, 1300}, row{nil, 10}, row{[]int64{0, 6}, 600})
	plain, _, err := synth.Transform(in, knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2 }))
	if err != nil {
		t.Fatal(err)
	}
	const base = 8 // largest id handed out (7) + 1
	spread := func(seed uint64) []int64 {
		out, _, err := synth.Transform(in, knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2; k.PrefixRootMultiplier = 4; k.Seed = seed }))
		if err != nil {
			t.Fatal(err)
		}
		var roots []int64
		for i, r := range out {
			if r.ISL() != plain[i].ISL() || len(r.HashIDs) != len(plain[i].HashIDs) {
				t.Fatalf("row %d: %v/%d, want the ids of %v/%d shifted", i, r.HashIDs, r.ISL(), plain[i].HashIDs, plain[i].ISL())
			}
			if len(r.HashIDs) == 0 {
				continue
			}
			shift := r.HashIDs[0] - plain[i].HashIDs[0]
			if shift%base != 0 || shift < 0 || shift/base > 3 {
				t.Fatalf("row %d shifted by %d, want t·%d with t in [0, 3]", i, shift, base)
			}
			for j := range r.HashIDs {
				if r.HashIDs[j]-plain[i].HashIDs[j] != shift {
					t.Fatalf("row %d: ids %v not one shift of %v", i, r.HashIDs, plain[i].HashIDs)
				}
			}
			roots = append(roots, shift/base)
		}
		return roots
	}
	a, b := spread(1), spread(1)
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different roots: %v %v", a, b)
	}
	differ := false
	for seed := uint64(2); seed < 10 && !differ; seed++ {
		differ = !slices.Equal(a, spread(seed))
	}
	if !differ {
		t.Errorf("roots %v do not depend on the seed", a)
	}
}

func TestTransformErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []trace.Record
		k    synth.Knobs
	}{
		{"zero speedup", rowsOf(row{[]int64{0}, 1}), knobs(func(k *synth.Knobs) { k.SpeedupRatio = 0 })},
		{"root 0", rowsOf(row{[]int64{0}, 1}), knobs(func(k *synth.Knobs) { k.PrefixRootMultiplier = 0 })},
		{"negative output multiplier", rowsOf(row{[]int64{0}, 1}), knobs(func(k *synth.Knobs) { k.OutputLenMultiplier = -1 })},
		{"ids do not fit", rowsOf(row{[]int64{0, 1}, 100}), knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2 })},
		{"ids overflow", rowsOf(row{[]int64{1 << 61}, 1}, row{[]int64{1 << 61}, 1}), knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 4 })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := synth.Transform(tc.in, tc.k); err == nil {
				t.Error("no error")
			}
		})
	}
}

// traceFile is one of the real traces every checkout has beside it.
func traceFile(t testing.TB, name string) []trace.Record {
	t.Helper()
	rows, err := trace.ReadFile(filepath.Join("..", "testdata", "mooncake", name), trace.ReadOptions{BlockSize: 512})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestTransformSharedTraces runs the transform over both FAST'25 traces,
// including the rows AIPerf crashes on, and checks that every output row
// still fits its hash_ids.
func TestTransformSharedTraces(t *testing.T) {
	traces := []struct {
		name string
		// rows whose ids are all shared and whose last block is partial
		// (trace-semantics §8)
		crashRows int
	}{
		{"conversation_trace.jsonl", 206},
		{"synthetic_trace.jsonl", 407},
	}
	settings := []struct {
		name string
		k    synth.Knobs
	}{
		{"speedup", knobs(func(k *synth.Knobs) { k.SpeedupRatio = 2 })},
		{"P=2", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 2 })},
		{"P=1.5", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 1.5 })},
		{"P=0.5", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 0.5 })},
		{"P=0.3 Q=0.001", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 0.3; k.PromptLenMultiplier = 0.001 })},
		{"Q=2.5", knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 2.5 })},
		{"Q=0.5 max_isl", knobs(func(k *synth.Knobs) { k.PromptLenMultiplier = 0.5; k.MaxISL = 8000 })},
		{"P=3 R=4 max_isl", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 3; k.PrefixRootMultiplier = 4; k.MaxISL = 20000 })},
		{"output max_osl", knobs(func(k *synth.Knobs) { k.OutputLenMultiplier = 0.5; k.MaxOSL = 100 })},
	}
	for _, tr := range traces {
		in := traceFile(t, tr.name)
		if got := countCrashRows(in); got != tr.crashRows {
			t.Errorf("%s: %d all-shared rows with a partial last block, want %d", tr.name, got, tr.crashRows)
		}
		for _, s := range settings {
			t.Run(tr.name+"/"+s.name, func(t *testing.T) {
				out, st, err := synth.Transform(in, s.k)
				if err != nil {
					t.Fatal(err)
				}
				if st.RowsOut+st.DroppedMaxISL != len(in) || st.RowsOut != len(out) {
					t.Errorf("stats %+v for %d rows", st, len(in))
				}
				for i := range out {
					r := &out[i]
					if err := r.Validate(512); err != nil {
						t.Fatalf("row %d (line %d): %v: %s", i, r.Line, err, r.AppendJSON(nil))
					}
					if s.k.MaxISL > 0 && r.ISL() > s.k.MaxISL {
						t.Fatalf("row %d: input_length %d over max_isl", i, r.ISL())
					}
					if s.k.MaxOSL > 0 && (r.OSL() > s.k.MaxOSL || r.OSL() < 1) {
						t.Fatalf("row %d: output_length %d", i, r.OSL())
					}
					if len(r.HashIDs) == 0 {
						t.Fatalf("row %d lost its ids", i)
					}
				}
			})
		}
	}
}

func countCrashRows(rows []trace.Record) int {
	count := map[int64]int{}
	for _, r := range rows {
		for _, h := range r.HashIDs {
			count[h]++
		}
	}
	n := 0
	for _, r := range rows {
		all := len(r.HashIDs) > 0
		for _, h := range r.HashIDs {
			all = all && count[h] > 1
		}
		if all && r.ISL() < len(r.HashIDs)*512 {
			n++
		}
	}
	return n
}
