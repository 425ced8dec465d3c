package synth

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// ReplayOrder returns the rows of one pass in the order the replay's cache
// model walks them (replay.FleetSchedule): by nominal time, where a row
// without a session_id is a conversation of its own, the rows sharing a
// session_id are the turns of one conversation in file order, a later turn
// without a timestamp comes its delay after its predecessor and a timed one
// never before it, and ties keep the order of the conversations' first
// turns, then of the turns. For a plain Mooncake trace that is timestamp
// order, ties in file order. file names the trace in errors: a
// conversation's first turn needs a timestamp, and a delay must not be
// negative, as for the replay.
//
// The order is computed here, apart from the replay, because synth sits
// below replay in the import direction; TestCapacityCurveMatchesReplayModel
// in cmd/kvload-exporter holds the two to the same answer.
func ReplayOrder(rows *trace.Table, file string) ([]int32, error) {
	n := rows.Len()
	if n == 0 {
		return nil, fmt.Errorf("%s: %w", file, trace.ErrEmpty)
	}
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("%s: %d rows is more than supported", file, n)
	}
	firsts, next, err := conversations(rows, file)
	if err != nil {
		return nil, err
	}
	zero := math.Inf(1)
	for _, r := range firsts {
		ts, _ := rows.Timestamp(int(r))
		zero = min(zero, ts)
	}
	due := func(r int) (time.Duration, error) {
		ts, _ := rows.Timestamp(r)
		ms := ts - zero
		if math.IsNaN(ms) || math.Abs(ms) > float64(math.MaxInt64/2)/1e6 {
			return 0, rowError(rows, file, r, fmt.Errorf("timestamp %v is out of range", ts))
		}
		return time.Duration(math.Round(ms * 1e6)), nil
	}
	type entry struct {
		at         time.Duration
		conv, turn int32
		row        int32
	}
	convs := make([]convStart, len(firsts))
	for k, r := range firsts {
		at, err := due(int(r))
		if err != nil {
			return nil, err
		}
		convs[k].at, convs[k].first = at, r
	}
	slices.SortStableFunc(convs, func(a, b convStart) int { return cmp.Compare(a.at, b.at) })
	entries := make([]entry, 0, n)
	for k, c := range convs {
		at := c.at
		for turn, r := 0, c.first; r >= 0; turn, r = turn+1, next[r] {
			if turn > 0 {
				if _, timed := rows.Timestamp(int(r)); timed {
					d, err := due(int(r))
					if err != nil {
						return nil, err
					}
					at = max(at, d)
				} else if d, ok := rows.Delay(int(r)); ok {
					at += time.Duration(math.Round(d * 1e6))
				}
			}
			entries = append(entries, entry{at: at, conv: int32(k), turn: int32(turn), row: r})
		}
	}
	slices.SortFunc(entries, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.conv, b.conv), cmp.Compare(a.turn, b.turn))
	})
	order := make([]int32, len(entries))
	for i, e := range entries {
		order[i] = e.row
	}
	return order, nil
}

// convStart is a conversation's first turn and its nominal time.
type convStart struct {
	at    time.Duration
	first int32
}

// conversations returns the first row of every conversation in file order
// of first turns, and each row's next turn (-1 for none).
func conversations(rows *trace.Table, file string) (firsts, next []int32, err error) {
	n := rows.Len()
	next = make([]int32, n)
	last := make([]int32, rows.Sessions()) // session → its last row so far, -1 before
	for s := range last {
		last[s] = -1
	}
	for i := range n {
		next[i] = -1
		if d, ok := rows.Delay(i); ok && d < 0 {
			return nil, nil, rowError(rows, file, i, fmt.Errorf("delay must not be negative, got %v", d))
		}
		sid, hasSession := rows.SessionID(i)
		if hasSession {
			s := rows.SessionOrdinal(i)
			if last[s] >= 0 {
				next[last[s]] = int32(i)
				last[s] = int32(i)
				continue
			}
			last[s] = int32(i)
		}
		if _, ok := rows.Timestamp(i); !ok {
			if hasSession {
				return nil, nil, rowError(rows, file, i, fmt.Errorf("first turn of session %q has no timestamp; a fixed schedule needs one", sid))
			}
			return nil, nil, rowError(rows, file, i, errors.New("row has no timestamp; a fixed schedule needs one on every conversation's first turn"))
		}
		firsts = append(firsts, int32(i))
	}
	return firsts, next, nil
}

// rowError places err at row i of rows: its line in file where the table
// knows it, else its 1-based index.
func rowError(rows *trace.Table, file string, i int, err error) error {
	line := rows.Line(i)
	if line == 0 {
		line = i + 1
	}
	return &trace.LineError{File: file, Line: line, Err: err}
}
