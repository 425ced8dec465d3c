package replay

import (
	"container/list"
	"fmt"
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
			w := warmUp{learn: true}
			var changes []WarmUpWorld
			for i, a := range tt.answers {
				if d := w.weigh(admitted{tokens: a.warm, cold: a.cold}, a.cached); d != nil {
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
	req := admitted{tokens: 2048, cold: 512, steps: steps}
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
			w := warmUp{learn: true}
			for _, cached := range tt.answers {
				w.weigh(req, cached)
			}
			if w.world != tt.world || (tt.world != WarmUpUndecided && w.frontier != tt.frontier) {
				t.Fatalf("world %v at frontier %d, want %v at %d", w.world, w.frontier, tt.world, tt.frontier)
			}
			got, known := w.answer(req)
			if known != (tt.world != WarmUpUndecided) || (known && got != tt.answer) {
				t.Errorf("answered %d (known %v), want %d", got, known, tt.answer)
			}
		})
	}
	// Another request, whose blocks were touched at 250 only: held from
	// frontier 201, its whole hit counts.
	w := warmUp{learn: true}
	for range 8 {
		w.weigh(req, 1024)
	}
	if got, known := w.answer(admitted{tokens: 4096, cold: 0, steps: []warmStep{{250, 0}}}); !known || got != 4096 {
		t.Errorf("a request resting on blocks touched after the frontier: %d (known %v), want 4096", got, known)
	}
	if got, _ := w.answer(admitted{tokens: 4096, cold: 0, steps: []warmStep{{150, 0}}}); got != 0 {
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
		w := warmUp{world: tt.world}
		if tt.world == WarmUpCold {
			w.frontier = frontierCold
		}
		got, known := w.answer(admitted{tokens: tt.warm, cold: tt.cold})
		if got != tt.want || known != tt.known {
			t.Errorf("%v, warm %d, cold %d: %d (known %v), want %d (known %v)", tt.world, tt.warm, tt.cold, got, known, tt.want, tt.known)
		}
	}
}

// refEngine is the truth the model is checked against, written without
// the model's code: an unbounded prefix cache as a plain set of blocks,
// fed in the order requests reach it, answering as vLLM rounds (whole
// 16-token blocks, the last prompt token recomputed).
type refEngine map[[2]int64]bool

func (e refEngine) send(ns uint64, ids []int64, isl int) int {
	k := 0
	for _, id := range ids {
		if !e[[2]int64{int64(ns), id}] {
			break
		}
		k++
	}
	for _, id := range ids {
		e[[2]int64{int64(ns), id}] = true
	}
	return max(min(k*512, isl-1), 0) / 16 * 16
}

// TestCacheModelWarmUpWorlds: a model started with loop repeat halfway
// through a pass, next to a server that holds the passes before (warm), one
// that holds nothing (cold), or one that holds every other conversation of
// them (the exporter before dropped half its rows: mixed). Each request
// is answered by the reference engine, with a preamble of 9 tokens as
// llama.cpp reports. Warm and cold are decided within the first requests,
// once, rightly, and the pass the model joined is then known: every
// request the model says it knows reads what the engine served, and the
// unknown ones are a few percent of the pass's tokens (nearly all of them
// without the decision). Mixed is never decided: its requests stay
// unknown rather than wrong.
func TestCacheModelWarmUpWorlds(t *testing.T) {
	const preamble = 9
	recs := wlTestReadSlice(t, 2000)
	p, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
	if err != nil {
		t.Fatal(err)
	}
	var before, items []PacerItem
	for pass := 2; pass <= 4; pass++ {
		all := ownItems(t, p, pass)
		if pass < 4 {
			before = append(before, all...)
			continue
		}
		// The model starts halfway through pass 4: the first half is
		// the pass before as well.
		before = append(before, all[:len(all)/2]...)
		items = all[len(all)/2:]
	}
	for _, world := range []string{"warm", "cold", "mixed"} {
		t.Run(world, func(t *testing.T) {
			engine := refEngine{}
			for _, it := range before {
				if world == "warm" || (world == "mixed" && it.Conv%2 == 0) {
					engine.send(it.Namespace, recs[it.Index].HashIDs, recs[it.Index].ISL())
				}
			}
			start, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
			if err != nil {
				t.Fatal(err)
			}
			if err := start.Seek(TracePosition{Pass: items[0].Pass, Conv: items[0].Conv}); err != nil {
				t.Fatal(err)
			}
			m := NewCacheModel(start, CacheParams{TraceBlock: 512, ServerBlock: 16})
			var changes []WarmUpDecision
			m.LearnWarmUp(func(d WarmUpDecision) { changes = append(changes, d) })
			var all, unknown, wrong int
			for _, it := range items {
				truth := engine.send(it.Namespace, recs[it.Index].HashIDs, recs[it.Index].ISL())
				got, known := m.AcceptObserved(it, truth+preamble)
				isl := recs[it.Index].ISL()
				all += isl
				switch {
				case !known:
					unknown += isl
				case got != truth:
					wrong++
				}
			}
			share := float64(unknown) / float64(all)
			t.Logf("%s: decisions %+v; unknown %.4f of %d tokens, %d known answers wrong", world, changes, share, all, wrong)
			if wrong != 0 {
				t.Errorf("%d known answers differ from what the engine served", wrong)
			}
			switch world {
			case "mixed":
				if len(changes) != 0 || m.WarmUpWorld() != WarmUpUndecided || share < 0.5 {
					t.Errorf("decisions %+v, unknown %.4f: want none, and most of the pass unknown", changes, share)
				}
			default:
				if len(changes) != 1 || changes[0].World.String() != world {
					t.Errorf("decisions %+v, want one, %s", changes, world)
				}
				if share > 0.05 {
					t.Errorf("unknown %.4f of the pass's tokens, want at most 0.05", share)
				}
			}
		})
	}
}

// TestCacheModelWarmUpOnlyRepeat: with loop fresh the rows assumed sent
// stay unknown whatever the server answers, as they were.
func TestCacheModelWarmUpOnlyRepeat(t *testing.T) {
	recs := wlTestReadSlice(t, 2000)
	p, err := NewPacer(recs, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	items := ownItems(t, p, 4)
	if err := p.Seek(TracePosition{Pass: 4, Conv: items[len(items)/2].Conv}); err != nil {
		t.Fatal(err)
	}
	m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16})
	changed := false
	m.LearnWarmUp(func(WarmUpDecision) { changed = true })
	unknown := 0
	for _, it := range items[len(items)/2:] {
		warm, known := m.AcceptObserved(it, 0) // as a cold server answers
		if !known && warm > 0 {
			unknown++
		}
	}
	if changed || m.WarmUpWorld() != WarmUpUndecided || unknown == 0 {
		t.Errorf("loop fresh: decided %v (%v), %d answers unknown; want nothing decided and some unknown", changed, m.WarmUpWorld(), unknown)
	}
}

// TestCacheModelStartEmpty: a model started halfway through a pass next to
// an engine that holds nothing the fleet sent before (its requests carry a
// salt of their own) answers every request, known, as the engine serves
// it, for every loop mode; without StartEmpty the same start leaves the
// requests that rest on the rows before it unknown.
func TestCacheModelStartEmpty(t *testing.T) {
	recs := wlTestReadSlice(t, 2000)
	for _, loop := range []LoopMode{LoopRepeat, LoopFresh} {
		for _, empty := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, start empty %v", loop, empty), func(t *testing.T) {
				p, err := NewPacer(recs, PacerOptions{Loop: loop})
				if err != nil {
					t.Fatal(err)
				}
				all := ownItems(t, p, 4)
				items := all[len(all)/2:]
				if err := p.Seek(TracePosition{Pass: 4, Conv: items[0].Conv}); err != nil {
					t.Fatal(err)
				}
				m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16})
				if empty {
					m.StartEmpty()
				}
				m.LearnWarmUp(nil)
				engine := refEngine{} // nothing sent before, under this salt
				var unknown, wrong int
				for _, it := range items {
					truth := engine.send(it.Namespace, recs[it.Index].HashIDs, recs[it.Index].ISL())
					got, known := m.AcceptObserved(it, truth)
					switch {
					case !known:
						unknown++
					case got != truth:
						wrong++
					}
				}
				t.Logf("%d requests: %d unknown, %d known and wrong", len(items), unknown, wrong)
				if wrong != 0 {
					t.Errorf("%d known answers differ from what the engine served", wrong)
				}
				if empty && unknown != 0 {
					t.Errorf("%d requests unknown, want none", unknown)
				}
				if !empty && unknown == 0 {
					t.Errorf("without StartEmpty no request was unknown: the test does not start where the warm-up matters")
				}
			})
		}
	}
}

// lruEngine is a reference prefix cache of capacity trace blocks (0 is
// unbounded), written without the model's code: blocks by (namespace, id)
// in LRU order, a request's first blocks the most recently used, answering
// in whole serverBlock-token blocks with the last prompt token recomputed.
type lruEngine struct {
	capacity, serverBlock int
	lru                   *list.List
	index                 map[[2]int64]*list.Element
}

func newLRUEngine(capacity, serverBlock int) *lruEngine {
	return &lruEngine{capacity: capacity, serverBlock: serverBlock, lru: list.New(), index: map[[2]int64]*list.Element{}}
}

func (e *lruEngine) send(ns uint64, ids []int64, isl int) int {
	k := 0
	for _, id := range ids {
		if _, ok := e.index[[2]int64{int64(ns), id}]; !ok {
			break
		}
		k++
	}
	for i := len(ids) - 1; i >= 0; i-- {
		key := [2]int64{int64(ns), ids[i]}
		if el, ok := e.index[key]; ok {
			e.lru.MoveToFront(el)
			continue
		}
		e.index[key] = e.lru.PushFront(key)
	}
	for e.capacity > 0 && e.lru.Len() > e.capacity {
		delete(e.index, e.lru.Remove(e.lru.Back()).([2]int64))
	}
	return max(min(k*512, isl-1), 0) / e.serverBlock * e.serverBlock
}

// TestCacheModelRestartAfterPartialPass: a replica joins a pass halfway and
// sends the rest of it; a replica restarted at the top of the next pass
// (a new model, loop repeat) finds the engine holding only the rows the
// one before it sent, half of what its warm-up assumed. On an unbounded
// engine, healthy, the answers fit one frontier: the pass is known for at
// least 80 % of its tokens and reads an efficiency of 0.93-1.05; so it is
// when the first replica joined at 80 % of a pass and the restart took a
// fiftieth of a pass, whose rows nobody sent. An engine whose cache holds
// half of what the model is told it holds must still read below 0.93.
func TestCacheModelRestartAfterPartialPass(t *testing.T) {
	const preamble = 9
	recs := wlTestReadSlice(t, 2000)
	distinct := map[int64]bool{}
	for _, r := range recs {
		for _, id := range r.HashIDs {
			distinct[id] = true
		}
	}
	p, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
	if err != nil {
		t.Fatal(err)
	}
	pass3, pass4 := ownItems(t, p, 3), ownItems(t, p, 4)
	for _, tc := range []struct {
		name           string
		join, gap      float64 // shares of a pass: the first replica's start, the rows before the second's
		engine, model  int     // capacities: trace blocks, server blocks (0 unbounded)
		serverBlock    int
		lo, hi         float64
		atLeastCovered float64
	}{
		{"unbounded, healthy", 0.5, 0, 0, 0, 16, 0.93, 1.05, 0.8},
		{"unbounded, healthy, a restart of a fiftieth of a pass", 0.8, 0.02, 0, 0, 16, 0.93, 1.05, 0.8},
		{"half the cache the model is told", 0.5, 0, len(distinct) / 2, len(distinct), 512, 0, 0.93, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := pass3[int(tc.join*float64(len(pass3))):]
			items := pass4[int(tc.gap*float64(len(pass4))):]
			engine := newLRUEngine(tc.engine, tc.serverBlock)
			for _, it := range before {
				engine.send(it.Namespace, recs[it.Index].HashIDs, recs[it.Index].ISL())
			}
			start, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
			if err != nil {
				t.Fatal(err)
			}
			if err := start.Seek(TracePosition{Pass: items[0].Pass, Conv: items[0].Conv}); err != nil {
				t.Fatal(err)
			}
			m := NewCacheModel(start, CacheParams{TraceBlock: 512, ServerBlock: tc.serverBlock, CapacityBlocks: tc.model})
			var changes []WarmUpWorld
			m.LearnWarmUp(func(d WarmUpDecision) { changes = append(changes, d.World) })
			var all, known, served, theoretical int
			for _, it := range items {
				truth := engine.send(it.Namespace, recs[it.Index].HashIDs, recs[it.Index].ISL())
				got, ok := m.AcceptObserved(it, truth+preamble)
				isl := recs[it.Index].ISL()
				all += isl
				if ok {
					known += isl
					served += truth
					theoretical += got
				}
			}
			coverage, efficiency := float64(known)/float64(all), float64(served)/float64(theoretical)
			t.Logf("decisions %v; coverage %.4f of %d tokens, efficiency %.4f", changes, coverage, all, efficiency)
			if coverage < tc.atLeastCovered {
				t.Errorf("coverage %.4f, want at least %.2f", coverage, tc.atLeastCovered)
			}
			if known > 0 && !(efficiency >= tc.lo && efficiency <= tc.hi) {
				t.Errorf("efficiency %.4f, want within [%.2f, %.2f]", efficiency, tc.lo, tc.hi)
			}
			if tc.lo == 0 && known == 0 {
				t.Errorf("nothing known: the smaller cache is not caught")
			}
		})
	}
}
