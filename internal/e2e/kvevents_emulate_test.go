package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestEmulateCommandKVEvents: with --kv-events the emulate command logs
// the bound events endpoint on the line after its URL, and a ZMQ
// subscriber can connect there.
func TestEmulateCommandKVEvents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- cli.Run(ctx, []string{"emulate", "--listen", "127.0.0.1:0", "--kv-events", "tcp://127.0.0.1:0", "--kv-events-format", "array"}, io.Discard, pw)
		pw.Close()
	}()
	br := bufio.NewReader(pr)
	var lines []string
	for range 2 {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading stderr after %q: %v", lines, err)
		}
		lines = append(lines, l)
	}
	go func() { _, _ = io.Copy(io.Discard, br) }()
	if !strings.Contains(lines[0], "url=http://") {
		t.Fatalf("first line %q: want the URL", lines[0])
	}
	m := regexp.MustCompile(`msg="emulator publishing KV events" endpoint=tcp://(127\.0\.0\.1:\d+) topic="" format=array`).FindStringSubmatch(lines[1])
	if m == nil {
		t.Fatalf("second line %q: want the bound events endpoint", lines[1])
	}
	raw, err := net.Dial("tcp", m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := zmq4.Open(raw, null.Security(), zmq4.Sub, zmq4.SocketIdentity("t"), false, nil); err != nil {
		t.Fatalf("ZMTP handshake with %s: %v", m[1], err)
	}
	cancel()
	if c := testutil.Wait(t, "the command's exit", code); c != 0 {
		t.Errorf("exit %d, want 0", c)
	}
}
