package synth_test

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

func generate(t testing.TB, rows []trace.Record, n int, k synth.Knobs) []trace.Record {
	t.Helper()
	out, st, err := synth.Generate(rows, n, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != n || st.RowsOut != n || st.RowsIn != len(rows) {
		t.Fatalf("got %d rows, stats %+v, want %d", len(out), st, n)
	}
	return out
}

func jsonl(rows []trace.Record) []byte {
	var b []byte
	for i := range rows {
		b = append(rows[i].AppendJSON(b), '\n')
	}
	return b
}

func TestGenerateDeterministic(t *testing.T) {
	src := traceFile(t, "conversation_trace.jsonl")
	k := synth.DefaultKnobs()
	k.Seed = 7
	a := jsonl(generate(t, src, 5000, k))
	b := jsonl(generate(t, src, 5000, k))
	if !bytes.Equal(a, b) {
		t.Error("same seed, different output")
	}
	k.Seed = 8
	if c := jsonl(generate(t, src, 5000, k)); bytes.Equal(a, c) {
		t.Error("seeds 7 and 8 give the same output")
	}
}

// TestGenerateStreams checks that a knob changes only what it owns.
func TestGenerateStreams(t *testing.T) {
	src := traceFile(t, "conversation_trace.jsonl")
	const n = 5000
	base := knobs(func(k *synth.Knobs) { k.Seed = 3 })
	ref := generate(t, src, n, base)
	tests := []struct {
		name       string
		k          synth.Knobs
		sameISL    bool
		sameBlocks bool // same number of hash ids per row
	}{
		{"root multiplier", knobs(func(k *synth.Knobs) { k.Seed = 3; k.PrefixRootMultiplier = 4 }), true, true},
		{"prefix multiplier", knobs(func(k *synth.Knobs) { k.Seed = 3; k.PrefixLenMultiplier = 2 }), false, false},
		{"prompt multiplier", knobs(func(k *synth.Knobs) { k.Seed = 3; k.PromptLenMultiplier = 0.5 }), false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := generate(t, src, n, tc.k)
			changed := false
			for i := range got {
				g, r := &got[i], &ref[i]
				if *g.Timestamp != *r.Timestamp || g.OSL() != r.OSL() {
					t.Fatalf("row %d: timestamp/output %v/%d, want %v/%d", i, *g.Timestamp, g.OSL(), *r.Timestamp, r.OSL())
				}
				if tc.sameISL && g.ISL() != r.ISL() {
					t.Fatalf("row %d: input_length %d, want %d", i, g.ISL(), r.ISL())
				}
				if tc.sameBlocks && len(g.HashIDs) != len(r.HashIDs) {
					t.Fatalf("row %d: %d ids, want %d", i, len(g.HashIDs), len(r.HashIDs))
				}
				// The last block's size is drawn, not derived: it must not
				// move with the knob.
				if last := func(x *trace.Record) int { return x.ISL() - (len(x.HashIDs)-1)*512 }; last(g) != last(r) {
					t.Fatalf("row %d: last block %d, want %d", i, last(g), last(r))
				}
				changed = changed || !slices.Equal(g.HashIDs, r.HashIDs)
			}
			if !changed {
				t.Error("the knob changed no hash ids")
			}
		})
	}
}

// TestGenerateMatchesSource compares the generated trace's statistics with
// the source's: means and medians of input and output lengths within 5%,
// mean theoretical hit rate within 0.05.
func TestGenerateMatchesSource(t *testing.T) {
	// 50,000 keeps the test quick under -race; the 100,000-request run
	// is a manual acceptance check.
	const n = 50_000
	for _, name := range []string{"conversation_trace.jsonl", "synthetic_trace.jsonl"} {
		t.Run(name, func(t *testing.T) {
			src := traceFile(t, name)
			out := generate(t, src, n, knobs(func(k *synth.Knobs) { k.Seed = 7 }))
			want, got := summarize(src), summarize(out)
			t.Logf("source    %+v", want)
			t.Logf("generated %+v", got)
			near := func(what string, g, w float64) {
				if math.Abs(g-w) > 0.05*w {
					t.Errorf("%s %.1f, source %.1f: more than 5%% apart", what, g, w)
				}
			}
			near("mean input_length", got.islMean, want.islMean)
			near("median input_length", got.islMedian, want.islMedian)
			near("mean output_length", got.oslMean, want.oslMean)
			near("median output_length", got.oslMedian, want.oslMedian)
			if math.Abs(got.hitRate-want.hitRate) > 0.05 {
				t.Errorf("mean hit rate %.4f, source %.4f: more than 0.05 apart", got.hitRate, want.hitRate)
			}
		})
	}
}

type traceSummary struct {
	islMean, islMedian, oslMean, oslMedian, hitRate float64
}

func summarize(rows []trace.Record) traceSummary {
	var isl, osl, hit []float64
	seen := map[int64]bool{}
	for _, r := range rows {
		isl = append(isl, float64(r.ISL()))
		osl = append(osl, float64(r.OSL()))
		if len(r.HashIDs) == 0 {
			continue
		}
		// §2.2: leading ids already seen, file order, infinite cache.
		k := 0
		for k < len(r.HashIDs) && seen[r.HashIDs[k]] {
			k++
		}
		hit = append(hit, float64(k)/float64(len(r.HashIDs)))
		for _, h := range r.HashIDs {
			seen[h] = true
		}
	}
	return traceSummary{meanOf(isl), medianOf(isl), meanOf(osl), medianOf(osl), meanOf(hit)}
}

func meanOf(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// TestGenerateRows checks every generated row against the block rule and
// the caps, under several knob settings.
func TestGenerateRows(t *testing.T) {
	src := traceFile(t, "synthetic_trace.jsonl")
	tests := []struct {
		name string
		k    synth.Knobs
	}{
		{"defaults", synth.DefaultKnobs()},
		{"P=1.5 Q=0.5", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 1.5; k.PromptLenMultiplier = 0.5 })},
		{"P=0.4 Q=3", knobs(func(k *synth.Knobs) { k.PrefixLenMultiplier = 0.4; k.PromptLenMultiplier = 3 })},
		{"caps R=3", knobs(func(k *synth.Knobs) {
			k.MaxISL, k.MaxOSL, k.PrefixRootMultiplier, k.OutputLenMultiplier = 4096, 100, 3, 0.01
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, st, err := synth.Generate(src, 8000, tc.k)
			if err != nil {
				t.Fatal(err)
			}
			if (tc.k.MaxISL > 0) != (st.DroppedMaxISL > 0) {
				t.Errorf("%d requests dropped by max_isl %d", st.DroppedMaxISL, tc.k.MaxISL)
			}
			prev := -1.0
			for i := range out {
				r := &out[i]
				if err := r.Validate(512); err != nil || len(r.HashIDs) == 0 {
					t.Fatalf("row %d: %v: %s", i, err, r.AppendJSON(nil))
				}
				if tc.k.MaxISL > 0 && r.ISL() > tc.k.MaxISL {
					t.Fatalf("row %d: input_length %d over max_isl", i, r.ISL())
				}
				if r.OSL() < 1 || (tc.k.MaxOSL > 0 && r.OSL() > tc.k.MaxOSL) {
					t.Fatalf("row %d: output_length %d", i, r.OSL())
				}
				if *r.Timestamp < prev || *r.Timestamp != math.Trunc(*r.Timestamp) {
					t.Fatalf("row %d: timestamp %v after %v", i, *r.Timestamp, prev)
				}
				prev = *r.Timestamp
			}
		})
	}
}

// TestGenerateTriePaths checks, with P = 1, that the shared part of every
// request of the first pass is a path of the source trie: the conversation
// trace's ids are in first-appearance order, so they are their own
// normalised ids, and each id has a single parent.
func TestGenerateTriePaths(t *testing.T) {
	src := traceFile(t, "conversation_trace.jsonl")
	parent := map[int64]int64{}
	for _, r := range src {
		p := int64(-1)
		for _, h := range r.HashIDs {
			if q, ok := parent[h]; ok && q != p {
				t.Fatalf("line %d: id %d under two parents", r.Line, h)
			}
			parent[h] = p
			p = h
		}
	}
	span := int64(len(parent))
	out := generate(t, src, len(src), synth.DefaultKnobs())
	fresh := 0
	for i, r := range out {
		p := int64(-1)
		for j, h := range r.HashIDs {
			if h >= span {
				fresh += len(r.HashIDs) - j
				break
			}
			if parent[h] != p {
				t.Fatalf("row %d: %d follows %d, not its source parent %d", i, h, p, parent[h])
			}
			p = h
		}
	}
	if fresh == 0 {
		t.Error("no fresh ids: leaves were not generated")
	}
}

// TestGenerateSpeedup checks that timestamps are the unsped ones divided
// once, not gap by gap.
func TestGenerateSpeedup(t *testing.T) {
	src := traceFile(t, "synthetic_trace.jsonl")
	ref := generate(t, src, 3000, synth.DefaultKnobs())
	fast := generate(t, src, 3000, knobs(func(k *synth.Knobs) { k.SpeedupRatio = 7 }))
	for i := range ref {
		if want := math.Floor(*ref[i].Timestamp / 7); *fast[i].Timestamp != want {
			t.Fatalf("row %d: timestamp %v, want %v", i, *fast[i].Timestamp, want)
		}
	}
}

func TestGenerateSmallTraces(t *testing.T) {
	ts := func(r trace.Record, ms float64, osl int) trace.Record {
		r.Timestamp, r.OutputLength = trace.Ptr(ms), trace.Ptr(osl)
		return r
	}
	tests := []struct {
		name    string
		rows    []trace.Record
		check   func(t *testing.T, out []trace.Record)
		wantErr string
	}{
		{
			// Rows without ids stay out of the trie: every request is
			// block 0 plus one fresh 512-token block.
			name: "rows without ids",
			rows: append(rowsOf(row{[]int64{0, 1}, 1024}, row{[]int64{0, 2}, 1024}), slices.Repeat(rowsOf(row{nil, 10}), 50)...),
			check: func(t *testing.T, out []trace.Record) {
				for i, r := range out {
					if len(r.HashIDs) != 2 || r.ISL() != 1024 {
						t.Fatalf("row %d: %v/%d", i, r.HashIDs, r.ISL())
					}
				}
			},
		},
		{
			// A walk that stops on a shared node keeps the partial last
			// block of the rows that stopped there.
			name: "stop on a shared node",
			rows: rowsOf(row{[]int64{0, 1}, 700}, row{[]int64{0, 1}, 700}),
			check: func(t *testing.T, out []trace.Record) {
				for i, r := range out {
					if r.ISL() != 700 || len(r.HashIDs) != 2 {
						t.Fatalf("row %d: %v/%d", i, r.HashIDs, r.ISL())
					}
				}
			},
		},
		{
			name:    "no ids at all",
			rows:    rowsOf(row{nil, 10}),
			wantErr: "no row has hash_ids",
		},
		{
			name:    "missing timestamp",
			rows:    []trace.Record{{InputLength: trace.Ptr(10), OutputLength: trace.Ptr(1), Line: 4}},
			wantErr: "line 4: generating needs a timestamp",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rows := tc.rows
			if tc.wantErr == "" || !strings.Contains(tc.wantErr, "timestamp") {
				for i := range rows {
					rows[i] = ts(rows[i], float64(i/3*100), 5)
				}
			}
			out, _, err := synth.Generate(rows, 200, synth.DefaultKnobs())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, out)
		})
	}
}

func TestGenerateMaxISLTooSmall(t *testing.T) {
	rows := rowsOf(row{[]int64{0, 1}, 1000}, row{[]int64{0, 2}, 1000})
	for i := range rows {
		rows[i].Timestamp, rows[i].OutputLength = trace.Ptr(float64(i)), trace.Ptr(1)
	}
	_, _, err := synth.Generate(rows, 10, knobs(func(k *synth.Knobs) { k.MaxISL = 100 }))
	if err == nil || !strings.Contains(err.Error(), "max_isl 100") {
		t.Fatalf("error %v", err)
	}
}

func BenchmarkGenerate100k(b *testing.B) {
	src := traceFile(b, "conversation_trace.jsonl")
	k := synth.DefaultKnobs()
	for b.Loop() {
		if _, _, err := synth.Generate(src, 100_000, k); err != nil {
			b.Fatal(err)
		}
	}
}
