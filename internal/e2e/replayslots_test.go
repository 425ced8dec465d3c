package e2e

import (
	"sync"
	"testing"
)

// The end-to-end tests mostly wait on paced replays, so `make test-e2e`
// runs them side by side (-parallel), but a fast replay also keeps its
// engine busy tokenizing: at ten or more times a trace's speed it uses
// about 0.4 of a core (some 400k prompt tokens a second). e2eReplays
// admits two such replays at a time, as many as two cores serve without
// slowing the engines' answers enough to move what a pass reads. Tests
// that replay a few rows, or slowly, need little CPU and run beside them
// without a slot; those whose requests must reach a single-slot engine in
// the order sent, 100 ms apart, do not run in parallel with them at all
// (TestE2ECacheTruthPreamble).
var e2eReplays = make(chan struct{}, 2)

// e2eReplaysTaking makes a test that takes several slots take them all
// before another test takes any, so that two such tests cannot each hold
// a part and wait for the rest.
var e2eReplaysTaking sync.Mutex

// e2eReplaySlot waits for one of e2eReplays' slots and holds it until t
// and everything it started have stopped (cleanups registered later run
// first). Call it after t.Parallel, so that a test waiting for its turn
// holds no slot.
func e2eReplaySlot(t *testing.T) {
	t.Helper()
	e2eReplaysTake(t, 1)
}

// e2eReplayAlone is e2eReplaySlot for a replay that must have the CPU to
// itself: one whose band rests on the engine seeing requests nearly in the
// order sent (a bounded cache's evictions, two replicas' interleaving),
// which another fast replay in this process can disturb.
func e2eReplayAlone(t *testing.T) {
	t.Helper()
	e2eReplaysTake(t, cap(e2eReplays))
}

func e2eReplaysTake(t *testing.T, n int) {
	t.Helper()
	e2eReplaysTaking.Lock()
	for range n {
		e2eReplays <- struct{}{}
	}
	e2eReplaysTaking.Unlock()
	t.Cleanup(func() {
		for range n {
			<-e2eReplays
		}
	})
}
