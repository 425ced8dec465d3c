package replay

import "fmt"

// Shard selects one replica's share of a trace when several exporters
// replay the same workload against the same targets together.
//
// The unit of assignment is the conversation, so a session is never split
// between replicas (its turns depend on each other's completion). Conversation
// k in schedule order — sorted by first-turn timestamp, over the whole trace —
// belongs to replica k mod Count. Dealing them out round-robin in time order
// gives every replica every Count-th arrival, so each one carries about
// 1/Count of the request rate at every moment of the pass, not just on
// average; a hash of the session id would balance only statistically and
// could leave one replica with a burst. Every replica computes the same order
// from the same trace, so the shares cover each pass exactly once.
type Shard struct {
	Index int
	Count int
}

// orWhole maps the zero value to the single share of the whole trace.
func (s Shard) orWhole() Shard {
	if s == (Shard{}) {
		return Shard{Index: 0, Count: 1}
	}
	return s
}

// Validate reports a shard that no set of replicas could cover.
func (s Shard) Validate() error {
	if s.Count < 1 {
		return fmt.Errorf("shard count must be at least 1, got %d", s.Count)
	}
	if s.Index < 0 || s.Index >= s.Count {
		return fmt.Errorf("shard index must be in 0..%d, got %d", s.Count-1, s.Index)
	}
	return nil
}

// Owns tells whether conversation conv (schedule order) is in this share.
func (s Shard) Owns(conv int) bool { return conv%s.Count == s.Index }

// firstOwned returns the smallest owned conversation ordinal ≥ from.
func (s Shard) firstOwned(from int) int {
	return from + ((s.Index-from%s.Count)+s.Count)%s.Count
}
