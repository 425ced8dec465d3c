package replay

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// TestCapacityProfileSteps checks a profile's arithmetic on a hand-made
// case: distances in tokens, the running maximum, the engine's rounding.
func TestCapacityProfileSteps(t *testing.T) {
	rows := []trace.Record{
		{Timestamp: trace.Ptr(0.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(1.0), InputLength: trace.Ptr(512), HashIDs: []int64{2}},
		{Timestamp: trace.Ptr(2.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(3.0), InputLength: trace.Ptr(1100), HashIDs: []int64{0, 3, 4}},
		// Block 1 alone is another block than block 1 behind block 0:
		// a block is keyed by its chain.
		{Timestamp: trace.Ptr(4.0), InputLength: trace.Ptr(512), HashIDs: []int64{1}},
		{Timestamp: trace.Ptr(5.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
	}
	p, err := NewPacer(rows, PacerOptions{Loop: LoopOnce})
	if err != nil {
		t.Fatal(err)
	}
	m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16})
	want := [][]CapacityStep{
		nil,
		nil,
		// Stack before row 2, most recent first: 2, 0, 1 (512 tokens
		// each). Block 0 is 1,024 tokens deep, block 1 1,536; the whole
		// prompt is floor(1023/16)·16.
		{{Capacity: 1024, Tokens: 512}, {Capacity: 1536, Tokens: 1008}},
		// Stack: 0, 1, 2. Block 0 at 512; block 3 is new.
		{{Capacity: 512, Tokens: 512}},
		// Stack: 0, 3, 4 (76 tokens: 64 in whole blocks), 0·1, 2.
		// Block 1 as a first block is new.
		nil,
		// Stack: 1, 0, 3, 4, 0·1, 2. Block 0 at 1,024, block 1 behind
		// it at 512+512+512+64+512.
		{{Capacity: 1024, Tokens: 512}, {Capacity: 2112, Tokens: 1008}},
	}
	for row, w := range want {
		tokens, known, prof := m.AcceptProfile(PacerItem{Index: row})
		if !known || !prof.Known {
			t.Errorf("row %d: unknown (%v, profile %v)", row, known, prof.Known)
		}
		if !slices.Equal(prof.Steps, w) {
			t.Errorf("row %d: steps %v, want %v", row, prof.Steps, w)
		}
		if got := prof.At(1 << 30); got != tokens {
			t.Errorf("row %d: %d tokens at the ceiling, the unbounded model says %d", row, got, tokens)
		}
	}
}

// TestCapacityProfileMatchesBoundedModels: a request's profile gives, at
// each capacity, what the model bounded at that capacity answers, fed the
// same rows: on the two shared traces, at block and token granularity, from
// the start of a pass and from the middle of one (after a warm-up, where
// some answers are unknown).
func TestCapacityProfileMatchesBoundedModels(t *testing.T) {
	traces := []struct {
		name string
		rows []trace.Record
	}{
		{"conversation", wlTestReadSlice(t, 2500)},
		{"synthetic", readSharedTrace(t, "synthetic_trace.jsonl", 1500)},
	}
	params := []struct {
		name       string
		p          CacheParams
		capacities []int // in server blocks
	}{
		{"vllm, 16-token blocks", CacheParams{TraceBlock: 512, ServerBlock: 16}, []int{1, 100, 2000, 20000, 150000}},
		{"sglang, token pages", CacheParams{TraceBlock: 512, ServerBlock: 1, Granularity: engine.GranularityToken}, []int{700, 40000, 300000, 2000000}},
		{"trtllm, 32-token blocks, partial reuse", CacheParams{TraceBlock: 512, ServerBlock: 32, Granularity: engine.GranularityToken}, []int{50, 3000, 60000}},
		{"server blocks larger than trace blocks", CacheParams{TraceBlock: 512, ServerBlock: 1024}, []int{3, 300, 3000}},
	}
	starts := []struct {
		name string
		loop LoopMode
		pos  TracePosition
	}{
		{"fresh, from the start", LoopFresh, TracePosition{}},
		{"repeat, mid-pass", LoopRepeat, TracePosition{Pass: 2, Conv: 700}},
	}
	for _, tr := range traces {
		for _, pp := range params {
			for _, st := range starts {
				t.Run(fmt.Sprintf("%s/%s/%s", tr.name, pp.name, st.name), func(t *testing.T) {
					checkProfileAgainstBounded(t, tr.rows, pp.p, pp.capacities, st.loop, st.pos)
				})
			}
		}
	}
}

func checkProfileAgainstBounded(t *testing.T, rows []trace.Record, params CacheParams, capacities []int, loop LoopMode, pos TracePosition) {
	t.Helper()
	newModel := func(p CacheParams) (*CacheModel, *Pacer) {
		pacer, err := NewPacer(rows, PacerOptions{Loop: loop})
		if err != nil {
			t.Fatal(err)
		}
		if err := pacer.Seek(pos); err != nil {
			t.Fatal(err)
		}
		return NewCacheModel(pacer, p), pacer
	}
	// The profile's model is bounded too, below the largest capacity, so
	// that its own warm-up is cut short; its ceiling covers every
	// capacity checked.
	withProfile := params
	withProfile.CapacityBlocks = capacities[len(capacities)/2]
	withProfile.CeilingTokens = int64(capacities[len(capacities)-1]) * int64(params.ServerBlock)
	profiled, pacer := newModel(withProfile)
	bounded := make([]*CacheModel, len(capacities))
	for i, c := range capacities {
		p := params
		p.CapacityBlocks = c
		bounded[i], _ = newModel(p)
	}
	var hits, differ, unknown int
	for range len(rows) {
		it, ok := pacer.Next()
		if !ok {
			t.Fatal("no row")
		}
		_, _, prof := profiled.AcceptProfile(it)
		first := -1
		for i, c := range capacities {
			want, known := bounded[i].Accept(it)
			got := prof.At(int64(c) * int64(params.ServerBlock))
			if got != want {
				t.Fatalf("row %d of pass %d, %d blocks: the profile says %d tokens, the bounded model %d (profile %v)", it.Index, it.Pass, c, got, want, prof)
			}
			if prof.Known && !known {
				t.Fatalf("row %d of pass %d, %d blocks: the profile is known, the bounded model's answer unknown", it.Index, it.Pass, c)
			}
			hits += want
			if first >= 0 && want != first {
				differ++
			}
			first = want
		}
		if !prof.Known {
			unknown++
		}
	}
	t.Logf("%d tokens hit over all capacities, %d rows whose hit grows with capacity, %d profiles unknown", hits, differ, unknown)
	if hits == 0 || differ == 0 {
		t.Errorf("%d tokens hit, %d hits that grow with the capacity: the case tests nothing", hits, differ)
	}
	if pos.Pass > 0 && unknown == 0 {
		t.Errorf("no profile unknown after a warm-up: the case tests nothing")
	}
}

// TestCapacityProfileColdStart: a profile that rests on a block only rows
// assumed sent touched is unknown, at every capacity, as the answer at the
// configured one is.
func TestCapacityProfileColdStart(t *testing.T) {
	rows := []trace.Record{
		{Timestamp: trace.Ptr(0.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(1.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(2.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(3.0), InputLength: trace.Ptr(1024), HashIDs: []int64{7, 8}},
	}
	p, err := NewPacer(rows, PacerOptions{Loop: LoopRepeat})
	if err != nil {
		t.Fatal(err)
	}
	// Started at row 1 of pass 3: row 0, and pass 2's rows, are assumed.
	if err := p.Seek(TracePosition{Pass: 3, Conv: 1}); err != nil {
		t.Fatal(err)
	}
	// A cache of one block at the configured capacity: the profile sees
	// further than the answer.
	m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 32})
	for _, tt := range []struct {
		row          int
		known        bool // the answer at 32 blocks
		profileKnown bool
	}{
		{1, false, false}, // rests on row 0, assumed
		{2, true, true},   // row 1 was really sent
		// Blocks 7 and 8: only pass 2's row 3 touched them. The ideal
		// cache of one block has long evicted them (a certain miss);
		// the profile sees them at a larger capacity.
		{3, true, false},
	} {
		_, known, prof := m.AcceptProfile(PacerItem{Pass: 3, Index: tt.row})
		if known != tt.known || prof.Known != tt.profileKnown {
			t.Errorf("row %d: known %v, profile known %v (%v); want %v and %v", tt.row, known, prof.Known, prof.Steps, tt.known, tt.profileKnown)
		}
	}
}

// TestCapacityProfileReject: a request the server never got takes its
// blocks out of the profile too, unless a later request used them since.
func TestCapacityProfileReject(t *testing.T) {
	rows := []trace.Record{
		{Timestamp: trace.Ptr(0.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(1.0), InputLength: trace.Ptr(512), HashIDs: []int64{5}},
		{Timestamp: trace.Ptr(2.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(3.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 2}},
	}
	type accepted struct {
		row  int
		want []CapacityStep
	}
	// Row 2 after rows 0 and 1: blocks 0 and 1 at 1,024 and 1,536 tokens
	// (block 5 in between); row 3 after row 2: block 0 at 512.
	again := []CapacityStep{{Capacity: 1024, Tokens: 512}, {Capacity: 1536, Tokens: 1008}}
	next := []CapacityStep{{Capacity: 512, Tokens: 512}}
	tests := []struct {
		name   string
		reject int // after this many of steps
		steps  []accepted
	}{
		{"all accepted", -1, []accepted{{0, nil}, {1, nil}, {2, again}, {3, next}}},
		{"rejected before it was simulated", 0, []accepted{{1, nil}, {2, nil}, {3, next}}},
		{"rejected once simulated ahead, unused since", 1, []accepted{{1, nil}, {2, nil}, {3, next}}},
		{"rejected after a later row used its blocks", 1, []accepted{{2, again}, {1, nil}, {3, next}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPacer(rows, PacerOptions{Loop: LoopOnce})
			if err != nil {
				t.Fatal(err)
			}
			m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16})
			for i, a := range tt.steps {
				if i == tt.reject {
					m.Reject(PacerItem{Index: 0})
				}
				tokens, _, prof := m.AcceptProfile(PacerItem{Index: a.row})
				if !slices.Equal(prof.Steps, a.want) {
					t.Errorf("row %d: steps %v, want %v", a.row, prof.Steps, a.want)
				}
				if got := prof.At(1 << 30); got != tokens {
					t.Errorf("row %d: %d tokens at the ceiling, the unbounded model says %d", a.row, got, tokens)
				}
			}
		})
	}
}

// readSharedTrace reads the first n rows of a shared trace.
func readSharedTrace(t testing.TB, name string, n int) []trace.Record {
	t.Helper()
	recs, err := trace.ReadFile("../testdata/mooncake/"+name, trace.ReadOptions{BlockSize: 512})
	if err != nil {
		t.Fatalf("the Mooncake traces are missing from testdata/mooncake: %v", err)
	}
	return recs[:min(n, len(recs)):min(n, len(recs))]
}
