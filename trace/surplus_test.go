package trace

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestFittingIDs(t *testing.T) {
	tests := []struct{ isl, block, want int }{
		{0, 512, 0},
		{1, 512, 1},
		{512, 512, 1},
		{513, 512, 2},
		{655, 512, 2},
		{117, 16, 8},
		{1 << 40, 1 << 62, 1}, // no overflow with a huge block
	}
	for _, tt := range tests {
		if got := FittingIDs(tt.isl, tt.block); got != tt.want {
			t.Errorf("FittingIDs(%d, %d) = %d, want %d", tt.isl, tt.block, got, tt.want)
		}
	}
}

// TestTooFewHashIDsIs: a row short of ids is told as before and matches
// ErrTooFewHashIDs, which the daemon's message about block_size keys on.
func TestTooFewHashIDsIs(t *testing.T) {
	for _, line := range []string{`{"input_length": 1100, "hash_ids": [1, 2]}`, `{"input_length": 0, "hash_ids": [1]}`} {
		_, err := ParseRecord([]byte(line), ReadOptions{BlockSize: 512})
		if !errors.Is(err, ErrTooFewHashIDs) || !strings.Contains(err.Error(), "does not fit") {
			t.Errorf("%s: %v, want ErrTooFewHashIDs", line, err)
		}
	}
	_, err := ParseRecord([]byte(`{"input_length": 1, "hash_ids": "x"}`), ReadOptions{BlockSize: 512})
	if errors.Is(err, ErrTooFewHashIDs) {
		t.Errorf("a bad hash_ids value matches ErrTooFewHashIDs: %v", err)
	}
}

// aiperfRows are the rows of AIPerf's trace-replay documentation: the
// format example, with an id more than its 655 tokens fill, and the
// custom trace.
const aiperfRows = `{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 1200, "output_length": 52, "hash_ids": [0, 1, 2]}
{"timestamp": 105, "input_length": 1800, "output_length": 26, "hash_ids": [0, 3, 4, 5]}
{"timestamp": 274, "input_length": 1300, "output_length": 52, "hash_ids": [1, 4, 6]}
{"timestamp": 300, "input_length": 100, "output_length": 5, "session_id": "s", "hash_ids": [7, 8, 9, 10]}
`

func TestFitRecordsAndTable(t *testing.T) {
	want := [][]int64{{0, 1}, {0, 1, 2}, {0, 3, 4, 5}, {1, 4, 6}, {7}}
	wantSurplus := Surplus{Rows: 2, IDs: 4, Most: 3, FirstLine: 1, BlockSize: 512}

	recs, err := ReadAll(strings.NewReader(aiperfRows), "doc.jsonl", ReadOptions{BlockSize: 512})
	if err != nil {
		t.Fatal(err)
	}
	if s := FitRecords(recs, 512); s != wantSurplus {
		t.Errorf("FitRecords surplus = %+v, want %+v", s, wantSurplus)
	}
	for i, r := range recs {
		if !reflect.DeepEqual(r.HashIDs, want[i]) {
			t.Errorf("FitRecords row %d: %v, want %v", i+1, r.HashIDs, want[i])
		}
	}

	table, err := ReadTable(strings.NewReader(aiperfRows), "doc.jsonl", ReadOptions{BlockSize: 512}, 0)
	if err != nil {
		t.Fatal(err)
	}
	fitted, s, err := FitTable(table, 512)
	if err != nil || s != wantSurplus {
		t.Fatalf("FitTable surplus = %+v, %v; want %+v", s, err, wantSurplus)
	}
	for i := range fitted.Len() {
		ids, _ := fitted.AppendHashIDs(nil, i)
		if !reflect.DeepEqual(ids, want[i]) {
			t.Errorf("FitTable row %d: %v, want %v", i+1, ids, want[i])
		}
		// Everything else is kept.
		got, orig := fitted.Record(i), table.Record(i)
		got.HashIDs, orig.HashIDs = nil, nil
		if !reflect.DeepEqual(got, orig) {
			t.Errorf("FitTable row %d: %+v, was %+v", i+1, got, orig)
		}
	}
	if again, s, _ := FitTable(fitted, 512); again != fitted || s.Rows != 0 {
		t.Errorf("FitTable of a fitting table = %p, %+v; want the table itself and no surplus", again, s)
	}
	if got := s.String(); got != "2 rows have more hash_ids than their input_length fills in 512-token blocks (the first at line 1): 4 ids to spare in all, at most 3 in one row" {
		t.Errorf("String() = %q", got)
	}
	if got := (Surplus{}).String(); got != "" {
		t.Errorf("no surplus: String() = %q, want empty", got)
	}
}
