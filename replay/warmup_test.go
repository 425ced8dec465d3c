package replay

import (
	"container/list"
	"fmt"
	"testing"
)

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
