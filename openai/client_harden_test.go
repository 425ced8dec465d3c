package openai

import (
	"bufio"
	"context"
	"encoding/json"
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

	"github.com/kvload-exporter/kvload-exporter/engine"
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
			c := mustClient(t, TargetConfig{URL: u, Dialect: engine.DialectVLLM, HTTPClientConfig: hc})
			var res Response
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
			c := mustClient(t, TargetConfig{URL: u, Dialect: engine.DialectVLLM})
			var res Response
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
				if err := <-afterStream; err != nil {
					t.Log("after the forced close:", err)
				}
			}
		})
	}
}

// connAction is what the fake server of TestClientRetriesReusedConnection
// does with one request.
type connAction int

const (
	respond      connAction = iota // a complete keep-alive response
	closeConn                      // close without a response byte (FIN)
	resetConn                      // close with a reset (RST)
	partialClose                   // send the status line, then close
)

func either(cond bool, yes, no connAction) connAction {
	if cond {
		return yes
	}
	return no
}

// TestClientRetriesReusedConnection: a request that fails on a reused idle
// connection before any response byte (the server closed it as the
// request went out, as with a keep-alive timeout) is retried once on a new
// connection. A failure on a fresh connection, after a response byte, or
// of the retry itself is not retried.
func TestClientRetriesReusedConnection(t *testing.T) {
	resp := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(doneStream), doneStream)
	tests := []struct {
		name     string
		act      func(conn, req int) connAction // conn counts from 0, req from 0 on each conn
		requests int
		want     []Outcome // per request
		// Requests the server receives. A retry's connection is not
		// kept, so after one the next request dials anew: in the first two
		// cases every other request is retried.
		attempts int
		errSub   string // in the Error of the last request
	}{
		{"server closes each reused connection",
			func(conn, req int) connAction { return either(req == 0, respond, closeConn) },
			4, []Outcome{OutcomeSuccess, OutcomeSuccess, OutcomeSuccess, OutcomeSuccess}, 6, ""},
		{"server resets each reused connection",
			func(conn, req int) connAction { return either(req == 0, respond, resetConn) },
			4, []Outcome{OutcomeSuccess, OutcomeSuccess, OutcomeSuccess, OutcomeSuccess}, 6, ""},
		{"fresh connection: no retry",
			func(conn, req int) connAction { return either(conn == 0, closeConn, respond) },
			1, []Outcome{OutcomeConnectionError}, 1, "EOF"},
		{"after a response byte: no retry",
			func(conn, req int) connAction { return either(req == 0, respond, partialClose) },
			2, []Outcome{OutcomeSuccess, OutcomeConnectionError}, 2, "unexpected EOF"},
		{"retry fails too: only one retry",
			func(conn, req int) connAction { return either(conn == 0 && req == 0, respond, closeConn) },
			2, []Outcome{OutcomeSuccess, OutcomeConnectionError}, 3, "EOF (retried once: a reused connection failed with EOF)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var (
				attempts atomic.Int32
				mu       sync.Mutex
				failedAt time.Time // when the server last dropped a request
			)
			u := rawServer(t, func(conn net.Conn, n int) {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for req := 0; readRequest(br); req++ {
					attempts.Add(1)
					act := tt.act(n, req)
					if act != respond {
						mu.Lock()
						failedAt = time.Now()
						mu.Unlock()
					}
					switch act {
					case respond:
						if _, err := io.WriteString(conn, resp); err != nil {
							return
						}
						continue
					case resetConn:
						_ = conn.(*net.TCPConn).SetLinger(0)
					case partialClose:
						_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\n")
					}
					return
				}
			})
			c := mustClient(t, TargetConfig{URL: u, Dialect: engine.DialectVLLM})
			for i := range tt.requests {
				var res Response
				c.Do(context.Background(), Request{Prompt: "x"}, &res)
				if res.Outcome != tt.want[i] {
					t.Errorf("request %d: %s (%s), want %s", i, res.Outcome, res.Error, tt.want[i])
				}
				if i == tt.requests-1 && ((tt.errSub == "") != (res.Error == "") || !strings.Contains(res.Error, tt.errSub)) {
					t.Errorf("request %d: Error %q, want it to contain %q", i, res.Error, tt.errSub)
				}
				mu.Lock()
				dropped := failedAt
				mu.Unlock()
				if res.Outcome == OutcomeSuccess && !dropped.IsZero() && !res.Sent.After(dropped) {
					t.Errorf("request %d: Sent %v is not after the failed attempt (%v): TTFT would include it", i, res.Sent, dropped)
				}
			}
			if n := int(attempts.Load()); n != tt.attempts {
				t.Errorf("the server received %d requests, want %d", n, tt.attempts)
			}
		})
	}
}

// TestClientRejectsAbsurdUsage: a usage count that no request could
// produce (negative, fractional, near 2^63, beyond what the request's
// prompt or max_tokens allow, cached above prompt) makes the request a
// stream_error naming the field and value, and none of the usage reaches
// the Response. Counts at the edge of what is possible are accepted.
func TestClientRejectsAbsurdUsage(t *testing.T) {
	// LIMIT in a chunk stands for the prompt limit of the request the
	// server received: twice its body's bytes plus promptAllowance.
	tests := []struct {
		name    string
		cfg     TargetConfig // URL is set by the test
		req     Request
		chunk   string // the last chunk before [DONE]
		errSub  string // "" means success
		prompt  int    // for a success: usage prompt_tokens (-1: the limit), cached, completion
		cached  int
		output  int
		cacheOK bool
	}{
		{"negative prompt", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":1}}`, "usage.prompt_tokens -1 is negative", 0, 0, 0, false},
		{"negative completion", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":-3}}`, "usage.completion_tokens -3 is negative", 0, 0, 0, false},
		{"negative cached", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":-16}}}`,
			"usage.prompt_tokens_details.cached_tokens -16 is negative", 0, 0, 0, false},
		{"prompt 2^63-1", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":1}}`,
			"usage.prompt_tokens 9223372036854775807 is more than", 0, 0, 0, false},
		{"prompt beyond int64", TargetConfig{}, Request{Messages: []json.RawMessage{[]byte(`{"role":"user","content":"hi"}`)}},
			`{"choices":[],"usage":{"prompt_tokens":1e300,"completion_tokens":1}}`, "usage.prompt_tokens 1e300 is more than any request", 0, 0, 0, false},
		{"completion 2^63-1", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9223372036854775807}}`,
			"usage.completion_tokens 9223372036854775807 is more than any request", 0, 0, 0, false},
		{"fractional", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":5.5,"completion_tokens":1}}`, "usage.prompt_tokens 5.5 is not a whole number", 0, 0, 0, false},
		{"cached above prompt", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":11}}}`,
			"usage.prompt_tokens_details.cached_tokens 11 exceeds usage.prompt_tokens 10", 0, 0, 0, false},
		{"cache_n above prompt", TargetConfig{Dialect: engine.DialectLlamaCpp}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1},"timings":{"cache_n":12}}`,
			"timings.cache_n 12 exceeds usage.prompt_tokens 10", 0, 0, 0, false},
		{"completion far above max_tokens", TargetConfig{}, Request{Prompt: "hi", MaxTokens: 4},
			`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1000}}`,
			"usage.completion_tokens 1000 exceeds max_tokens 4", 0, 0, 0, false},
		{"prompt beyond a short prompt", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":LIMIT+1,"completion_tokens":1}}`,
			"is more than the request could hold", 0, 0, 0, false},
		{"prompt beyond its token ids", TargetConfig{API: APICompletions, PromptFormat: PromptFormatTokenIDs}, Request{PromptTokenIDs: []int{1, 2, 3}},
			`{"choices":[],"usage":{"prompt_tokens":LIMIT+1,"completion_tokens":1}}`,
			"is more than the request could hold", 0, 0, 0, false},

		{"edges accepted", TargetConfig{}, Request{Prompt: "hi", MaxTokens: 4},
			fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":LIMIT,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":LIMIT}}}`, 4+completionAllowance),
			"", -1, -1, 4 + completionAllowance, true},
		{"zeros accepted", TargetConfig{}, Request{Prompt: "hi", MaxTokens: 4},
			`{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":0}}}`, "", 0, 0, 0, true},
		{"whole float accepted", TargetConfig{}, Request{Prompt: "hi"},
			`{"choices":[],"usage":{"prompt_tokens":7.0,"completion_tokens":2e0}}`, "", 7, 0, 2, false},
		{"max_tokens from extra_body: no max_tokens bound", TargetConfig{ExtraBody: map[string]any{"max_tokens": 100}}, Request{Prompt: "hi", MaxTokens: 4},
			`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":100}}`, "", 5, 0, 100, false},
		{"n from the row's extra: no max_tokens bound", TargetConfig{}, Request{Prompt: "hi", MaxTokens: 4, Extra: json.RawMessage(`{"n":4}`)},
			`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16}}`, "", 5, 0, 16, false},
		{"messages: images may hold many tokens", TargetConfig{}, Request{Messages: []json.RawMessage{[]byte(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://i/x.png"}}]}`)}},
			`{"choices":[],"usage":{"prompt_tokens":100000,"completion_tokens":1}}`, "", 100000, 0, 1, false},
		{"payload: its own max_tokens", TargetConfig{}, Request{Payload: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":900}`)},
			`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":900}}`, "", 9, 0, 900, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit := make(chan int, 1)
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n, _ := io.Copy(io.Discard, r.Body)
				lim := 2*int(n) + promptAllowance
				limit <- lim
				chunk := strings.ReplaceAll(tt.chunk, "LIMIT+1", fmt.Sprint(lim+1))
				chunk = strings.ReplaceAll(chunk, "LIMIT", fmt.Sprint(lim))
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"+
					"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: %s\n\ndata: [DONE]\n\n", chunk)
			}))
			cfg := tt.cfg
			cfg.URL = srv.URL
			if cfg.Dialect == "" {
				cfg.Dialect = engine.DialectVLLM
			}
			c := mustClient(t, cfg)
			var res Response
			c.Do(context.Background(), tt.req, &res)
			if tt.errSub != "" {
				if strings.Contains(tt.chunk, "LIMIT") {
					tt.errSub = fmt.Sprintf("usage.prompt_tokens %d %s", <-limit+1, tt.errSub)
				}
				// The usage is not trusted at all: the output falls back
				// to the counted content chunks.
				checkResult(t, &res, want{outcome: OutcomeStreamError, status: 200, errSub: tt.errSub, content: true, output: 1})
				return
			}
			lim := <-limit
			if tt.prompt < 0 {
				tt.prompt = lim
			}
			if tt.cached < 0 {
				tt.cached = lim
			}
			checkResult(t, &res, want{outcome: OutcomeSuccess, status: 200, content: true, output: tt.output, fromUsage: true,
				prompt: tt.prompt, promptOK: true, cached: tt.cached, cachedOK: tt.cacheOK})
		})
	}
}
