package openai

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the package starts must have ended when its tests end:
// a stream reader left behind would keep a connection and a body open.
//
// With benchSinkEnv set the binary is instead the streaming sink of
// BenchmarkClientStream32Sink, in a process of its own.
func TestMain(m *testing.M) {
	if os.Getenv(benchSinkEnv) != "" {
		os.Exit(runBenchSink())
	}
	goleak.VerifyTestMain(m)
}
