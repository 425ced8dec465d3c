package main

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testconfig"
)

// TestDaemonBindsBeforeSending: with its listen address already taken, the
// daemon exits 2 at once and the target never sees a request. (It used to
// start replaying, send a few requests, drain, and only then exit 1.)
func TestDaemonBindsBeforeSending(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { taken.Close() })
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	writeConfig(t, path, testconfig.WatchConfig(srv.URL, fixture(t, "tiny.jsonl"), "m"))

	var stderr syncBuffer
	exit := make(chan int, 1)
	go func() {
		exit <- run(context.Background(), []string{"--config.file=" + path,
			"--web.listen-address=" + taken.Addr().String(), "--shutdown.drain-timeout=1s"},
			streams{stdout: io.Discard, stderr: &stderr})
	}()
	select {
	case code := <-exit:
		if code != exitBadInput {
			t.Errorf("exit code %d, want %d:\n%s", code, exitBadInput, stderr.String())
		}
	case <-time.After(pollDeadline):
		t.Fatalf("no exit with the listen address taken:\n%s", stderr.String())
	}
	if n := srv.count("/v1/chat/completions"); n != 0 {
		t.Errorf("the target saw %d requests, want 0", n)
	}
	if log := stderr.String(); !strings.Contains(log, "address already in use") || strings.Contains(log, "replay started") {
		t.Errorf("the log should name the bind failure and no replay:\n%s", log)
	}
}
