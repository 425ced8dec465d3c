//go:build linux && !race

package openai

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"
)

// quietPair is a quiet connection dialed to a listener, and the server's
// end of it.
func quietPair(t *testing.T) (*quietConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := dialQuiet(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	q, ok := c.(*quietConn)
	if !ok {
		t.Fatalf("dialQuiet gave a %T, want a *quietConn", c)
	}
	s := (<-accepted).(*net.TCPConn)
	t.Cleanup(func() { q.Close(); s.Close() })
	return q, s
}

// payload is n bytes that no two offsets of which are likely alike.
func payload(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1})
	_, _ = r.Read(b)
	return b
}

func TestQuietConnCarriesBytes(t *testing.T) {
	// 8 MiB is far more than both sockets' buffers hold: the writer meets a
	// full socket (EAGAIN) and waits for the poller many times, and the
	// reader an empty one.
	for _, n := range []int{1, 4096, 8 << 20} {
		q, s := quietPair(t)
		want := payload(n)

		// Client to server.
		got := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(s)
			got <- b
		}()
		if w, err := q.Write(want); err != nil || w != n {
			t.Fatalf("%d bytes: Write = %d, %v", n, w, err)
		}
		if err := q.CloseWrite(); err != nil {
			t.Fatalf("CloseWrite: %v", err)
		}
		if b := <-got; !bytes.Equal(b, want) {
			t.Errorf("%d bytes: the server read %d bytes, not those written", n, len(b))
		}

		// Server to client, then the end of the stream.
		go func() {
			_, _ = s.Write(want)
			_ = s.CloseWrite()
		}()
		b, err := io.ReadAll(q)
		if err != nil || !bytes.Equal(b, want) {
			t.Errorf("%d bytes: the client read %d bytes (%v), not those written", n, len(b), err)
		}
		if k, err := q.Read(make([]byte, 1)); k != 0 || err != io.EOF { //nolint:errorlint // io.EOF must come bare
			t.Errorf("Read after the end = %d, %v; want 0, io.EOF", k, err)
		}
	}
}

func TestQuietConnErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, q *quietConn, s *net.TCPConn)
		op    func(q *quietConn) error
		is    []error // the error matches one of these
	}{
		{"read deadline passed", func(t *testing.T, q *quietConn, _ *net.TCPConn) {
			_ = q.SetReadDeadline(time.Now().Add(-time.Second))
		}, func(q *quietConn) error {
			_, err := q.Read(make([]byte, 10))
			return err
		}, []error{os.ErrDeadlineExceeded}},
		{"write deadline passed", func(t *testing.T, q *quietConn, _ *net.TCPConn) {
			_ = q.SetWriteDeadline(time.Now().Add(-time.Second))
		}, func(q *quietConn) error {
			_, err := q.Write([]byte("x"))
			return err
		}, []error{os.ErrDeadlineExceeded}},
		{"closed", func(t *testing.T, q *quietConn, _ *net.TCPConn) {
			q.Close()
		}, func(q *quietConn) error {
			_, err := q.Read(make([]byte, 10))
			return err
		}, []error{net.ErrClosed}},
		{"peer reset: a write fails, and no SIGPIPE ends the test", func(t *testing.T, _ *quietConn, s *net.TCPConn) {
			_ = s.SetLinger(0)
			s.Close()
		}, func(q *quietConn) error {
			// The first writes may land in the socket before the reset
			// is known.
			for range 100 {
				if _, err := q.Write(payload(64 << 10)); err != nil {
					return err
				}
			}
			return nil
		}, []error{syscall.ECONNRESET, syscall.EPIPE}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, s := quietPair(t)
			tt.setup(t, q, s)
			err := tt.op(q)
			matched := false
			for _, want := range tt.is {
				matched = matched || errors.Is(err, want)
			}
			if !matched {
				t.Fatalf("error %v, want one of %v", err, tt.is)
			}
			// Shaped as net.TCPConn's: a *net.OpError, a timeout that says so.
			var oe *net.OpError
			if !errors.As(err, &oe) {
				t.Errorf("error %T, want a *net.OpError", err)
			}
			var ne net.Error
			if timeout := errors.Is(err, os.ErrDeadlineExceeded); !errors.As(err, &ne) || ne.Timeout() != timeout {
				t.Errorf("error %v: Timeout() should be %v", err, timeout)
			}
		})
	}
}

// TestQuietConnCloseEndsARead: Close ends a read, whether it is already
// waiting in the poller or starts after (the test cannot tell which, and
// either way the read must end with net.ErrClosed, not hang).
func TestQuietConnCloseEndsARead(t *testing.T) {
	q, _ := quietPair(t)
	done := make(chan error, 1)
	go func() {
		_, err := q.Read(make([]byte, 10))
		done <- err
	}()
	q.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a read blocked in the poller ended with %v, want net.ErrClosed", err)
	}
}

// TestQuietConnUnderHTTP streams a chunked response through net/http's
// transport on quiet connections, the way the client reads a completion,
// over several kept-alive requests.
func TestQuietConnUnderHTTP(t *testing.T) {
	body := payload(1 << 20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, _ := io.ReadAll(r.Body)
		rc := http.NewResponseController(w)
		for off := 0; off < len(body); off += 7000 {
			_, _ = w.Write(body[off:min(off+7000, len(body))])
			_ = rc.Flush()
		}
		_, _ = w.Write(in)
	}))
	defer srv.Close()
	dials := 0
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials++
		return dialQuiet(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for i := range 3 {
		sent := payload(100 + i)
		resp, err := hc.Post(srv.URL, "application/octet-stream", bytes.NewReader(sent))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, append(append([]byte{}, body...), sent...)) {
			t.Fatalf("request %d: read %d bytes (%v), want the stream and the echo", i, len(got), err)
		}
	}
	if dials != 1 {
		t.Errorf("%d dials for 3 requests, want 1 kept-alive connection", dials)
	}
}
