package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnboundedEmulatorWarning: an emulated engine whose cache has no bound,
// fed new prompts every pass, grows forever; the daemon says so at start.
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
			cfg := filepath.Join(t.TempDir(), "kvload.yml")
			writeConfig(t, cfg, fmt.Sprintf(`targets:
  - name: emu
    emulate: {capacity_blocks: %d, inter_token: 1ms}
workloads:
  - name: w
    trace: %s
    targets: [emu]
    block_size: 16
    loop: %s
`, tt.capacity, fixture(t, "tiny.jsonl"), tt.loop))
			d := startDaemon(t, "--config.file="+cfg)
			eventually(t, "replay started", func() (bool, string) {
				log := d.stderr.String()
				return strings.Contains(log, "replay started"), log
			})
			if got := strings.Contains(d.stderr.String(), warning); got != tt.warn {
				t.Errorf("warning logged: %v, want %v:\n%s", got, tt.warn, d.stderr.String())
			}
		})
	}
}
