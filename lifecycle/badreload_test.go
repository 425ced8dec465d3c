package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestBadReloadKeepsRunning: a reload of input that cannot be applied (the
// configuration, or a trace it names, broken in ways a user would) answers
// the problem, sets the reload gauge to 0 and leaves the running set alone:
// the same unit keeps sending. The whole catalogue of bad inputs, with the
// exact messages, is cmd/kvload-exporter's TestBadInputReload (through
// POST /-/reload).
func TestBadReloadKeepsRunning(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// breakIt leaves dir/kvload.yml broken; good is the configuration
		// that runs, the test's own copy.
		breakIt func(t *testing.T, dir string, good config.Config)
		errSub  string
	}{
		{"unknown target", func(t *testing.T, dir string, good config.Config) {
			good.Workloads[0].Targets = []string{"t-nope"}
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, `unknown target "t-nope"`},
		{"truncated YAML", func(t *testing.T, dir string, good config.Config) {
			text := daemontest.Marshal(t, good)
			daemontest.WriteFile(t, filepath.Join(dir, "kvload.yml"), text[:len(text)/2])
		}, "kvload.yml"},
		{"trace missing", func(t *testing.T, dir string, good config.Config) {
			good.Workloads[0].Trace = "gone.jsonl"
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, "gone.jsonl"},
		{"trace with a bad row", func(t *testing.T, dir string, good config.Config) {
			daemontest.WriteFile(t, filepath.Join(dir, "bad.jsonl"), []byte(`{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": "soon", "input_length": 20}
`))
			good.Workloads[0].Trace = "bad.jsonl"
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, "bad.jsonl:2"},
		{"configuration is a directory", func(t *testing.T, dir string, _ config.Config) {
			path := filepath.Join(dir, "kvload.yml")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "kvload.yml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, nil)
			dir := t.TempDir()
			steady, err := os.ReadFile(daemontest.SteadyTrace(t, dir))
			if err != nil {
				t.Fatal(err)
			}
			daemontest.WriteFile(t, filepath.Join(dir, "trace.jsonl"), steady)
			good := func() config.Config {
				cfg := twoWorkloads(srv.URL, "trace.jsonl", "w")
				cfg.Workloads[0].Loop = "repeat"
				return cfg
			}
			path := filepath.Join(dir, "kvload.yml")
			daemontest.WriteConfig(t, path, good())
			d, err := startDaemon(t, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := d.units[unitKey{"w", "t-w"}] // Start answered: the owner is idle

			tt.breakIt(t, dir, good())
			err = d.Reload(t.Context())
			if err == nil || !strings.Contains(err.Error(), tt.errSub) {
				t.Fatalf("reload: %v, want an error naming %q", err, tt.errSub)
			}
			if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 0 {
				t.Errorf("kvload_config_last_reload_successful %v, want 0", v)
			}
			if st := d.Status(); st.ReloadOK || !strings.Contains(st.ReloadError, tt.errSub) {
				t.Errorf("landing page status: ok %v, error %q", st.ReloadOK, st.ReloadError)
			}
			if got := d.units[unitKey{"w", "t-w"}]; got != before || len(d.units) != 1 {
				t.Errorf("the rejected reload changed the units: %v", d.units)
			}
			sent := srv.Count("/w/v1/chat/completions")
			testutil.Eventually(t, "the old workload still sending", func() (bool, string) {
				n := srv.Count("/w/v1/chat/completions")
				return n > sent, fmt.Sprintf("%d requests, %d at the reload", n, sent)
			})
		})
	}
}
