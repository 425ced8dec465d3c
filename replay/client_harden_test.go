package replay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/config"
)

// TestClientDoesNotFollowRedirects: a 3xx ends the request as an
// http_error with its status, and the server it points to (another port,
// which net/http would send the credentials to) receives nothing. The
// target uses the config's default HTTP client settings, where
// follow_redirects is true.
func TestClientDoesNotFollowRedirects(t *testing.T) {
	var elsewhere atomic.Int32
	other := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		t.Errorf("the redirect was followed: %s %s with Authorization %q", r.Method, r.URL, r.Header.Get("Authorization"))
	}))
	for _, status := range []int{301, 302, 303, 307, 308} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				http.Redirect(w, r, other.URL+r.URL.Path, status)
			}))
			hc := config.DefaultHTTPClientConfig
			hc.Authorization = &config.Authorization{Type: "Bearer", Credentials: "tok-r3d1rect"}
			u := strings.Replace(srv.URL, "http://", "http://alice:pa55@", 1)
			c := mustClient(t, TargetConfig{URL: u, Dialect: DialectVLLM, HTTPClientConfig: hc})
			var res Result
			c.Do(context.Background(), Request{Prompt: "x"}, &res)
			checkResult(t, &res, want{outcome: OutcomeHTTPError, status: status, errSub: fmt.Sprintf("HTTP %d: ", status)})
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the other server received %d requests", n)
	}
}

// rawServer is a TCP server for exchanges net/http will not produce: it
// calls serve for each accepted connection (numbered from 0) in its own
// goroutine, and on cleanup closes the listener and every connection and
// waits for the goroutines.
func rawServer(t *testing.T, serve func(conn net.Conn, n int)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for n := 0; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { serve(conn, n) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

// readRequest reads one request and its body from br; ok is false when the
// connection ended first.
func readRequest(br *bufio.Reader) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, req.Body)
	return err == nil
}

// guard bounds a wait that only a bug makes long: no test relies on it.
const guard = 10 * time.Second

const doneStream = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\n\n" +
	"data: [DONE]\n\n"

// TestClientReleasesBodyAfterDone: a server that sends [DONE] and then
// keeps the body open (chunked without the last chunk, or a close-delimited
// body it never closes) does not hold the request: Do returns a success
// while the server still holds the connection open, and the client closes
// its end of the connection.
func TestClientReleasesBodyAfterDone(t *testing.T) {
	tests := []struct {
		name string
		resp string
	}{
		{"chunked without the last chunk", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n", len(doneStream), doneStream)},
		{"close-delimited, never closed", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + doneStream},
		{"HTTP/1.0 without length", "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + doneStream},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conns := make(chan net.Conn, 1)
			afterStream := make(chan error, 1) // how the server's read after the stream ended
			u := rawServer(t, func(conn net.Conn, _ int) {
				conns <- conn
				if !readRequest(bufio.NewReader(conn)) {
					afterStream <- errors.New("no request")
					return
				}
				if _, err := io.WriteString(conn, tt.resp); err != nil {
					afterStream <- err
					return
				}
				// Nil once the client closes its end; an error if the
				// test closed the connection first.
				_, err := io.Copy(io.Discard, conn)
				afterStream <- err
			})
			c := mustClient(t, TargetConfig{URL: u, Dialect: DialectVLLM})
			var res Result
			returned := make(chan struct{})
			go func() {
				defer close(returned)
				c.Do(context.Background(), Request{Prompt: "x", MaxTokens: 1}, &res)
			}()
			conn := <-conns
			select {
			case <-returned:
			case <-time.After(guard):
				t.Error("Do still reading after [DONE]: the server has to end the body")
				_ = conn.Close()
				<-returned
			}
			checkResult(t, &res, want{outcome: OutcomeSuccess, status: 200, content: true,
				output: 1, fromUsage: true, prompt: 7, promptOK: true})
			select {
			case err := <-afterStream:
				if err != nil {
					t.Errorf("the client did not close the connection: %v", err)
				}
			case <-time.After(guard):
				t.Error("the client kept the connection open after [DONE]")
				_ = conn.Close()
				<-afterStream
			}
		})
	}
}
