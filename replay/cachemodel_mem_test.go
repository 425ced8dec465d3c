package replay

import (
	"slices"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// TestIdealCacheBounded: a cache of bounded capacity holds a bounded number
// of blocks whatever the requests, including blocks that weigh nothing.
func TestIdealCacheBounded(t *testing.T) {
	for _, tc := range []struct {
		name          string
		trace, server int
		gran          engine.Granularity
		capacity      int
		lastTokens    int // tokens of each request's last block
		wantMax       int
	}{
		{"whole blocks", 512, 16, engine.GranularityBlock, 640, 512, 640},
		{"short last blocks weigh nothing", 512, 16, engine.GranularityBlock, 640, 5, 640},
		{"server blocks larger than trace blocks", 512, 2048, engine.GranularityBlock, 10, 512, 40},
		{"token granularity", 512, 1, engine.GranularityToken, 4096, 3, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newIdealCache(CacheParams{TraceBlock: tc.trace, ServerBlock: tc.server, CapacityBlocks: tc.capacity, Granularity: tc.gran})
			next := int64(0)
			for range 5000 {
				ids := make([]int64, 4) // four fresh blocks: nothing is ever hit
				for i := range ids {
					ids[i] = next
					next++
				}
				c.visit(0, ids, 3*tc.trace+tc.lastTokens, true, false)
				if c.lru.Len() > tc.wantMax || len(c.index) > tc.wantMax {
					t.Fatalf("after %d blocks: %d held, %d indexed, want at most %d", next, c.lru.Len(), len(c.index), tc.wantMax)
				}
			}
		})
	}
}

// TestCacheModelWarmUpHoldsNoRows: a model started deep into a big pass
// simulates the rows before its start but keeps nothing of them: no
// request can ask about them.
func TestCacheModelWarmUpHoldsNoRows(t *testing.T) {
	const n = 20000
	rows := make([]trace.Record, n)
	for i := range rows {
		rows[i] = trace.Record{Timestamp: trace.Ptr(float64(i)), InputLength: trace.Ptr(600), HashIDs: []int64{0, int64(i + 1)}}
	}
	p, err := NewPacer(rows, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Seek(TracePosition{Pass: 7, Conv: n - 100}); err != nil {
		t.Fatal(err)
	}
	m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 1 << 10})
	for k := range 3 {
		it, ok := p.Next()
		if !ok {
			t.Fatal("no row")
		}
		// Asked out of order: the rows skipped are kept, and only they.
		if k == 0 {
			if it, ok = p.Next(); !ok {
				t.Fatal("no row")
			}
		}
		m.Accept(it)
	}
	if got := len(m.ahead); got > 1 {
		t.Errorf("%d rows kept after the warm-up, want at most 1 (the one skipped)", got)
	}
	if bound := m.cache.round.MaxEntries(m.cache.p.CapacityBlocks); m.cache.lru.Len() > bound {
		t.Errorf("%d blocks held, bound %d", m.cache.lru.Len(), bound)
	}
}

// TestCacheModelShortWarmUpSameAnswers: a model that warms up on the last
// rows only (those whose blocks fill its capacity and its profile's
// ceiling) answers every request, and gives every profile, as one that
// warmed up on the whole pass before.
func TestCacheModelShortWarmUpSameAnswers(t *testing.T) {
	rows := wlTestReadSlice(t, 3000)
	for _, tc := range []struct {
		name   string
		params CacheParams
		loop   LoopMode
	}{
		// A ceiling of 1 token is raised to twice the capacity.
		{"vllm blocks, fresh", CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 4096, CeilingTokens: 1}, LoopFresh},
		{"vllm blocks, repeat", CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 4096, CeilingTokens: 1}, LoopRepeat},
		{"sglang tokens, repeat", CacheParams{TraceBlock: 512, ServerBlock: 1, CapacityBlocks: 200000, Granularity: engine.GranularityToken, CeilingTokens: 1}, LoopRepeat},
		{"unbounded, fresh", CacheParams{TraceBlock: 512, ServerBlock: 16}, LoopFresh},
		{"unbounded, fresh, small ceiling", CacheParams{TraceBlock: 512, ServerBlock: 16, CeilingTokens: 1 << 20}, LoopFresh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			models := make([]*CacheModel, 2)
			var items []PacerItem
			for k := range models {
				p, err := NewPacer(rows, PacerOptions{Loop: tc.loop})
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Seek(TracePosition{Pass: 4, Conv: 1500}); err != nil {
					t.Fatal(err)
				}
				models[k] = NewCacheModel(p, tc.params)
				if k == 1 {
					items = nil
					for len(items) < 800 {
						it, ok := p.Next()
						if !ok {
							t.Fatal("no row")
						}
						items = append(items, it)
					}
				}
			}
			full := models[1]
			if !(modelPos{pass: 3}).before(models[0].cur) && (models[0].cur != modelPos{pass: 4}) {
				t.Fatalf("the warm-up starts at %+v: not shortened", models[0].cur)
			}
			full.cur = modelPos{pass: 3} // the whole pass before, as before the shortcut
			hits, unknown, steps := 0, 0, 0
			for _, it := range items {
				a, ak, ap := models[0].AcceptProfile(it)
				b, bk, bp := full.AcceptProfile(it)
				if a != b || ak != bk {
					t.Fatalf("row %d of pass %d: %d (known %v) after the short warm-up, %d (known %v) after the whole one", it.Index, it.Pass, a, ak, b, bk)
				}
				if !slices.Equal(ap.Steps, bp.Steps) || ap.Known != bp.Known {
					t.Fatalf("row %d of pass %d: profile %+v after the short warm-up, %+v after the whole one", it.Index, it.Pass, ap, bp)
				}
				hits += a
				steps += len(ap.Steps)
				if !ak {
					unknown++
				}
			}
			if hits == 0 || unknown == 0 || steps == 0 {
				t.Errorf("%d tokens hit, %d answers unknown, %d profile steps: the case tests nothing", hits, unknown, steps)
			}
		})
	}
}

// TestCacheModelClosed: a closed model simulates nothing more and answers
// every question unknown.
func TestCacheModelClosed(t *testing.T) {
	rows := make([]trace.Record, 5000)
	for i := range rows {
		rows[i] = trace.Record{Timestamp: trace.Ptr(float64(i)), InputLength: trace.Ptr(600), HashIDs: []int64{0, int64(i + 1)}}
	}
	p, err := NewPacer(rows, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Seek(TracePosition{Pass: 2, Conv: 4000}); err != nil {
		t.Fatal(err)
	}
	m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16})
	it, _ := p.Next()
	m.Close()
	before := m.cur
	if got, known := m.Accept(it); got != 0 || known {
		t.Errorf("closed model answered %d (known %v)", got, known)
	}
	m.Reject(it)
	if m.cur != before || m.cache.lru.Len() != 0 {
		t.Errorf("closed model simulated: cursor %+v → %+v, %d blocks", before, m.cur, m.cache.lru.Len())
	}
}
