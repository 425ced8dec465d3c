package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testconfig"
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
		name    string
		breakIt func(t *testing.T, dir, good string) // leaves dir/kvload.yml broken
		errSub  string
	}{
		{"unknown target", func(t *testing.T, dir, good string) {
			writeConfig(t, filepath.Join(dir, "kvload.yml"), strings.Replace(good, "targets: [t-w]", "targets: [t-nope]", 1))
		}, `unknown target "t-nope"`},
		{"truncated YAML", func(t *testing.T, dir, good string) {
			writeConfig(t, filepath.Join(dir, "kvload.yml"), good[:len(good)/2])
		}, "kvload.yml"},
		{"trace missing", func(t *testing.T, dir, good string) {
			writeConfig(t, filepath.Join(dir, "kvload.yml"), strings.Replace(good, "trace.jsonl", "gone.jsonl", 1))
		}, "gone.jsonl"},
		{"trace with a bad row", func(t *testing.T, dir, good string) {
			writeConfig(t, filepath.Join(dir, "bad.jsonl"), `{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": "soon", "input_length": 20}
`)
			writeConfig(t, filepath.Join(dir, "kvload.yml"), strings.Replace(good, "trace.jsonl", "bad.jsonl", 1))
		}, "bad.jsonl:2"},
		{"configuration is a directory", func(t *testing.T, dir, _ string) {
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
			srv := newFakeServer(t)
			dir := t.TempDir()
			steady, err := os.ReadFile(testconfig.SteadyTrace(t, dir))
			if err != nil {
				t.Fatal(err)
			}
			writeConfig(t, filepath.Join(dir, "trace.jsonl"), string(steady))
			good := fmt.Sprintf(`targets:
  - {name: t-w, url: %s/w, model: m, dialect: vllm}
workloads:
  - {name: w, trace: trace.jsonl, targets: [t-w], block_size: 16, loop: repeat}
`, srv.URL)
			path := filepath.Join(dir, "kvload.yml")
			writeConfig(t, path, good)
			d, err := startDaemon(t, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := d.units[unitKey{"w", "t-w"}] // Start answered: the owner is idle

			tt.breakIt(t, dir, good)
			err = d.Reload(t.Context())
			if err == nil || !strings.Contains(err.Error(), tt.errSub) {
				t.Fatalf("reload: %v, want an error naming %q", err, tt.errSub)
			}
			if v, _ := gatherFamilies(t, d.reg).value("kvload_config_last_reload_successful"); v != 0 {
				t.Errorf("kvload_config_last_reload_successful %v, want 0", v)
			}
			if st := d.Status(); st.ReloadOK || !strings.Contains(st.ReloadError, tt.errSub) {
				t.Errorf("landing page status: ok %v, error %q", st.ReloadOK, st.ReloadError)
			}
			if got := d.units[unitKey{"w", "t-w"}]; got != before || len(d.units) != 1 {
				t.Errorf("the rejected reload changed the units: %v", d.units)
			}
			sent := srv.count("/w/v1/chat/completions")
			eventually(t, "the old workload still sending", func() (bool, string) {
				n := srv.count("/w/v1/chat/completions")
				return n > sent, fmt.Sprintf("%d requests, %d at the reload", n, sent)
			})
		})
	}
}
