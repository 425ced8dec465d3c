package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
)

// browserConfig replays a small trace, each row sharing its first block
// with every other, against five engines: healthy, failing every request,
// failing one in five (degraded), reporting no cached tokens, and one that
// never answers (stalled: nothing finishes, so its health is not reported).
// The stalled one has a workload of its own, whose max_in_flight holds all
// its hung requests, so that none is dropped.
const browserConfig = `targets:
  - name: healthy
    emulate: {block_size: 16, capacity_blocks: 4096, overhead: 2ms, inter_token: 1ms}
  - name: failing
    emulate: {block_size: 16, faults: {error_500: 1}}
  - name: flaky
    emulate: {block_size: 16, seed: 3, faults: {error_500: 0.2}}
  - name: no-cached-count
    emulate: {block_size: 16, omit_cached_tokens: true}
  - name: stalled
    emulate: {block_size: 16, faults: {hang: 1}}
workloads:
  - name: canary
    trace: trace.jsonl
    targets: [healthy, failing, flaky, no-cached-count]
    seed: 7
    synthesis: {max_osl: 8}
    loop: fresh
    max_in_flight: 16
  - name: hung
    trace: trace.jsonl
    targets: [stalled]
    seed: 7
    synthesis: {max_osl: 8}
    loop: fresh
    max_in_flight: 65536
`

// browserTrace is rows rows, 50 ms apart, of 1,000 prompt tokens: one
// block shared by all, one of their own.
func browserTrace(rows int) []byte {
	var b bytes.Buffer
	for i := range rows {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1000, "output_length": 8, "hash_ids": [0, %d]}`+"\n", i*50, i+1)
	}
	return b.Bytes()
}

// TestBrowserConfigValid keeps the browser test's configuration inside the
// configuration's bounds. The browser test itself runs only under its build
// tag, in make test, so without this a bound that tightens breaks it there
// and nowhere earlier.
func TestBrowserConfigValid(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "trace.jsonl"), browserTrace(100), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Parse([]byte(browserConfig), dir); err != nil {
		t.Fatalf("browser configuration: %v", err)
	}
}
