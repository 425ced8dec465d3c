package replay

import (
	"fmt"
	"testing"
)

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
