// Package testconfig holds configuration and trace fixtures that the
// daemon's tests in more than one package build the same way.
package testconfig

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// WatchConfig is a valid configuration whose target model tells which
// version of the file was applied.
func WatchConfig(srvURL, trace, model string) string {
	return fmt.Sprintf(`targets:
  - name: t
    url: %s
    model: %s
    dialect: vllm
workloads:
  - name: w
    trace: %s
    targets: [t]
    block_size: 16
    loop: once
`, srvURL, model, trace)
}

// SteadyTrace writes a trace of rows every 20 ms into dir: replayed with
// loop: repeat, a request leaves every 20 ms for as long as the workload
// runs.
func SteadyTrace(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "steady.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 50 {
		fmt.Fprintf(f, `{"timestamp": %d, "input_length": 20, "output_length": 1, "hash_ids": [%d, %d]}`+"\n", i*20, 2*i+1, 2*i+2)
	}
	return path
}
