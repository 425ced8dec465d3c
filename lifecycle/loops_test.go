package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
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
		change func(cfg config.Config) []config.Config // the configurations applied in turn
	}{
		{"removed then added back", func(cfg config.Config) []config.Config {
			without := cfg
			without.Workloads = cfg.Workloads[:1] // "other" only
			return []config.Config{without, cfg}
		}},
		{"changed", func(cfg config.Config) []config.Config {
			changed := cfg
			changed.Workloads = slices.Clone(cfg.Workloads)
			changed.Workloads[1].MaxInFlight = 7
			return []config.Config{changed}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, nil)
			dir := t.TempDir()
			trace := filepath.Join(dir, "short.jsonl")
			if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 20, "input_length": 20, "output_length": 1, "hash_ids": [3, 4]}
`), 0o644); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "kvload.yml")
			cfg := daemontest.Config(srv.URL, trace)
			cfg.Workloads[0].Name = "other"
			w := daemontest.Workload("w", trace, "t")
			w.Loop = "repeat"
			cfg.Workloads = append(cfg.Workloads, w)
			daemontest.WriteConfig(t, path, cfg)
			d, err := startDaemon(t, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			loops := func() float64 {
				v, _ := testutil.Gather(t, d.reg).Value("kvload_trace_loops_total", "workload", "w")
				return v
			}
			testutil.Eventually(t, "passes counted", func() (bool, string) { return loops() >= 10, fmt.Sprint(loops()) })
			for _, c := range tt.change(cfg) {
				daemontest.WriteConfig(t, path, c)
				if err := d.Reload(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			before := loops()
			u := d.units[unitKey{"w", "t"}] // read after Reload answered: the owner is idle
			// Passes are numbered on the anchored grid: three after the restart's.
			first := u.workload.Position().Pass
			testutil.Eventually(t, "the restarted workload three passes on", func() (bool, string) {
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
