package lifecycle

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestKVEventsFollowed: an emulated engine that publishes its KV events is
// followed without a cache.kv_events of its own; a reload that drops them
// stops the stream and deletes its series, and the shutdown leaves no
// goroutine behind (goleak, in TestMain).
func TestKVEventsFollowed(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	cfg := config.Config{
		Targets:   []config.Target{{Name: "emu", Emulate: &config.Emulate{KVEvents: "tcp://127.0.0.1:0"}}},
		Workloads: []config.Workload{daemontest.Workload("w", trace, "emu")},
	}
	daemontest.WriteConfig(t, path, cfg)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	connected := func() (float64, int) {
		return testutil.Gather(t, d.reg).Value("kvload_kv_events_streams_connected", "target", "emu")
	}
	testutil.Eventually(t, "the emulated engine's stream followed", func() (bool, string) {
		v, n := connected()
		return n == 1 && v == 1, fmt.Sprint(v, n)
	})
	if f := d.kv.following["emu"]; f == nil || len(f.streams.Streams) != 1 || f.streams.Streams[0].Endpoint != d.emulators.running["emu"].engine.KVEventsEndpoint() {
		t.Fatalf("following %+v, want the emulator's own endpoint", f)
	}

	cfg.Targets[0].Emulate.KVEvents = ""
	daemontest.WriteConfig(t, path, cfg)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, n := connected(); n != 0 || len(d.kv.following) != 0 {
		t.Errorf("after the reload: %d connected series, %d targets followed; want none", n, len(d.kv.following))
	}
}
