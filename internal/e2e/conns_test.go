package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// openFDs counts the file descriptors of process pid.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestDaemonIdleConnections: under a 512 file descriptor limit, 1,000 idle
// connections to the metrics port (500 kept alive after one request, 500
// that send nothing) do not exhaust the daemon's descriptors: a fresh GET
// /metrics answers (within a 10 s client timeout: the old daemon only got
// to it when the read-header timeout closed idle connections, 30 s on),
// and once the clients close their connections the count returns to near
// where it was.
func TestDaemonIdleConnections(t *testing.T) {
	t.Parallel()
	const (
		limit = 512
		idle  = 1000
	)
	srv := testutil.NewFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, daemontest.Config(srv.URL, fixture(t, "future.jsonl")))
	p := startProcessEnv(t, []string{fmt.Sprintf("%s=%d", nofileEnv, limit)},
		"--config.file="+path, "--web.listen-address=127.0.0.1:0", "--shutdown.drain-timeout=1s")
	p.waitListening(t)
	pid := p.cmd.Process.Pid
	if code, _ := httpGet(t, p.base+"/metrics"); code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	http.DefaultClient.CloseIdleConnections()
	baseline := openFDs(t, pid)

	addr := p.base[len("http://"):]
	conns := make([]net.Conn, 0, idle)
	var wg sync.WaitGroup
	for i := range idle {
		c, err := net.DialTimeout("tcp", addr, testutil.Ceiling)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		if i%2 == 0 {
			continue // sends nothing
		}
		// One request, answered, then the connection stays open and idle.
		// The daemon may close it first: that is what it is for.
		wg.Add(1)
		go func() {
			defer wg.Done()
			fmt.Fprintf(c, "GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
			_ = c.SetReadDeadline(time.Now().Add(testutil.Ceiling)) // a hang guard; the read reports its failure
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	peak := openFDs(t, pid)
	t.Logf("file descriptors: %d before, %d with %d idle connections open (limit %d)", baseline, peak, idle, limit)
	if peak >= limit {
		t.Errorf("%d file descriptors open, the limit is %d", peak, limit)
	}

	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(p.base + "/metrics")
	if err != nil {
		t.Fatalf("a fresh GET /metrics with %d idle connections open: %v\n%s", idle, err, p.stderr.String())
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a fresh GET /metrics: %s", resp.Status)
	}
	client.CloseIdleConnections()

	for _, c := range conns {
		c.Close()
	}
	testutil.Eventually(t, "file descriptors back near the baseline", func() (bool, string) {
		n := openFDs(t, pid)
		return n <= baseline+5, fmt.Sprintf("%d open, %d before", n, baseline)
	})
	select {
	case <-p.exited:
		t.Fatalf("the daemon exited: %v\n%s", p.err, p.stderr.String())
	default:
	}
}
