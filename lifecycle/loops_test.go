package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoopsAfterRestart: a workload whose units all start over — removed
// by a reload then added back, or changed — counts its new passes in
// kvload_trace_loops_total. (A changed one used to count none until it had
// replayed as many passes as before the change: the collector remembered
// them.)
func TestLoopsAfterRestart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(cfg string) []string // the configurations applied in turn
	}{
		{"removed then added back", func(cfg string) []string {
			without := cfg[:strings.Index(cfg, "  - {name: w,")]
			return []string{without, cfg}
		}},
		{"changed", func(cfg string) []string {
			return []string{strings.Replace(cfg, "loop: repeat}", "loop: repeat, max_in_flight: 7}", 1)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t)
			dir := t.TempDir()
			trace := filepath.Join(dir, "short.jsonl")
			if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 20, "input_length": 20, "output_length": 1, "hash_ids": [3, 4]}
`), 0o644); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "kvload.yml")
			cfg := fmt.Sprintf(`targets:
  - {name: t, url: %s, model: m, dialect: vllm}
workloads:
  - {name: other, trace: %s, targets: [t], block_size: 16, loop: once}
  - {name: w, trace: %s, targets: [t], block_size: 16, loop: repeat}
`, srv.URL, trace, trace)
			writeConfig(t, path, cfg)
			d, err := startDaemon(t, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			loops := func() float64 {
				v, _ := gatherFamilies(t, d.reg).value("kvload_trace_loops_total", "workload", "w")
				return v
			}
			eventually(t, "passes counted", func() (bool, string) { return loops() >= 10, fmt.Sprint(loops()) })
			for _, c := range tt.change(cfg) {
				writeConfig(t, path, c)
				if err := d.Reload(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			before := loops()
			u := d.units[unitKey{"w", "t"}] // read after Reload answered: the owner is idle
			// Passes are numbered on the anchored grid: three after the restart's.
			first := u.workload.Position().Pass
			eventually(t, "the restarted workload three passes on", func() (bool, string) {
				p := u.workload.Position()
				return p.Pass >= first+3, fmt.Sprintf("%+v", p)
			})
			// Counting on from before, or afresh from a deleted series; not
			// stuck where it was.
			if got := loops(); got-before < 2 && (got < 2 || got >= before) {
				t.Errorf("kvload_trace_loops_total %v after 3 passes of the restarted workload (it was %v at the restart)", got, before)
			}
		})
	}
}
