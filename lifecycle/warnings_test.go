package lifecycle

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-kit/log"
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
			writeConfig(t, path, fmt.Sprintf(`targets:
  - name: emu
    emulate: {capacity_blocks: %d, inter_token: 1ms}
workloads:
  - name: w
    trace: %s
    targets: [emu]
    block_size: 16
    loop: %s
`, tt.capacity, fixture(t, "tiny.jsonl"), tt.loop))
			var logs logBuffer
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
