package openai

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/config"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestFastEligible: only plain http targets whose http_client_config asks
// nothing of net/http go through fasthttp.
func TestFastEligible(t *testing.T) {
	tests := []struct {
		name string
		url  string
		hc   config.HTTPClientConfig
		want bool
	}{
		{"plain http, no settings", "http://127.0.0.1:8000/v1/chat/completions", config.HTTPClientConfig{}, true},
		{"prometheus/common's defaults", "http://engine/v1/chat/completions", config.DefaultHTTPClientConfig, true},
		{"a TLS setting on plain http", "http://engine/v1/chat/completions", config.HTTPClientConfig{TLSConfig: config.TLSConfig{InsecureSkipVerify: true}}, true},
		{"https", "https://engine/v1/chat/completions", config.HTTPClientConfig{}, false},
		{"basic auth", "http://engine/v1/chat/completions", config.HTTPClientConfig{BasicAuth: &config.BasicAuth{Username: "u"}}, false},
		{"bearer token", "http://engine/v1/chat/completions", config.HTTPClientConfig{Authorization: &config.Authorization{Type: "Bearer", Credentials: "t"}}, false},
		{"proxy from the environment", "http://engine/v1/chat/completions", config.HTTPClientConfig{ProxyConfig: config.ProxyConfig{ProxyFromEnvironment: true}}, false},
		{"extra headers", "http://engine/v1/chat/completions", config.HTTPClientConfig{HTTPHeaders: &config.Headers{Headers: map[string]config.Header{"X-A": {Values: []string{"b"}}}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := url.Parse(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			if got := fastEligible(*u, tt.hc); got != tt.want {
				t.Errorf("fastEligible = %v, want %v", got, tt.want)
			}
		})
	}
}

// answerWithHeader answers every request on a connection with a stream
// whose headers carry a field of n bytes.
func answerWithHeader(n int) func(conn net.Conn, _ int) {
	return func(conn net.Conn, _ int) {
		defer conn.Close()
		br := bufio.NewReader(conn)
		for readRequest(br) {
			resp := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Pad: %s\r\nContent-Length: %d\r\n\r\n%s",
				strings.Repeat("a", n), len(doneStream), doneStream)
			if _, err := io.WriteString(conn, resp); err != nil {
				return
			}
		}
	}
}

// TestFastSenderHeaderBound: an answer's headers must fit the read
// buffer; a longer one is a connection error that says so, and does not
// take the client's memory with it.
func TestFastSenderHeaderBound(t *testing.T) {
	tests := []struct {
		name    string
		pad     int
		outcome Outcome
		errSub  string
	}{
		{"headers within the bound", fastReadBuffer - 1024, OutcomeSuccess, ""},
		{"headers past the bound", fastReadBuffer + 1, OutcomeConnectionError, "longer than 16 KiB"},
		{"a megabyte of headers", 1 << 20, OutcomeConnectionError, "longer than 16 KiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustClient(t, TargetConfig{URL: rawServer(t, answerWithHeader(tt.pad)), Dialect: engine.DialectVLLM})
			if c.fast == nil {
				t.Fatal("the client does not use the fast sender")
			}
			var res Response
			c.Do(t.Context(), Request{Prompt: "x", MaxTokens: 1}, &res)
			if res.Outcome != tt.outcome || !strings.Contains(res.Error, tt.errSub) {
				t.Errorf("outcome %s (%q), want %s with %q", res.Outcome, res.Error, tt.outcome, tt.errSub)
			}
		})
	}
}

// TestFastSenderReuse: a connection goes back to the pool only after a
// body read to its end by a request that was not canceled; a request
// timed out in the middle of its stream leaves its connection closed,
// and the next request dials a new one.
func TestFastSenderReuse(t *testing.T) {
	var conns atomic.Int32
	hold := make(chan struct{})
	u := rawServer(t, func(conn net.Conn, n int) {
		conns.Add(1)
		defer conn.Close()
		br := bufio.NewReader(conn)
		for req := 0; readRequest(br); req++ {
			head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
			if n == 0 && req == 1 { // the second request on the first connection hangs mid-stream
				chunk := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
				_, _ = fmt.Fprintf(conn, "%s%x\r\n%s\r\n", head, len(chunk), chunk)
				<-hold
				return
			}
			if _, err := fmt.Fprintf(conn, "%s%x\r\n%s\r\n0\r\n\r\n", head, len(doneStream), doneStream); err != nil {
				return
			}
		}
	})
	t.Cleanup(func() { close(hold) }) // before the server's cleanup waits for its handlers
	c := mustClient(t, TargetConfig{URL: u, Dialect: engine.DialectVLLM, RequestTimeout: 200 * time.Millisecond})
	steps := []struct {
		outcome Outcome
		reused  bool
		conns   int32
	}{
		{OutcomeSuccess, false, 1},
		{OutcomeTimeout, true, 1}, // the hang, on the kept-alive connection
		{OutcomeSuccess, false, 2},
		{OutcomeSuccess, true, 2},
	}
	for i, s := range steps {
		var res Response
		c.Do(t.Context(), Request{Prompt: "x", MaxTokens: 1}, &res)
		if res.Outcome != s.outcome || res.Phases.Reused != s.reused || conns.Load() != s.conns {
			t.Errorf("request %d: %s (%s), reused %v, %d connections; want %s, reused %v, %d", i, res.Outcome, res.Error,
				res.Phases.Reused, conns.Load(), s.outcome, s.reused, s.conns)
		}
	}
}

// TestFastSenderCancel: a caller's cancellation ends the request at once,
// as canceled, whether the server has not answered yet or the dial hangs
// (an address that drops SYNs): the dial has the request's context.
func TestFastSenderCancel(t *testing.T) {
	silent := func(t *testing.T, reached chan struct{}) *Client {
		u := rawServer(t, func(conn net.Conn, _ int) {
			defer conn.Close()
			if readRequest(bufio.NewReader(conn)) {
				close(reached)
				_, _ = io.Copy(io.Discard, conn) // never answers
			}
		})
		return mustClient(t, TargetConfig{URL: u, Dialect: engine.DialectVLLM})
	}
	hangingDial := func(t *testing.T, reached chan struct{}) *Client {
		c := mustClient(t, TargetConfig{URL: "http://192.0.2.1:8000", Dialect: engine.DialectVLLM})
		c.fast.dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			close(reached)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return c
	}
	tests := []struct {
		name   string
		client func(t *testing.T, reached chan struct{}) *Client
	}{
		{"before the answer", silent},
		{"during the dial", hangingDial},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reached := make(chan struct{})
			c := tt.client(t, reached)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			var res Response
			go func() {
				defer close(done)
				c.Do(ctx, Request{Prompt: "x", MaxTokens: 1}, &res)
			}()
			testutil.Wait(t, "the request's wait", reached)
			cancel()
			testutil.Wait(t, "Do's return after the cancellation", done)
			if res.Outcome != OutcomeCanceled {
				t.Errorf("outcome %s (%s), want canceled", res.Outcome, res.Error)
			}
		})
	}
}

// closeCounter counts the closes of the connections it stands for.
type closeCounter struct {
	net.Conn
	closes *atomic.Int32
}

func (c closeCounter) Close() error { c.closes.Add(1); return nil }

// TestFastSenderIdleBounds: at most fastMaxIdle connections wait idle, one
// idle past fastIdle is closed when another is given back, and close
// closes the idle ones and every one given back after it.
func TestFastSenderIdleBounds(t *testing.T) {
	var closes atomic.Int32
	conn := func() *fastConn { return &fastConn{Conn: closeCounter{closes: &closes}} }
	f := newFastSender(url.URL{Scheme: "http", Host: "127.0.0.1:1"}, nil, "")
	for range fastMaxIdle + 5 {
		f.giveBack(conn(), true)
	}
	if len(f.idle) != fastMaxIdle || closes.Load() != 5 {
		t.Fatalf("%d idle, %d closed; want %d and 5", len(f.idle), closes.Load(), fastMaxIdle)
	}
	for _, fc := range f.idle[:10] {
		fc.lastUsed = fc.lastUsed.Add(-fastIdle - time.Second)
	}
	f.giveBack(conn(), false) // not reused: closed, the idle ones untouched
	if closes.Load() != 6 {
		t.Fatalf("%d closed after a connection not reused, want 6", closes.Load())
	}
	fc, err := f.take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f.giveBack(fc, true) // the 10 stale ones go
	if len(f.idle) != fastMaxIdle-10 || closes.Load() != 16 {
		t.Fatalf("%d idle, %d closed after the stale ones; want %d and 16", len(f.idle), closes.Load(), fastMaxIdle-10)
	}
	f.close()
	f.giveBack(conn(), true)
	if len(f.idle) != 0 || closes.Load() != 16+fastMaxIdle-10+1 {
		t.Errorf("%d idle, %d closed after close; want 0 and %d", len(f.idle), closes.Load(), 16+fastMaxIdle-10+1)
	}
}

// TestFastSenderHostileAnswers: answers that break HTTP/1.1 end the request
// with an error outcome that says what was wrong, and leave nothing
// running; none is read as a success.
func TestFastSenderHostileAnswers(t *testing.T) {
	sse := "Content-Type: text/event-stream\r\n"
	tests := []struct {
		name string
		raw  string
		want []Outcome
	}{
		{"a chunk size past 2^63", "HTTP/1.1 200 OK\r\n" + sse + "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n" + doneStream, []Outcome{OutcomeStreamError}},
		{"a chunk size that is not hex", "HTTP/1.1 200 OK\r\n" + sse + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + doneStream, []Outcome{OutcomeStreamError}},
		{"a chunk longer than its size", "HTTP/1.1 200 OK\r\n" + sse + "Transfer-Encoding: chunked\r\n\r\n2\r\n" + doneStream + "\r\n0\r\n\r\n", []Outcome{OutcomeStreamError}},
		{"a negative length", "HTTP/1.1 200 OK\r\n" + sse + "Content-Length: -5\r\n\r\n" + doneStream, []Outcome{OutcomeConnectionError}},
		{"two lengths that disagree", "HTTP/1.1 200 OK\r\n" + sse + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n" + doneStream, []Outcome{OutcomeConnectionError}},
		{"a length past the body", "HTTP/1.1 200 OK\r\n" + sse + fmt.Sprintf("Content-Length: %d\r\n\r\n", 1<<40) + "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", []Outcome{OutcomeStreamError}},
		{"an endless run of 100 Continue", strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 1000), []Outcome{OutcomeConnectionError}},
		{"no status line", "\r\n\r\n" + doneStream, []Outcome{OutcomeConnectionError}},
		{"a status of 99999", "HTTP/1.1 99999 Odd\r\n" + sse + "\r\n" + doneStream, []Outcome{OutcomeConnectionError}},
		{"a header line without a colon", "HTTP/1.1 200 OK\r\nno colon here\r\n" + sse + "\r\n" + doneStream, []Outcome{OutcomeConnectionError}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := rawServer(t, func(conn net.Conn, _ int) {
				defer conn.Close()
				if readRequest(bufio.NewReader(conn)) {
					_, _ = io.WriteString(conn, tt.raw)
				}
			})
			c := mustClient(t, TargetConfig{URL: u, Dialect: engine.DialectVLLM, RequestTimeout: time.Minute})
			var res Response
			c.Do(t.Context(), Request{Prompt: "x", MaxTokens: 1}, &res)
			ok := false
			for _, o := range tt.want {
				ok = ok || res.Outcome == o
			}
			if !ok || (res.Outcome != OutcomeSuccess && res.Error == "") {
				t.Errorf("outcome %s (%q), want one of %v with a reason", res.Outcome, res.Error, tt.want)
			}
			if strings.Contains(res.Error, "data:") {
				t.Errorf("the error %q quotes the answer", res.Error)
			}
		})
	}
}
