package main

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
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
	srv := testutil.NewFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, daemontest.Config(srv.URL, fixture(t, "tiny.jsonl")))

	var stderr testutil.Buffer
	exit := make(chan int, 1)
	go func() {
		exit <- run(context.Background(), []string{"--config.file=" + path,
			"--web.listen-address=" + taken.Addr().String(), "--shutdown.drain-timeout=1s"},
			streams{stdout: io.Discard, stderr: &stderr})
	}()
	if code := testutil.WaitShowing(t, "an exit with the listen address taken", exit, &stderr); code != exitBadInput {
		t.Errorf("exit code %d, want %d:\n%s", code, exitBadInput, stderr.String())
	}
	if n := srv.Count("/v1/chat/completions"); n != 0 {
		t.Errorf("the target saw %d requests, want 0", n)
	}
	if log := stderr.String(); !strings.Contains(log, "address already in use") || strings.Contains(log, "replay started") {
		t.Errorf("the log should name the bind failure and no replay:\n%s", log)
	}
}
