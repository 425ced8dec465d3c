package lifecycle

import (
	"path/filepath"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestReloadGaugeAfterRevert: the file is made invalid, then restored to
// exactly the bytes that run. The watcher's content check must not take the
// restored file for "unchanged": the gauge returns to 1. Writing the same
// invalid bytes again sets it back to 0.
func TestReloadGaugeAfterRevert(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	good := daemontest.Marshal(t, twoWorkloads(srv.URL, fixture(t, "future.jsonl"), "w"))
	badCfg := twoWorkloads(srv.URL, fixture(t, "future.jsonl"), "w")
	badCfg.Workloads[0].Targets = []string{"t-nope"}
	bad := daemontest.Marshal(t, badCfg)
	daemontest.WriteFile(t, path, good)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		write []byte
		want  float64
	}{
		{bad, 0},
		{good, 1}, // the bytes that run
		{bad, 0},  // the bytes last rejected, rejected again
		{good, 1},
	}
	for i, s := range steps {
		daemontest.WriteFile(t, path, s.write)
		// As the file watcher asks: an unchanged file is skipped. A bad
		// file's error is what the gauge and the status must show.
		_ = d.request(t.Context(), false)
		if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != s.want {
			t.Errorf("step %d: kvload_config_last_reload_successful %v, want %v", i, v, s.want)
		}
		if got := d.Status().ReloadOK; got != (s.want == 1) {
			t.Errorf("step %d: landing page's reload ok %v", i, got)
		}
	}
}
