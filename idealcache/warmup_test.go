package idealcache

import (
	"slices"
	"testing"
)

// TestWarmUpDecide: how answers move the decision. Each answer is a
// request's warm and cold theoretical values and the cached tokens the
// server reported; want is the world after each answer.
func TestWarmUpDecide(t *testing.T) {
	type ans struct{ warm, cold, cached int }
	repeat := func(n int, a ans) []ans {
		out := make([]ans, n)
		for i := range out {
			out[i] = a
		}
		return out
	}
	const (
		U = WarmUpUndecided
		W = WarmUpWarm
		C = WarmUpCold
	)
	tests := []struct {
		name    string
		answers []ans
		want    []WarmUpWorld
	}{
		{"warm: the server hit what was assumed", repeat(8, ans{4096, 512, 4096}),
			[]WarmUpWorld{U, U, U, U, U, U, U, W}},
		{"cold: the server hit only what was sent", repeat(8, ans{4096, 512, 512}),
			[]WarmUpWorld{U, U, U, U, U, U, U, C}},
		{"cold with a preamble of 9 tokens", repeat(8, ans{1024, 0, 9}),
			[]WarmUpWorld{U, U, U, U, U, U, U, C}},
		{"warm with a chat header, and block rounding", repeat(8, ans{2032, 496, 2032 + 16}),
			[]WarmUpWorld{U, U, U, U, U, U, U, W}},
		{"undecided: too few answers", repeat(7, ans{4096, 512, 4096}),
			[]WarmUpWorld{U, U, U, U, U, U, U}},
		{"gaps too small to tell are no evidence", repeat(10, ans{612, 512, 612}),
			[]WarmUpWorld{U, U, U, U, U, U, U, U, U, U}},
		{"answers between the two values are no evidence", repeat(10, ans{4096, 512, 2304}),
			[]WarmUpWorld{U, U, U, U, U, U, U, U, U, U}},
		{"mixed: no clear majority", []ans{
			{4096, 512, 4096}, {4096, 512, 512}, {4096, 512, 4096}, {4096, 512, 512},
			{4096, 512, 4096}, {4096, 512, 4096}, {4096, 512, 4096}, {4096, 512, 512},
			{4096, 512, 4096}, {4096, 512, 4096},
		}, []WarmUpWorld{U, U, U, U, U, U, U, U, U, U}},
		{"by tokens, not by count: a big warm answer outweighs small cold ones", append(repeat(7, ans{800, 512, 512}), ans{60000, 0, 60000}),
			[]WarmUpWorld{U, U, U, U, U, U, U, W}},
		{"taken back when later answers disagree", append(repeat(8, ans{4096, 512, 4096}), ans{4096, 512, 512}),
			[]WarmUpWorld{U, U, U, U, U, U, U, W, U}},
		{"and decided again when more agree", append(repeat(8, ans{4096, 512, 4096}), ans{4096, 512, 512}, ans{4096, 512, 4096}),
			[]WarmUpWorld{U, U, U, U, U, U, U, W, U, W}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := WarmUp{Learn: true}
			var changes []WarmUpWorld
			for i, a := range tt.answers {
				if d := w.Weigh(Admission{Tokens: a.warm, Cold: a.cold}, a.cached); d != nil {
					changes = append(changes, d.World)
				}
				if w.world != tt.want[i] {
					t.Fatalf("after answer %d %+v: %v, want %v", i, a, w.world, tt.want[i])
				}
			}
			// A change is reported exactly when the world changed.
			var want []WarmUpWorld
			prev := WarmUpUndecided
			for _, world := range tt.want {
				if world != prev {
					want = append(want, world)
				}
				prev = world
			}
			if !slices.Equal(changes, want) {
				t.Errorf("changes reported %v, want %v", changes, want)
			}
		})
	}
}

// TestWarmUpFrontier: requests with steps (where their hit ends for each
// frontier) decide a partial world when their answers agree on one
// frontier, and are then answered at it; answers that fit no frontier
// decide nothing.
func TestWarmUpFrontier(t *testing.T) {
	// A request's assumed blocks were last touched at visits 300, 200 and
	// 100 of the warm-up: a server holding from visit f on serves 512
	// tokens for f > 300, 1024 for 200 < f ≤ 300, 1536 for 100 < f ≤ 200
	// and 2048 (every block) for f ≤ 100.
	steps := []warmStep{{300, 512}, {200, 1024}, {100, 1536}}
	req := Admission{Tokens: 2048, Cold: 512, steps: steps}
	for _, tt := range []struct {
		name     string
		answers  []int // cached tokens, each for req
		world    WarmUpWorld
		frontier uint64 // when decided
		answer   int
	}{
		{"partial: held from between visits 200 and 300", []int{1024, 1024, 1030, 1024, 1024, 1024, 1024, 1024}, WarmUpPartial, 201, 1024},
		{"partial, one dissent in eleven", []int{1024, 1024, 1536, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, WarmUpPartial, 201, 1024},
		{"partial, one dissent in eight", []int{1024, 1024, 1536, 1024, 1024, 1024, 1024, 1024}, WarmUpUndecided, 0, 0},
		{"warm", []int{2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}, WarmUpWarm, 0, 2048},
		{"cold", []int{512, 512, 520, 512, 512, 512, 512, 512}, WarmUpCold, frontierCold, 512},
		{"no one frontier", []int{1024, 1536, 1024, 1536, 1024, 1536, 1024, 1536}, WarmUpUndecided, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := WarmUp{Learn: true}
			for _, cached := range tt.answers {
				w.Weigh(req, cached)
			}
			if w.world != tt.world || (tt.world != WarmUpUndecided && w.frontier != tt.frontier) {
				t.Fatalf("world %v at frontier %d, want %v at %d", w.world, w.frontier, tt.world, tt.frontier)
			}
			got, known := w.Answer(req)
			if known != (tt.world != WarmUpUndecided) || (known && got != tt.answer) {
				t.Errorf("answered %d (known %v), want %d", got, known, tt.answer)
			}
		})
	}
	// Another request, whose blocks were touched at 250 only: held from
	// frontier 201, its whole hit counts.
	w := WarmUp{Learn: true}
	for range 8 {
		w.Weigh(req, 1024)
	}
	if got, known := w.Answer(Admission{Tokens: 4096, Cold: 0, steps: []warmStep{{250, 0}}}); !known || got != 4096 {
		t.Errorf("a request resting on blocks touched after the frontier: %d (known %v), want 4096", got, known)
	}
	if got, _ := w.Answer(Admission{Tokens: 4096, Cold: 0, steps: []warmStep{{150, 0}}}); got != 0 {
		t.Errorf("a request resting on blocks touched before the frontier: %d, want 0", got)
	}
}

// TestWarmUpAnswer: what a request is answered in each world, and that a
// request whose two values agree is known whatever the world.
func TestWarmUpAnswer(t *testing.T) {
	for _, tt := range []struct {
		world      WarmUpWorld
		warm, cold int
		want       int
		known      bool
	}{
		{WarmUpUndecided, 4096, 512, 4096, false},
		{WarmUpWarm, 4096, 512, 4096, true},
		{WarmUpCold, 4096, 512, 512, true},
		{WarmUpUndecided, 1024, 1024, 1024, true},
		{WarmUpCold, 0, 0, 0, true},
	} {
		w := WarmUp{world: tt.world}
		if tt.world == WarmUpCold {
			w.frontier = frontierCold
		}
		got, known := w.Answer(Admission{Tokens: tt.warm, Cold: tt.cold})
		if got != tt.want || known != tt.known {
			t.Errorf("%v, warm %d, cold %d: %d (known %v), want %d (known %v)", tt.world, tt.warm, tt.cold, got, known, tt.want, tt.known)
		}
	}
}

// TestLookback: fed rows latest first, a bounded cache is full once the
// distinct blocks fed overflow its capacity (a block fed twice counts
// once), an unbounded one never; the profile once the distinct blocks
// outweigh its ceiling.
func TestLookback(t *testing.T) {
	for _, tt := range []struct {
		name        string
		capacity    int     // server blocks of 16 tokens
		ceiling     int64   // tokens
		rows        []int64 // one 512-token block each, latest first
		wantCache   []bool  // after each row
		wantProfile []bool
	}{
		{"bounded: 64 server blocks hold two trace blocks", 64, 0, []int64{0, 0, 1, 2},
			[]bool{false, false, false, true}, []bool{false, false, false, false}},
		{"unbounded: the profile's ceiling only", 0, 1024, []int64{0, 1, 1, 2},
			[]bool{false, false, false, false}, []bool{false, false, false, true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCache(Params{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: tt.capacity, CeilingTokens: tt.ceiling})
			l := NewLookback(NewProfile(c))
			for i, id := range tt.rows {
				l.Row(0, chainKeys([]int64{id}), 512)
				if got := l.CacheFull(); got != tt.wantCache[i] {
					t.Errorf("after row %d: cache full %v, want %v", i, got, tt.wantCache[i])
				}
				if got := l.ProfileFull(); got != tt.wantProfile[i] {
					t.Errorf("after row %d: profile full %v, want %v", i, got, tt.wantProfile[i])
				}
			}
		})
	}
}
