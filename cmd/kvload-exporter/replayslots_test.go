package main

import "testing"

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

// e2eReplaySlot waits for one of e2eReplays' slots and holds it until t
// and everything it started have stopped (cleanups registered later run
// first). Call it after t.Parallel, so that a test waiting for its turn
// holds no slot.
func e2eReplaySlot(t *testing.T) {
	t.Helper()
	e2eReplays <- struct{}{}
	t.Cleanup(func() { <-e2eReplays })
}
