package replay

import (
	"cmp"
	"slices"
	"time"
)

// FleetSchedule is the order in which all replicas of a workload together
// send the rows of one pass: every shard's rows, not only this replica's.
// The theoretical cache model walks it, so that each replica's model holds
// what the whole fleet sent, and so that the model is a function of the
// schedule alone rather than of what this process happened to send.
//
// A row's nominal time is its due time; a later turn of a conversation
// without a timestamp is placed at its predecessor's nominal time plus its
// delay, as if the server answered instantly, and a timed later turn never
// before its predecessor. Ties keep schedule order (conversation, then turn).
type FleetSchedule struct {
	order []int32 // rows in nominal order
	rank  []int32 // row → its position in order
	owned []bool  // row → in this replica's shard
	ns    func(pass int) uint64
}

// FleetSchedule returns the fleet's order of one pass. It does not move
// the cursor.
func (p *Pacer) FleetSchedule() *FleetSchedule {
	type entry struct {
		at         time.Duration
		conv, turn int32
		row        int32
	}
	entries := make([]entry, 0, len(p.records))
	owned := make([]bool, len(p.records))
	for k, c := range p.convs {
		at := c.due
		row := c.first
		for turn := 0; row >= 0; turn++ {
			if turn > 0 {
				if p.records[row].Timestamp != nil {
					at = max(at, p.rowDue[row])
				} else {
					at += p.Delay(row)
				}
			}
			entries = append(entries, entry{at: at, conv: int32(k), turn: int32(turn), row: int32(row)})
			owned[row] = p.shard.Owns(k)
			row = int(p.next[row])
		}
	}
	slices.SortFunc(entries, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.conv, b.conv), cmp.Compare(a.turn, b.turn))
	})
	s := &FleetSchedule{
		order: make([]int32, len(entries)),
		rank:  make([]int32, len(p.records)),
		owned: owned,
		ns:    p.Namespace,
	}
	for i, e := range entries {
		s.order[i] = e.row
		s.rank[e.row] = int32(i)
	}
	return s
}

// Len is the number of rows in a pass.
func (s *FleetSchedule) Len() int { return len(s.order) }
