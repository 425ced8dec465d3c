//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestReceiveStampIsTheSendTime checks that a read's stamp is the time the
// peer wrote, not the time the sink got round to reading.
func TestReceiveStampIsTheSendTime(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wl := newWireListener(ln)
	untilStamped(t, wl)
	written := make(chan [2]int64, 1)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			written <- [2]int64{}
			return
		}
		defer c.Close()
		before := time.Now().UnixNano()
		_, _ = c.Write([]byte("ping"))
		written <- [2]int64{before, time.Now().UnixNano()}
		_, _ = io.Copy(io.Discard, c) // until the sink closes
	}()
	wc := acceptWire(t, wl)
	span := <-written // the read below starts only after the write has returned
	readAt := time.Now().UnixNano()
	buf := make([]byte, 16)
	if n, err := wc.Read(buf); err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	stamp := wc.first.Swap(0)
	if stamp < span[0] || stamp > span[1] {
		t.Errorf("stamp %d not within the write [%d, %d]; the read began at %d", stamp, span[0], span[1], readAt)
	}
}

// untilStamped exchanges bytes over a connection of wl until a read carries
// a stamp. When no socket of the machine had asked for stamps, the kernel
// turns them on through a deferred work item (net_enable_timestamp), and
// segments until it has run come unstamped: about one run in twelve of the
// tests above met that window. The sink meets it only if a tool sends
// within that instant of its start, and counts those requests as unstamped.
func untilStamped(t *testing.T, wl wireListener) {
	t.Helper()
	client, err := net.Dial("tcp", wl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	wc := acceptWire(t, wl)
	buf := make([]byte, 1)
	// A bound on tries, not on time: the work item runs within
	// microseconds on an idle machine.
	for range 1_000_000 {
		if _, err := client.Write([]byte{'x'}); err != nil {
			t.Fatal(err)
		}
		if _, err := wc.Read(buf); err != nil {
			t.Fatal(err)
		}
		if wc.first.Swap(0) != 0 {
			return
		}
	}
	t.Fatal("no read was stamped in a million tries: the kernel gives no SO_TIMESTAMPNS stamps")
}

// acceptWire accepts one connection of wl, closed when the test ends.
func acceptWire(t *testing.T, wl wireListener) *wireConn {
	t.Helper()
	c, err := wl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	wc, ok := c.(*wireConn)
	if !ok {
		t.Fatalf("accepted %T, want *wireConn", c)
	}
	return wc
}

// TestSinkStampsEachRequest checks that the sink logs a stamp per request,
// and that a keep-alive connection's second request gets its own, not the
// first's.
func TestSinkStampsEachRequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(streamShape{tokens: 2, perWrite: 1})
	srv := &http.Server{Handler: s, ConnContext: withWireConn}
	wl := newWireListener(ln) // before any dial: a socket accepted earlier has no stamps
	untilStamped(t, wl)
	go func() { _ = srv.Serve(wl) }()
	defer srv.Close()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	const body = `{"model":"bench"}`
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: sink\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	var sentAfter [2]int64
	for i := range 2 {
		sentAfter[i] = time.Now().UnixNano()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("request %d: stream %q", i, b)
		}
	}
	// The logs as benchrate reads them.
	logOf := func(query string) []int64 {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/arrivals"+query, nil))
		var times []int64
		if err := json.Unmarshal(rec.Body.Bytes(), &times); err != nil {
			t.Fatalf("/arrivals%s: %v", query, err)
		}
		return times
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/arrivals?at=handler", nil))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("/arrivals?at=handler: status %d, want %d for an unknown kind", rec.Code, http.StatusBadRequest)
	}
	received, handled := logOf("?at=received"), logOf("?at=handled")
	if !slices.Equal(logOf(""), received) {
		t.Errorf("/arrivals serves %v, want the stamps %v", logOf(""), received)
	}
	s.mu.Lock()
	st := s.stats
	s.mu.Unlock()
	if st.Requests != 2 || st.Unstamped != 0 || len(received) != 2 || len(handled) != 2 {
		t.Fatalf("stats %+v, %d stamps, %d handler times; want 2 requests, all stamped", st, len(received), len(handled))
	}
	for i, at := range received {
		if at < sentAfter[i] || at > handled[i] {
			t.Errorf("request %d: stamp %d, want between its write (%d) and its handler (%d)", i, at, sentAfter[i], handled[i])
		}
	}
}
