package openai

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// benchSinkEnv makes the test binary a sink (see TestMain).
const benchSinkEnv = "KVLOAD_REPLAY_BENCH_SINK"

// runBenchSink serves vllmStream(32), one flush per event, on a loopback
// port it prints, until its stdin closes.
func runBenchSink() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pieces := vllmStream(32)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, p := range pieces {
			_, _ = w.Write(p)
			_ = rc.Flush()
		}
	})}
	fmt.Println(ln.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = srv.Close()
	}()
	_ = srv.Serve(ln)
	return 0
}

// BenchmarkClientStream32Sink is BenchmarkClientStream32 with the server
// in a process of its own, so that cpu-µs/tok is the client's alone, and
// sink-cpu-µs/tok the server's beside it.
func BenchmarkClientStream32Sink(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), benchSinkEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("sink address: %v", err)
	}
	c := mustClient(b, TargetConfig{Name: "bench", URL: "http://" + strings.TrimSpace(addr), Model: "Qwen/Qwen3-0.6B", Dialect: engine.DialectVLLM})
	defer c.Close()
	cpu0, ok0 := testutil.ProcessCPUSeconds()
	sink0, okS0 := testutil.PIDCPUSeconds(cmd.Process.Pid)
	streamParallel(b, c)
	tokens := float64(b.N) * 32
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if cpu1, ok := testutil.ProcessCPUSeconds(); ok0 && ok {
		b.ReportMetric((cpu1-cpu0)/tokens*1e6, "cpu-µs/tok")
	}
	if sink1, ok := testutil.PIDCPUSeconds(cmd.Process.Pid); okS0 && ok {
		b.ReportMetric((sink1-sink0)/tokens*1e6, "sink-cpu-µs/tok")
	}
}
