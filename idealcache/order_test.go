package idealcache

import (
	"reflect"
	"testing"
	"time"
)

// turn is one row of a conversation of a testPass: a first turn is due at
// at; a later one goes at at when timed, else delay after its predecessor.
type turn struct {
	row   int
	at    time.Duration
	timed bool
	delay time.Duration
}

// testPass is a Pass of conversations given in schedule order.
type testPass struct {
	convs [][]turn
	rows  map[int]turn
	next  map[int]int
}

func newTestPass(convs ...[]turn) *testPass {
	p := &testPass{convs: convs, rows: map[int]turn{}, next: map[int]int{}}
	for _, c := range convs {
		for i, tn := range c {
			p.rows[tn.row] = tn
			p.next[tn.row] = -1
			if i > 0 {
				p.next[c[i-1].row] = tn.row
			}
		}
	}
	return p
}

func (p *testPass) Len() int           { return len(p.rows) }
func (p *testPass) Conversations() int { return len(p.convs) }
func (p *testPass) FirstTurn(conv int) (int, time.Duration) {
	return p.convs[conv][0].row, p.convs[conv][0].at
}
func (p *testPass) NextTurn(row int) int { return p.next[row] }
func (p *testPass) Timed(row int) (time.Duration, bool) {
	return p.rows[row].at, p.rows[row].timed
}
func (p *testPass) Delay(row int) time.Duration { return p.rows[row].delay }

func TestFleetOrder(t *testing.T) {
	tests := []struct {
		name string
		pass *testPass
		want []int32
	}{
		{
			name: "single turns by due time, ties in schedule order, not row order",
			pass: newTestPass(
				[]turn{{row: 3, at: 0}},
				[]turn{{row: 1, at: 1}},
				[]turn{{row: 2, at: 5}},
				[]turn{{row: 0, at: 5}},
			),
			want: []int32{3, 1, 2, 0},
		},
		{
			// Conversation 0 at 0 with turns after 1 (delay), 1 (no
			// delay) and its own time 20; conversation 1 at 1, whose
			// timed second turn (-10) is held to its first; a single
			// turn at 2.
			name: "sessions",
			pass: newTestPass(
				[]turn{{row: 0, at: 0}, {row: 2, delay: 1}, {row: 5}, {row: 6, at: 20, timed: true}},
				[]turn{{row: 3, at: 1}, {row: 4, at: -10, timed: true}},
				[]turn{{row: 1, at: 2}},
			),
			want: []int32{0, 2, 5, 3, 4, 1, 6},
		},
		{
			name: "a later turn's delay lets another conversation go first",
			pass: newTestPass(
				[]turn{{row: 0, at: 0}, {row: 1, delay: 100}},
				[]turn{{row: 2, at: 50}},
			),
			want: []int32{0, 2, 1},
		},
		{
			name: "a timed later turn goes at its own time, delays after it add to that",
			pass: newTestPass(
				[]turn{{row: 0, at: 0}, {row: 1, at: 60, timed: true}, {row: 2, delay: 5}},
				[]turn{{row: 3, at: 50}},
				[]turn{{row: 4, at: 64}},
				[]turn{{row: 5, at: 66}},
			),
			want: []int32{0, 3, 1, 4, 2, 5},
		},
		{
			name: "a tie between conversations keeps their schedule order, then the turns'",
			pass: newTestPass(
				[]turn{{row: 0, at: 0}, {row: 2, delay: 10}},
				[]turn{{row: 1, at: 10}},
			),
			want: []int32{0, 2, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := FleetOrder(tt.pass)
			if !reflect.DeepEqual(o.Rows, tt.want) {
				t.Fatalf("order %v, want %v", o.Rows, tt.want)
			}
			for i, row := range o.Rows {
				if o.Rank[row] != int32(i) {
					t.Errorf("row %d: rank %d, want %d", row, o.Rank[row], i)
				}
			}
			for k, c := range tt.pass.convs {
				for _, tn := range c {
					if o.Conv[tn.row] != int32(k) {
						t.Errorf("row %d: conversation %d, want %d", tn.row, o.Conv[tn.row], k)
					}
				}
			}
		})
	}
}
