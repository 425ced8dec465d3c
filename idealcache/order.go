package idealcache

import (
	"cmp"
	"slices"
	"time"
)

// Pass is one pass of a schedule, as the fleet order reads it: rows
// numbered from 0 to Len()−1, grouped into conversations numbered in
// schedule order, every row in exactly one. replay.Plan is the schedule
// (the trace's timestamps, or generated arrivals) and says what each
// method returns.
type Pass interface {
	Len() int           // rows in the pass
	Conversations() int // conversations in the pass
	// FirstTurn is conversation conv's first row and when it is due.
	FirstTurn(conv int) (row int, due time.Duration)
	// NextTurn is the row after row in its conversation, or -1.
	NextTurn(row int) int
	// Timed is a later turn's own due time, where it goes at one.
	Timed(row int) (due time.Duration, ok bool)
	// Delay is how long a later turn without its own due time waits
	// after its predecessor.
	Delay(row int) time.Duration
}

// Order is the fleet's order of one pass: the order in which every
// replica together sends its rows, and so the order in which the ideal
// cache of a target sees them.
type Order struct {
	Rows []int32 // the pass's rows in that order
	Rank []int32 // row → its place in Rows
	Conv []int32 // row → its conversation
}

// FleetOrder sorts the rows of p by nominal time: a conversation's first
// turn at its due time, a later turn with its own due time at that but
// never before its predecessor, and one without its delay after its
// predecessor, as if the server answered at once. Ties keep schedule
// order: by conversation, then by turn. The order is a function of the
// schedule alone, not of what a replica happened to send, so every
// replica and every restart of the fleet agrees on it.
func FleetOrder(p Pass) Order {
	type entry struct {
		at         time.Duration
		conv, turn int32
		row        int32
	}
	n := p.Len()
	entries := make([]entry, 0, n)
	conv := make([]int32, n)
	for k := range p.Conversations() {
		row, at := p.FirstTurn(k)
		for turn := 0; row >= 0; turn++ {
			if turn > 0 {
				if due, ok := p.Timed(row); ok {
					at = max(at, due)
				} else {
					at += p.Delay(row)
				}
			}
			entries = append(entries, entry{at: at, conv: int32(k), turn: int32(turn), row: int32(row)})
			conv[row] = int32(k)
			row = p.NextTurn(row)
		}
	}
	slices.SortFunc(entries, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.conv, b.conv), cmp.Compare(a.turn, b.turn))
	})
	o := Order{Rows: make([]int32, len(entries)), Rank: make([]int32, n), Conv: conv}
	for i, e := range entries {
		o.Rows[i] = e.row
		o.Rank[e.row] = int32(i)
	}
	return o
}
