package replay

import (
	"slices"
	"time"

	"github.com/kvload-exporter/kvload-exporter/idealcache"
)

// FleetSchedule is the order in which all replicas of a workload together
// send the rows of one pass: every shard's rows, not only this replica's.
// The theoretical cache model walks it, so that each replica's model holds
// what the whole fleet sent, and so that the model is a function of the
// schedule alone rather than of what this process happened to send.
//
// The order is idealcache.FleetOrder of the plan's pass: rows by nominal
// time, a later turn placed from its predecessor, ties in schedule order.
// The offline capacity curve walks the same order (Plan.FleetOrder).
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

// FleetOrder returns the rows of one pass in the fleet's order, the order
// in which every cache model of the plan walks them: for a tool that
// models the same cache offline (analyze --capacity-curve).
func (pl *Plan) FleetOrder() []int32 {
	pl.fleetOnce.Do(pl.buildFleetOrder)
	return slices.Clone(pl.fleet.order)
}

// buildFleetOrder sorts the rows of a pass by nominal time, once per plan.
func (pl *Plan) buildFleetOrder() {
	o := idealcache.FleetOrder(planPass{pl})
	pl.fleet = fleetOrder{order: o.Rows, rank: o.Rank, rowConv: o.Conv}
}

// planPass is a plan's pass as idealcache.FleetOrder reads it.
type planPass struct{ pl *Plan }

func (p planPass) Len() int           { return p.pl.rows.Len() }
func (p planPass) Conversations() int { return len(p.pl.convs) }

func (p planPass) FirstTurn(conv int) (row int, due time.Duration) {
	c := p.pl.convs[conv]
	return int(c.first), c.due
}

func (p planPass) NextTurn(row int) int { return int(p.pl.next[row]) }

func (p planPass) Timed(row int) (time.Duration, bool) {
	if !p.pl.timedTurn(row) {
		return 0, false
	}
	return p.pl.rowDue(row), true
}

func (p planPass) Delay(row int) time.Duration { return p.pl.delay(row) }

// Len is the number of rows in a pass.
func (s *FleetSchedule) Len() int { return len(s.order) }

// owns tells whether row is in this replica's shard.
func (s *FleetSchedule) owns(row int32) bool { return s.shard.Owns(int(s.rowConv[row])) }
