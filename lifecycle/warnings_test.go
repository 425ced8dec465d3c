package lifecycle

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestUnboundedEmulatorWarning: an emulated engine whose cache has no bound,
// fed new prompts every pass, grows for ever; the daemon says so when it
// starts the engine.
func TestUnboundedEmulatorWarning(t *testing.T) {
	t.Parallel()
	const warning = "prefix cache is unbounded"
	tests := []struct {
		name     string
		capacity int
		loop     string
		warn     bool
	}{
		{"unbounded, fresh", 0, "fresh", true},
		{"bounded, fresh", 4096, "fresh", false},
		{"unbounded, repeat", 0, "repeat", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "kvload.yml")
			w := daemontest.Workload("w", fixture(t, "tiny.jsonl"), "emu")
			daemontest.SetString(&w.Loop, tt.loop)
			daemontest.WriteConfig(t, path, config.Config{
				Targets:   []config.Target{{Name: "emu", Emulate: &config.Emulate{CapacityBlocks: tt.capacity, InterToken: time.Millisecond}}},
				Workloads: []config.Workload{w},
			})
			var logs testutil.Buffer
			// Start returns once the engines and units are started: the
			// warning, if any, is logged by then.
			if _, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) }); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(logs.String(), "replay started") {
				t.Fatalf("no replay started:\n%s", logs.String())
			}
			if got := strings.Contains(logs.String(), warning); got != tt.warn {
				t.Errorf("warning logged: %v, want %v:\n%s", got, tt.warn, logs.String())
			}
		})
	}
}
