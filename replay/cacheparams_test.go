package replay

import (
	"context"
	"errors"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/openai"
)

// TestWorkloadSetCache: a model set while the workload runs answers every
// request from then on, and its warm-up covers the rows sent before it;
// the model it replaced is closed. Four rows of one 100-token block each,
// looped with repeat: an unbounded model hits every row from the second
// pass on (96 tokens in 16-token blocks); one of 6 blocks, a single row,
// never does.
func TestWorkloadSetCache(t *testing.T) {
	recs := pacerTestTimestamps(0, 10, 20, 30)
	p, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
	if err != nil {
		t.Fatal(err)
	}
	params := CacheParams{TraceBlock: 512, ServerBlock: 16}
	first := NewCacheModel(p, params)
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) { res.Outcome = openai.OutcomeSuccess }}
	obs := newWLTestObserver()
	clock := newWLTestClock(true)
	t0 := clock.Now()
	w, err := NewWorkload(WorkloadConfig{Name: "swap", Target: "fake", MaxInFlight: 16, Clock: clock, Cache: first},
		p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	answered := func(n int) func(*wlTestObserver) bool {
		return func(o *wlTestObserver) bool { return len(o.finished) >= n }
	}
	var second *CacheModel
	obs.onPass = func(pass int) {
		// The jumping clock would let the dispatcher run passes ahead of
		// the answers; the model forgets the rows of a pass two behind.
		obs.waitUntil(answered(4 * (pass + 1)))
		switch pass {
		case 1: // every row of passes 0 and 1 answered by the first model
			// As the daemon does: a pacer of the same trace at the
			// workload's position.
			at, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
			if err == nil {
				err = at.Seek(w.Position())
			}
			if err != nil {
				t.Error(err)
				return
			}
			smaller := params
			smaller.CapacityBlocks = 6
			second = NewCacheModel(at, smaller)
			w.SetCache(second)
		case 2:
			cancel()
		}
	}
	if err := w.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if w.Cache() != second || second.Params().CapacityBlocks != 6 {
		t.Fatalf("the workload's model is not the one set last")
	}
	if !first.closed.Load() {
		t.Error("the replaced model is not closed")
	}
	want := []int{0, 96, 0} // theoretical cached tokens of every row, by pass
	for _, r := range obs.finished {
		pass := int(r.Scheduled.Sub(t0) / (40 * pacerTestTick)) // a pass is 40 ms
		if pass > 2 {
			continue
		}
		if !r.TheoreticalKnown || r.TheoreticalCachedTokens != want[pass] {
			t.Errorf("pass %d, row %d: theoretical %d (known %v), want %d", pass, r.TraceHashIDs[0], r.TheoreticalCachedTokens, r.TheoreticalKnown, want[pass])
		}
	}
}
