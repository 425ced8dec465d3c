package lifecycle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestOnceEndLogged: a loop: once workload logs one info line naming it and
// its target when its single pass is done and drained; a workload still
// replaying (loop: repeat) logs none.
func TestOnceEndLogged(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	trace := filepath.Join(dir, "now.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [3, 4]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kvload.yml")
	forever := daemontest.Workload("forever", fixture(t, "future.jsonl"), "t")
	forever.Loop = "repeat"
	daemontest.WriteConfig(t, path, config.Config{
		Targets:   []config.Target{daemontest.Target("t", srv.URL)},
		Workloads: []config.Workload{daemontest.Workload("once", trace, "t"), forever},
	})
	var logs testutil.Buffer
	d, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) })
	if err != nil {
		t.Fatal(err)
	}
	const line = `msg="replay finished: its single pass is done and drained"`
	testutil.Eventually(t, "the end of the once workload logged", func() (bool, string) {
		return strings.Contains(logs.String(), line), logs.String()
	})
	d.stop()
	testutil.Wait(t, "the daemon stopped", d.Done())
	var ends []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, line) {
			ends = append(ends, l)
		}
	}
	if len(ends) != 1 || !strings.Contains(ends[0], "workload=once") || !strings.Contains(ends[0], "target=t ") ||
		!strings.Contains(ends[0], "level=info") {
		t.Errorf("want one info line for workload once, target t; got %q", ends)
	}
}
