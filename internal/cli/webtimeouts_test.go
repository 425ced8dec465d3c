package cli

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestWebServerTimeouts: the daemon's web server closes a connection that
// sends nothing, half a request head, or half a body, and a kept-alive one
// left idle, each after its timeout, so that such clients cannot hold file
// descriptors. The server is the daemon's (newWebServer) with its timeouts
// shortened for the test; TestWebServerTimeoutValues checks the real ones.
func TestWebServerTimeouts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		send string // written once connected; the client then only reads
		// answered: a response comes before the close (the idle case, and
		// the body cut by the read timeout).
		answered bool
	}{
		{"sends nothing", "", false},
		{"half a request head", "GET /metrics HTTP/1.1\r\nHost: x\r\n", false},
		{"head, then half the body", "POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc", true},
		{"idle after one request", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, err := io.Copy(io.Discard, r.Body); err != nil {
					http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
					return
				}
				io.WriteString(w, "ok\n")
			})
			srv := newWebServer(handler, newConnLimiter(100), nil)
			srv.ReadHeaderTimeout = 100 * time.Millisecond
			srv.ReadTimeout = 300 * time.Millisecond
			srv.IdleTimeout = 100 * time.Millisecond
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			t.Cleanup(func() {
				srv.Close()
				if err := <-served; !errors.Is(err, http.ErrServerClosed) {
					t.Errorf("Serve: %v", err)
				}
			})

			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if tt.send != "" {
				if _, err := io.WriteString(conn, tt.send); err != nil {
					t.Fatal(err)
				}
			}
			// Only a hang guard: the server must close well before.
			if err := conn.SetReadDeadline(time.Now().Add(testutil.Ceiling)); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(bufio.NewReader(conn))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the connection is still open after %v (read %q)", testutil.Ceiling, got)
			}
			// A close with unread data in the server's socket may come as a
			// reset rather than EOF: closed all the same.
			if err != nil && !strings.Contains(err.Error(), "connection reset") {
				t.Fatalf("read: %v", err)
			}
			if answered := strings.HasPrefix(string(got), "HTTP/1.1 "); answered != tt.answered {
				t.Errorf("answered before the close: %v, want %v (read %q)", answered, tt.answered, got)
			}
		})
	}
}

// TestWebServerTimeoutValues: the daemon's web server has every timeout
// set, at the values docs/reliability.md gives.
func TestWebServerTimeoutValues(t *testing.T) {
	t.Parallel()
	srv := newWebServer(http.NotFoundHandler(), newConnLimiter(1), nil)
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"ReadHeaderTimeout", srv.ReadHeaderTimeout, 30 * time.Second},
		{"ReadTimeout", srv.ReadTimeout, time.Minute},
		{"WriteTimeout", srv.WriteTimeout, 2 * time.Minute},
		{"IdleTimeout", srv.IdleTimeout, 90 * time.Second},
	} {
		if c.got != c.want {
			t.Errorf("%s %v, want %v", c.name, c.got, c.want)
		}
	}
}
