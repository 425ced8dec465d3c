// Command kvload-exporter replays LLM request traces against inference
// servers and exports what it measures as Prometheus metrics. It also holds
// the offline trace tools: analyze, synthesize and hash.
//
// The program lives in internal/cli, where the whole-program tests can
// run it.
package main

import "github.com/kvload-exporter/kvload-exporter/internal/cli"

func main() { cli.Main() }
