package prompt

import (
	"slices"
	"sync"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/tokenizer"
	"github.com/kvload-exporter/kvload-exporter/tokenizer/tokenizertest"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

func TestHasher(t *testing.T) {
	h, err := NewHasher(2)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tokens []int
		want   []int64
	}{
		{[]int{1, 2, 3, 4, 5}, []int64{0, 1, 2}},
		{[]int{1, 2, 3, 4}, []int64{0, 1}},       // shared full blocks
		{[]int{1, 2, 9}, []int64{0, 3}},          // diverges in block 2
		{[]int{3, 4}, []int64{4}},                // same tokens as block 1, other parent
		{[]int{1, 2, 3}, []int64{0, 5}},          // partial [3] differs from full [3 4]
		{[]int{1, 2, 3, 4, 5}, []int64{0, 1, 2}}, // repeat
		{nil, []int64{}},
		{[]int{-1, 1 << 40}, []int64{6}}, // any int is exact
		{[]int{1}, []int64{7}},           // partial first block
	}
	for i, tc := range tests {
		if got := h.Append([]int64{}, tc.tokens); !slices.Equal(got, tc.want) {
			t.Errorf("row %d %v: ids %v, want %v", i, tc.tokens, got, tc.want)
		}
	}
	if h.Len() != 8 {
		t.Errorf("Len = %d, want 8", h.Len())
	}
	if _, err := NewHasher(0); err == nil {
		t.Error("NewHasher(0): no error")
	}
}

// renumber maps ids to consecutive integers in order of first appearance.
func renumber(rows [][]int64) [][]int64 {
	m := map[int64]int64{}
	out := make([][]int64, len(rows))
	for i, r := range rows {
		out[i] = make([]int64, len(r))
		for j, id := range r {
			n, ok := m[id]
			if !ok {
				n = int64(len(m))
				m[id] = n
			}
			out[i][j] = n
		}
	}
	return out
}

// TestHasherRoundTrip builds prompts for the first rows of both shared
// traces, tokenizes them with o200k_base and hashes them at block size 512:
// the ids and lengths must be the trace's own (after renumbering both in
// first-appearance order). internal/cli tests the same through the
// hash command and its files.
func TestHasherRoundTrip(t *testing.T) {
	n := 1000 // about 10 s without -race
	if raceEnabled {
		n = 25
	}
	tok := tokenizertest.Load(t, tokenizer.O200kBase)
	for _, name := range sharedTraceNames {
		t.Run(name, func(t *testing.T) {
			recs, err := trace.ReadFile(sharedTrace(name), trace.ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			recs = recs[:min(n, len(recs))]
			b := newTestBuilder(t, Options{Seed: 99, CacheBytes: 32 << 20})
			tokens := make([][]int, len(recs))
			errs := make([]error, len(recs))
			var wg sync.WaitGroup
			const workers = 4
			for w := range workers {
				wg.Go(func() {
					for i := w; i < len(recs); i += workers {
						text, err := b.AppendText(nil, &recs[i], 0, uint64(i))
						if err == nil {
							tokens[i], err = tok.Encode(string(text))
						}
						errs[i] = err
					}
				})
			}
			wg.Wait()
			h, _ := NewHasher(512)
			var want, got [][]int64
			for i := range recs {
				if errs[i] != nil {
					t.Fatalf("line %d: %v", recs[i].Line, errs[i])
				}
				if len(tokens[i]) != recs[i].ISL() {
					t.Fatalf("line %d: %d tokens, input_length %d", recs[i].Line, len(tokens[i]), recs[i].ISL())
				}
				want = append(want, recs[i].HashIDs)
				got = append(got, h.Append(nil, tokens[i]))
			}
			want, got = renumber(want), renumber(got)
			for i := range want {
				if !slices.Equal(got[i], want[i]) {
					t.Fatalf("line %d: hash ids %v, want %v (renumbered)", recs[i].Line, got[i], want[i])
				}
			}
		})
	}
}

// FuzzHasher checks the defining property on arbitrary inputs: two rows get
// the same id for block k exactly when their tokens agree up to the end of
// block k (and both reach that end, or both stop at the same place), and
// ids are handed out consecutively in first-appearance order.
func FuzzHasher(f *testing.F) {
	f.Add([]byte{2, 1, 2, 3, 255, 1, 2, 4, 255, 1, 2, 3})
	f.Add([]byte{1, 5, 5, 5, 255, 5, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		bs := int(data[0]%4) + 1
		var rows [][]int
		cur := []int{}
		for _, c := range data[1:] {
			if c == 255 {
				rows = append(rows, cur)
				cur = []int{}
				continue
			}
			cur = append(cur, int(c%5)) // a small alphabet makes sharing likely
		}
		rows = append(rows, cur)
		h, err := NewHasher(bs)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([][]int64, len(rows))
		next := int64(0)
		for i, r := range rows {
			ids[i] = h.Append(nil, r)
			if len(ids[i]) != (len(r)+bs-1)/bs {
				t.Fatalf("row %d: %d ids for %d tokens at block size %d", i, len(ids[i]), len(r), bs)
			}
			for _, id := range ids[i] {
				if id > next {
					t.Fatalf("row %d: id %d skips ahead of %d", i, id, next)
				}
				if id == next {
					next++
				}
			}
		}
		for i := range rows {
			for j := range rows {
				for k := 0; k < min(len(ids[i]), len(ids[j])); k++ {
					ei, ej := min((k+1)*bs, len(rows[i])), min((k+1)*bs, len(rows[j]))
					same := ei == ej && slices.Equal(rows[i][:ei], rows[j][:ej])
					if (ids[i][k] == ids[j][k]) != same {
						t.Fatalf("rows %v and %v, block %d: ids %d, %d but equal prefixes %v", rows[i], rows[j], k, ids[i][k], ids[j][k], same)
					}
				}
			}
		}
	})
}
