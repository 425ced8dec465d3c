package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
)

// browserConfig replays a small trace, each row sharing its first block
// with every other, against six engines: healthy, failing every request,
// failing one in five (degraded), reporting no cached tokens, one that
// never answers (stalled: nothing finishes, so its health is not reported),
// and one outside the daemon, at recoveringURL, that the test makes fail
// and then come back (recovering).
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
  - name: recovering
    url: ` + recoveringURL + `
    model: kvload-emulated
    dialect: vllm
workloads:
  - name: canary
    trace: trace.jsonl
    targets: [healthy, failing, flaky, no-cached-count, recovering]
    seed: 7
    synthesis: {max_osl: 8}
    loop: fresh
    max_in_flight: 1024
  - name: hung
    trace: trace.jsonl
    targets: [stalled]
    seed: 7
    synthesis: {max_osl: 8}
    loop: fresh
    max_in_flight: 65536
`

// recoveringURL stands in browserConfig for the recovering engine's URL.
const recoveringURL = "RECOVERING_URL"

// browserTrace is rows rows, 100 ms apart, of 1,000 prompt tokens: one
// block shared by all, one of their own.
func browserTrace(rows int) []byte {
	var b bytes.Buffer
	for i := range rows {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1000, "output_length": 8, "hash_ids": [0, %d]}`+"\n", i*100, i+1)
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
	if _, err := config.Parse([]byte(strings.ReplaceAll(browserConfig, recoveringURL, "http://127.0.0.1:1")), dir); err != nil {
		t.Fatalf("browser configuration: %v", err)
	}
}
