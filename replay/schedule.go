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
//
// The order itself belongs to the Plan and is shared by every pacer of the
// trace; a FleetSchedule adds only the shard and the namespaces.
type FleetSchedule struct {
	*fleetOrder
	shard Shard
	ns    func(pass int) uint64
}

// fleetOrder is the nominal order of one pass of a plan.
type fleetOrder struct {
	order   []int32 // rows in nominal order
	rank    []int32 // row → its position in order
	rowConv []int32 // row → its conversation in schedule order
}

// FleetSchedule returns the fleet's order of one pass. It does not move
// the cursor.
func (p *Pacer) FleetSchedule() *FleetSchedule {
	pl := p.plan
	pl.fleetOnce.Do(pl.buildFleetOrder)
	return &FleetSchedule{fleetOrder: &pl.fleet, shard: p.shard, ns: p.Namespace}
}

// buildFleetOrder sorts the rows of a pass by nominal time, once per plan.
func (pl *Plan) buildFleetOrder() {
	type entry struct {
		at         time.Duration
		conv, turn int32
		row        int32
	}
	n := pl.rows.Len()
	entries := make([]entry, 0, n)
	rowConv := make([]int32, n)
	for k, c := range pl.convs {
		at := c.due
		row := int(c.first)
		for turn := 0; row >= 0; turn++ {
			if turn > 0 {
				if pl.timedTurn(row) {
					at = max(at, pl.rowDue(row))
				} else {
					at += pl.delay(row)
				}
			}
			entries = append(entries, entry{at: at, conv: int32(k), turn: int32(turn), row: int32(row)})
			rowConv[row] = int32(k)
			row = int(pl.next[row])
		}
	}
	slices.SortFunc(entries, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.conv, b.conv), cmp.Compare(a.turn, b.turn))
	})
	pl.fleet = fleetOrder{order: make([]int32, len(entries)), rank: make([]int32, n), rowConv: rowConv}
	for i, e := range entries {
		pl.fleet.order[i] = e.row
		pl.fleet.rank[e.row] = int32(i)
	}
}

// Len is the number of rows in a pass.
func (s *FleetSchedule) Len() int { return len(s.order) }

// owns tells whether row is in this replica's shard.
func (s *FleetSchedule) owns(row int32) bool { return s.shard.Owns(int(s.rowConv[row])) }
