package replay

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// TestPlanFleetOrder: the plan turns a trace into the pass that
// idealcache.FleetOrder sorts (its own tests check the sort): sessions
// linked in file order, conversations by first-turn timestamp, a later
// turn's delay or timestamp, and no timestamps of later turns under a
// generated schedule.
func TestPlanFleetOrder(t *testing.T) {
	const sessions = `{"timestamp": 10, "input_length": 1, "session_id": "a"}
{"timestamp": 12, "input_length": 1}
{"input_length": 1, "session_id": "a", "delay": 1}
{"timestamp": 11, "input_length": 1, "session_id": "b"}
{"timestamp": 0, "input_length": 1, "session_id": "b"}
{"input_length": 1, "session_id": "a"}
{"timestamp": 30, "input_length": 1, "session_id": "a"}
`
	tests := []struct {
		name    string
		text    string
		speedup float64
		sched   Schedule
		want    []int32
	}{
		{name: "timestamps, ties in file order", text: `{"timestamp": 5, "input_length": 1}
{"timestamp": 1, "input_length": 1}
{"timestamp": 5, "input_length": 1}
{"timestamp": 0, "input_length": 1}
`, want: []int32{3, 1, 0, 2}},
		// a: 10, 11 (delay), 11, then 30; b: 11, then its timed turn
		// held to 11; the single row at 12.
		{name: "sessions", text: sessions, want: []int32{0, 2, 5, 3, 4, 1, 6}},
		// Twice as fast the timestamps halve and the delays do not: a at
		// 0, its delayed turns at 1 ms; b at 0.5 ms; the single row at 1.
		{name: "sessions, twice as fast", text: sessions, speedup: 2, want: []int32{0, 3, 4, 2, 5, 1, 6}},
		// Conversations at 0 ms (a, 4 turns), 4 ms (b, 2) and 6 ms; later
		// turns after their delays (a's 1 ms), never at their timestamps.
		{name: "sessions at a constant rate", text: sessions, sched: Schedule{Rate: 1000, Arrivals: ArrivalsConstant},
			want: []int32{0, 2, 5, 6, 3, 4, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := trace.ReadAll(strings.NewReader(tt.text), "x", trace.ReadOptions{BlockSize: 512})
			if err != nil {
				t.Fatal(err)
			}
			rows, err := trace.TableOf(recs)
			if err != nil {
				t.Fatal(err)
			}
			plan, err := NewScheduledPlan(rows, tt.speedup, "x", tt.sched)
			if err != nil {
				t.Fatal(err)
			}
			got := plan.FleetOrder()
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("order %v, want %v", got, tt.want)
			}
			got[0] = -1 // a copy: the models' order stays
			if again := plan.FleetOrder(); !reflect.DeepEqual(again, tt.want) {
				t.Errorf("after the caller changed its copy: %v", again)
			}
		})
	}
}
