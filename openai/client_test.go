package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/config"
	"go.uber.org/goleak"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// replayHandler serves a recorded body, flushing after every blank line so
// each event arrives on its own as from a real server.
func replayHandler(t *testing.T, fixture string) http.HandlerFunc {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("testdata", "streams", fixture))
	if err != nil {
		t.Fatal(err)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, line := range bytes.SplitAfter(body, []byte("\n")) {
			_, _ = w.Write(line)
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				_ = rc.Flush()
			}
		}
	}
}

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// want lists every field Do fills except the timestamps, which are checked
// for consistency instead: Sent set, FirstToken ≤ LastToken, both after
// Sent, both zero or both set.
type want struct {
	outcome   Outcome
	status    int
	errSub    string // Error must contain it; "" means Error must be empty
	content   bool   // FirstToken and LastToken set
	output    int
	fromUsage bool
	prompt    int
	promptOK  bool
	cached    int
	cachedOK  bool
	prefill   time.Duration // the engine's prefill time
	prefillOK bool
}

func checkResult(t *testing.T, res *Response, w want) {
	t.Helper()
	got := want{
		outcome: res.Outcome, status: res.HTTPStatus, errSub: w.errSub,
		content: !res.FirstToken.IsZero(), output: res.OutputTokens, fromUsage: res.OutputFromUsage,
		prompt: res.PromptTokens, promptOK: res.PromptKnown, cached: res.CachedTokens, cachedOK: res.CachedKnown,
		prefill: res.PrefillTime, prefillOK: res.PrefillKnown,
	}
	if got != w {
		t.Errorf("result\n got %+v\nwant %+v\n(error %q)", got, w, res.Error)
	}
	switch {
	case w.errSub == "" && res.Error != "":
		t.Errorf("unexpected Error %q", res.Error)
	case !strings.Contains(res.Error, w.errSub):
		t.Errorf("Error %q does not contain %q", res.Error, w.errSub)
	}
	if res.Sent.IsZero() {
		t.Error("Sent not set")
	}
	if res.FirstToken.IsZero() != res.LastToken.IsZero() {
		t.Errorf("FirstToken %v, LastToken %v: one of them is zero", res.FirstToken, res.LastToken)
	}
	if !res.FirstToken.IsZero() && (res.FirstToken.Before(res.Sent) || res.LastToken.Before(res.FirstToken)) {
		t.Errorf("timestamps out of order: sent %v first %v last %v", res.Sent, res.FirstToken, res.LastToken)
	}
}

func TestClientRecordedStreams(t *testing.T) {
	tests := []struct {
		fixture string
		dialect engine.Dialect
		api     API
		want    want
	}{
		{"vllm_chat.sse", engine.DialectVLLM, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 5, fromUsage: true, prompt: 1043, promptOK: true, cached: 1024, cachedOK: true}},
		{"vllm_chat_details_null.sse", engine.DialectVLLM, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 2, fromUsage: true, prompt: 37, promptOK: true}},
		{"vllm_chat_metrics.sse", engine.DialectVLLM, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 2, fromUsage: true, prompt: 812, promptOK: true, prefill: 41750 * time.Microsecond, prefillOK: true}},
		{"vllm_tool_calls.sse", engine.DialectVLLM, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 14, fromUsage: true, prompt: 210, promptOK: true, cached: 208, cachedOK: true}},
		{"vllm_completions.sse", engine.DialectVLLM, APICompletions, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 3, fromUsage: true, prompt: 512, promptOK: true, cached: 496, cachedOK: true}},
		{"sglang_chat_reasoning.sse", engine.DialectSGLang, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 6, fromUsage: true, prompt: 96, promptOK: true}},
		{"sglang_chat_no_details.sse", engine.DialectSGLang, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 2, fromUsage: true, prompt: 800, promptOK: true}},
		{"sglang_chat_cached.sse", engine.DialectSGLang, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 2, fromUsage: true, prompt: 1500, promptOK: true, cached: 1499, cachedOK: true}},
		{"sglang_abort.sse", engine.DialectSGLang, APIChat, want{outcome: OutcomeStreamError, status: 200, errSub: "finish_reason abort",
			content: true, output: 1}},
		{"sglang_completions_crlf.sse", engine.DialectSGLang, APICompletions, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 2, fromUsage: true, prompt: 64, promptOK: true, cached: 32, cachedOK: true}},
		{"trtllm_chat.sse", engine.DialectTRTLLM, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 3, fromUsage: true, prompt: 300, promptOK: true, cached: 0, cachedOK: true}},
		{"dynamo_chat.sse", engine.DialectDynamo, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 2, fromUsage: true, prompt: 128, promptOK: true}},
		{"dynamo_error_event.sse", engine.DialectDynamo, APIChat, want{outcome: OutcomeStreamError, status: 200,
			errSub: "error event: Stream ended before generation completed", content: true, output: 2}},
		{"dynamo_error_data.sse", engine.DialectDynamo, APIChat, want{outcome: OutcomeStreamError, status: 200,
			errSub: "internal_server_error: worker 7587890000 disconnected", content: true, output: 1}},
		{"llamacpp_chat.sse", engine.DialectLlamaCpp, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 2, fromUsage: true, prompt: 24, promptOK: true, cached: 16, cachedOK: true, prefill: 3200 * time.Microsecond, prefillOK: true}},
		{"llamacpp_error.sse", engine.DialectLlamaCpp, APIChat, want{outcome: OutcomeStreamError, status: 200,
			errSub: "server_error: Input prompt is too big", content: true, output: 1}},
		{"llamacpp_no_done.sse", engine.DialectLlamaCpp, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 1, cached: 0, cachedOK: true}},
		{"openai_framing.sse", engine.DialectOpenAI, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 2, fromUsage: true, prompt: 10, promptOK: true, cached: 0, cachedOK: true}},
		{"truncated.sse", engine.DialectOpenAI, APIChat, want{outcome: OutcomeStreamError, status: 200,
			errSub: "stream ended without [DONE], finish_reason or usage", content: true, output: 2}},
		{"malformed.sse", engine.DialectOpenAI, APIChat, want{outcome: OutcomeStreamError, status: 200,
			errSub: "malformed chunk", content: true, output: 1}},
		{"flat_error.sse", engine.DialectSGLang, APIChat, want{outcome: OutcomeStreamError, status: 200,
			errSub: "BadRequestError: The request was aborted"}},
		// Recorded from real Ollama servers (scripts/engines/build-ollama.sh,
		// the tiny model, the same prompt twice): v0.34.4 reports the cached
		// tokens in usage, 0 included; v0.17.4 reports none, on chat or on
		// completions, whose every chunk carries a usage of zeros before the
		// last one.
		{"ollama_0.34.4_chat_uncached.sse", engine.DialectOllama, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true, cached: 0, cachedOK: true}},
		{"ollama_0.34.4_chat.sse", engine.DialectOllama, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true, cached: 117, cachedOK: true}},
		{"ollama_0.34.4_completions.sse", engine.DialectOllama, APICompletions, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true, cached: 117, cachedOK: true}},
		{"ollama_0.17.4_chat.sse", engine.DialectOllama, APIChat, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true}},
		{"ollama_0.17.4_completions.sse", engine.DialectOllama, APICompletions, want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 4, fromUsage: true, prompt: 118, promptOK: true}},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			srv := newServer(t, replayHandler(t, tt.fixture))
			c := mustClient(t, TargetConfig{URL: srv.URL, Model: "m", API: tt.api, Dialect: tt.dialect, RequestTimeout: time.Minute})
			var res Response
			c.Do(context.Background(), Request{Prompt: "hi", MaxTokens: 4}, &res)
			checkResult(t, &res, tt.want)
		})
	}
}

// TestClientAbsentCachedTokens: for SGLang an absent cached_tokens is
// unknown until the target has reported one, and zero after that; vLLM's
// null stays unknown.
func TestClientAbsentCachedTokens(t *testing.T) {
	tests := []struct {
		dialect  engine.Dialect
		fixtures []string
		want     []string // cached tokens per request, "?" for unknown
	}{
		{engine.DialectSGLang, []string{"sglang_chat_no_details.sse", "sglang_chat_cached.sse", "sglang_chat_no_details.sse", "sglang_chat_reasoning.sse"},
			[]string{"?", "1499", "0", "0"}},
		{engine.DialectDynamo, []string{"dynamo_chat.sse", "vllm_chat.sse", "dynamo_chat.sse"}, []string{"?", "1024", "0"}},
		{engine.DialectVLLM, []string{"vllm_chat.sse", "vllm_chat_details_null.sse", "dynamo_chat.sse"}, []string{"1024", "?", "?"}},
	}
	for _, tt := range tests {
		t.Run(string(tt.dialect), func(t *testing.T) {
			handlers := map[string]http.HandlerFunc{}
			for _, f := range tt.fixtures {
				handlers[f] = replayHandler(t, f)
			}
			mux := http.NewServeMux()
			mux.HandleFunc("/{fixture}/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
				handlers[r.PathValue("fixture")](w, r)
			})
			srv := newServer(t, mux)
			// One client per fixture URL would lose the learned state, so
			// the test swaps the endpoint of a single client.
			c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: tt.dialect})
			for i, f := range tt.fixtures {
				if err := moveEndpoint(c, srv.URL+"/"+f); err != nil {
					t.Fatal(err)
				}
				var res Response
				c.Do(context.Background(), Request{Prompt: "x"}, &res)
				got := "?"
				if res.CachedKnown {
					got = fmt.Sprint(res.CachedTokens)
				}
				if res.Outcome != OutcomeSuccess || got != tt.want[i] {
					t.Errorf("request %d (%s): outcome %s cached %s, want %s", i, f, res.Outcome, got, tt.want[i])
				}
			}
		})
	}
}

func TestClientSendsRequest(t *testing.T) {
	var gotBody, gotCT, gotAccept, gotAuth, gotPath string
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody, gotPath = string(b), r.URL.RequestURI()
		gotCT, gotAccept, gotAuth = r.Header.Get("Content-Type"), r.Header.Get("Accept"), r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	u := strings.Replace(srv.URL, "http://", "http://alice:s3cr3t@", 1) + "/base?model=q"
	c := mustClient(t, TargetConfig{URL: u, Model: "m", Dialect: engine.DialectTRTLLM, API: APICompletions, PromptFormat: PromptFormatTokenIDs})
	var res Response
	c.Do(context.Background(), Request{PromptTokenIDs: []int{1, 2}, MaxTokens: 5}, &res)
	checkResult(t, &res, want{outcome: OutcomeSuccess, status: 200})
	if want := `{"model":"m","prompt":[1,2],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"ignore_eos":true,"min_tokens":5}`; gotBody != want {
		t.Errorf("body %s, want %s", gotBody, want)
	}
	if gotPath != "/base/v1/completions?model=q" {
		t.Errorf("path %s", gotPath)
	}
	if gotCT != "application/json" || gotAccept != "text/event-stream" {
		t.Errorf("content-type %q accept %q", gotCT, gotAccept)
	}
	if want := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:s3cr3t")); gotAuth != want {
		t.Errorf("authorization %q, want %q", gotAuth, want)
	}
}

func TestClientHTTPErrors(t *testing.T) {
	bodies := []struct {
		name, body, want string
	}{
		{"nested", `{"error":{"message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}}`,
			"BadRequestError: This model's maximum context length is 4096 tokens."},
		{"flat", `{"object":"error","message":"The model does not exist.","type":"NotFoundError","param":null,"code":404}`,
			"NotFoundError: The model does not exist."},
		{"tgi", `{"error":"Model is overloaded","error_type":"overloaded"}`, "overloaded: Model is overloaded"},
		{"plain text", "upstream connect error\n", "upstream connect error"},
		{"empty", "", ""}, // status text
		{"huge", strings.Repeat("x", 1<<20), strings.Repeat("x", 100)},
	}
	for _, status := range []int{400, 429, 500} {
		for _, b := range bodies {
			t.Run(fmt.Sprintf("%d/%s", status, b.name), func(t *testing.T) {
				srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(status)
					_, _ = io.WriteString(w, b.body)
				}))
				c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM})
				var res Response
				c.Do(context.Background(), Request{Prompt: "x"}, &res)
				wantMsg := b.want
				if wantMsg == "" {
					wantMsg = http.StatusText(status)
				}
				checkResult(t, &res, want{outcome: OutcomeHTTPError, status: status, errSub: fmt.Sprintf("HTTP %d: %s", status, wantMsg)})
				if len(res.Error) > maxErrorText+len("…") {
					t.Errorf("Error is %d bytes long", len(res.Error))
				}
			})
		}
	}
}

func TestClientTransportFailures(t *testing.T) {
	closedURL := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		return "http://" + addr
	}
	// hijack answers with raw bytes and closes the connection.
	hijack := func(raw string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			_, _ = buf.WriteString(raw)
			_ = buf.Flush()
		}
	}
	chunk := "data: {\"choices\":[{\"delta\":{\"content\":\"cut\"}}]}\n\n"
	chunked := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(chunk), chunk)

	type ctxKey struct{}
	tests := []struct {
		name    string
		handler func(cancel context.CancelFunc) http.HandlerFunc
		url     func(t *testing.T) string
		timeout time.Duration
		want    want
		status  []int // acceptable statuses when the race with a deadline decides it
	}{
		{
			name: "connection refused", url: closedURL,
			want: want{outcome: OutcomeConnectionError, errSub: "connection refused"},
		},
		{
			name:    "closed before any response",
			handler: func(context.CancelFunc) http.HandlerFunc { return hijack("") },
			want:    want{outcome: OutcomeConnectionError, errSub: "EOF"},
		},
		{
			name:    "stream cut mid-way",
			handler: func(context.CancelFunc) http.HandlerFunc { return hijack(chunked) },
			want:    want{outcome: OutcomeStreamError, status: 200, errSub: "read body: unexpected EOF", content: true, output: 1},
		},
		{
			name: "connection close without finish",
			handler: func(context.CancelFunc) http.HandlerFunc {
				return hijack("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + chunk)
			},
			want: want{outcome: OutcomeStreamError, status: 200, errSub: "stream ended without", content: true, output: 1},
		},
		{
			name: "not an event stream",
			handler: func(context.CancelFunc) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"message":{"content":"hi"}}]}`)
				}
			},
			want: want{outcome: OutcomeStreamError, status: 200, errSub: `content type "application/json"`},
		},
		{
			name: "timeout before headers", timeout: 50 * time.Millisecond,
			handler: func(context.CancelFunc) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					// The server notices a client gone only once the body is read.
					_, _ = io.Copy(io.Discard, r.Body)
					<-r.Context().Done()
				}
			},
			want: want{outcome: OutcomeTimeout, errSub: "request_timeout 50ms expired"},
		},
		{
			name: "timeout mid-stream", timeout: 50 * time.Millisecond,
			handler: func(context.CancelFunc) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, chunk)
					_ = http.NewResponseController(w).Flush()
					<-r.Context().Done()
				}
			},
			want:   want{outcome: OutcomeTimeout, errSub: "request_timeout 50ms expired"},
			status: []int{0, 200},
		},
		{
			name: "caller cancels before headers", timeout: time.Hour,
			handler: func(cancel context.CancelFunc) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					cancel()
					<-r.Context().Done()
				}
			},
			want: want{outcome: OutcomeCanceled, errSub: "canceled by the caller"},
		},
		{
			name: "caller cancels mid-stream", timeout: time.Hour,
			handler: func(cancel context.CancelFunc) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, chunk)
					_ = http.NewResponseController(w).Flush()
					cancel()
					<-r.Context().Done()
				}
			},
			want:   want{outcome: OutcomeCanceled, errSub: "canceled by the caller"},
			status: []int{0, 200},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, tt.name))
			defer cancel()
			var u string
			if tt.url != nil {
				u = tt.url(t)
			} else {
				u = newServer(t, tt.handler(cancel)).URL
			}
			c := mustClient(t, TargetConfig{URL: u, Dialect: engine.DialectVLLM, RequestTimeout: tt.timeout})
			var res Response
			c.Do(ctx, Request{Prompt: "x"}, &res)
			w := tt.want
			if tt.status != nil {
				// Whether the headers or the first chunk beat the deadline
				// is up to the scheduler; only the outcome is certain.
				ok := false
				for _, s := range tt.status {
					ok = ok || res.HTTPStatus == s
				}
				if !ok {
					t.Errorf("status %d, want one of %v", res.HTTPStatus, tt.status)
				}
				w.status, w.content, w.output = res.HTTPStatus, !res.FirstToken.IsZero(), res.OutputTokens
			}
			checkResult(t, &res, w)
		})
	}
}

func TestClientEncodeFailureIsNotSent(t *testing.T) {
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a request that cannot be encoded reached the server")
	}))
	c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM})
	var res Response
	c.Do(context.Background(), Request{PromptTokenIDs: []int{1}}, &res)
	checkResult(t, &res, want{outcome: OutcomeHTTPError, errSub: "encode request: a token-id prompt needs the completions API"})
}

// TestClientResetsResult: a reused Response carries nothing over.
func TestClientResetsResult(t *testing.T) {
	srv := newServer(t, replayHandler(t, "truncated.sse"))
	c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM})
	res := Response{Outcome: OutcomeSuccess, PromptKnown: true, PromptTokens: 9, CachedKnown: true, CachedTokens: 3, OutputFromUsage: true}
	c.Do(context.Background(), Request{Prompt: "x"}, &res)
	checkResult(t, &res, want{outcome: OutcomeStreamError, status: 200, errSub: "stream ended", content: true, output: 2})
}

// TestClientKeepsSecretsOutOfErrors: neither URL userinfo nor configured
// credentials reach Response.Error, even when a server echoes them.
func TestClientKeepsSecretsOutOfErrors(t *testing.T) {
	const user, pass, token = "alice", "pa55-w0rd-xyz", "tok-Zq8vY2nLk"
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusUnauthorized)
		u, p, _ := r.BasicAuth()
		fmt.Fprintf(w, `{"error":{"message":"bad credentials: Authorization: %s; url http://%s:%s@host/; raw %s","type":"authentication_error"}}`,
			r.Header.Get("Authorization"), u, p, p)
	})
	srv := newServer(t, echo)
	hostPort := strings.TrimPrefix(srv.URL, "http://")

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	_ = closed.Close()

	tests := []struct {
		name string
		cfg  TargetConfig
		out  Outcome
	}{
		{"userinfo, echoed", TargetConfig{URL: "http://" + user + ":" + pass + "@" + hostPort}, OutcomeHTTPError},
		{"bearer, echoed", TargetConfig{URL: srv.URL, HTTPClientConfig: config.HTTPClientConfig{
			Authorization: &config.Authorization{Type: "Bearer", Credentials: token}}}, OutcomeHTTPError},
		{"basic_auth, echoed", TargetConfig{URL: srv.URL, HTTPClientConfig: config.HTTPClientConfig{
			BasicAuth: &config.BasicAuth{Username: user, Password: pass}}}, OutcomeHTTPError},
		{"userinfo, refused", TargetConfig{URL: "http://" + user + ":" + pass + "@" + closedAddr}, OutcomeConnectionError},
		{"userinfo via proxy, refused", TargetConfig{URL: srv.URL, HTTPClientConfig: config.HTTPClientConfig{
			ProxyConfig: config.ProxyConfig{ProxyURL: mustURL(t, "http://"+user+":"+pass+"@"+closedAddr)}}}, OutcomeConnectionError},
	}
	basic := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustClient(t, tt.cfg)
			var res Response
			c.Do(context.Background(), Request{Prompt: "x"}, &res)
			if res.Outcome != tt.out {
				t.Fatalf("outcome %s (%s), want %s", res.Outcome, res.Error, tt.out)
			}
			t.Logf("Error: %s", res.Error)
			for _, secret := range []string{pass, token, basic, user + ":"} {
				if strings.Contains(res.Error, secret) {
					t.Errorf("Error %q contains %q", res.Error, secret)
				}
			}
		})
	}
}

func mustURL(t *testing.T, s string) config.URL {
	t.Helper()
	var u config.URL
	if err := u.UnmarshalYAML(func(v any) error { *(v.(*string)) = s; return nil }); err != nil {
		t.Fatal(err)
	}
	return u
}

func TestScrub(t *testing.T) {
	c := &Client{secrets: []string{"hunter2"}}
	tests := []struct{ in, want string }{
		{"dial https://bob:hunter2@h:1/x failed", "dial https://h:1/x failed"},
		{`proxyconnect "http://u:p@proxy:3128": refused`, `proxyconnect "http://proxy:3128": refused`},
		{"two http://a:b@x and ws://c@y/", "two http://x and ws://y/"},
		{"said hunter2 twice: hunter2", "said <secret> twice: <secret>"},
		{"Authorization: Bearer abc.def", "Authorization: Bearer <secret>"},
		{"basic YWxpY2U6cA== here", "basic <secret> here"},
		{"multi\nline\ttext", "multi line text"},
		{strings.Repeat("é", 400), strings.Repeat("é", maxErrorText/2) + "…"},
	}
	for _, tt := range tests {
		if got := c.scrub(tt.in); got != tt.want {
			t.Errorf("scrub(%q)\n got %q\nwant %q", tt.in, got, tt.want)
		}
	}
}

// TestClientConcurrentStreams drives many streams at once through one
// client (run with -race), as a workload does.
func TestClientConcurrentStreams(t *testing.T) {
	srv := newServer(t, replayHandler(t, "vllm_chat.sse"))
	c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM})
	const n = 64
	results := make([]Response, n)
	done := make(chan struct{})
	for i := range results {
		go func() {
			defer func() { done <- struct{}{} }()
			c.Do(context.Background(), Request{Prompt: "x"}, &results[i])
		}()
	}
	for range n {
		<-done
	}
	for i := range results {
		checkResult(t, &results[i], want{outcome: OutcomeSuccess, status: 200, content: true,
			output: 5, fromUsage: true, prompt: 1043, promptOK: true, cached: 1024, cachedOK: true})
	}
}

// Every goroutine the package starts must have ended when its tests end:
// a stream reader left behind would keep a connection and a body open.
//
// With benchSinkEnv set the binary is instead the streaming sink of
// BenchmarkClientStream32Sink, in a process of its own.
func TestMain(m *testing.M) {
	if os.Getenv(benchSinkEnv) != "" {
		os.Exit(runBenchSink())
	}
	goleak.VerifyTestMain(m)
}

// socketSlack is what the kernel's socket buffers and the transport's
// bufio may hold of a body that the client never read: a server writing
// into a connection whose reader stopped gets this far before its writes
// block or fail. Loopback buffers autotune to a few MiB each way.
const socketSlack = 24 << 20

// floodHandler answers with status and content type, then writes prefix
// followed by filler bytes up to total, and reports on written how many
// bytes the connection accepted before the client went away.
func floodHandler(status int, contentType, prefix string, filler byte, total int, written chan<- int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := 0
		defer func() { written <- n }()
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		k, err := w.Write([]byte(prefix))
		n += k
		if err != nil {
			return
		}
		chunk := []byte(strings.Repeat(string(filler), 64<<10))
		rc := http.NewResponseController(w)
		for n < total {
			k, err := w.Write(chunk[:min(len(chunk), total-n)])
			n += k
			if err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// TestClientBoundsServerBodies: a server that sends 50 MB of error body, or
// an SSE event beyond the 16 MiB limit, gets only a bounded part of it read;
// the request ends with a short error text.
func TestClientBoundsServerBodies(t *testing.T) {
	const total = 50 << 20
	tests := []struct {
		name        string
		status      int
		contentType string
		prefix      string
		filler      byte
		total       int
		outcome     Outcome
		errSub      string
		maxRead     int // bytes the client may have consumed
	}{
		{"text error body", 500, "text/plain", "", 'x', total, OutcomeHTTPError, "HTTP 500: xxxx", maxErrorBody},
		{"JSON error body", 401, "application/json", `{"error":{"message":"`, 'y', total, OutcomeHTTPError, `HTTP 401: {"error":{"message":"yyyy`, maxErrorBody},
		{"SSE line over the limit", 200, "text/event-stream", "data: ", 'z', 4 * sseMaxEvent, OutcomeStreamError, "exceeds 16 MiB", sseMaxEvent + sseInitialBuffer},
		// Many lines of one event: the joined data is what is bounded.
		{"SSE event over the limit", 200, "text/event-stream", "", '\n', 4 * sseMaxEvent, OutcomeStreamError, "exceeds 16 MiB", sseMaxEvent + sseInitialBuffer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			written := make(chan int, 1)
			h := floodHandler(tt.status, tt.contentType, tt.prefix, tt.filler, tt.total, written)
			if tt.filler == '\n' {
				// "data: <1 MiB>\n" repeated, never a blank line.
				line := "data: " + strings.Repeat("w", 1<<20) + "\n"
				h = func(w http.ResponseWriter, r *http.Request) {
					n := 0
					defer func() { written <- n }()
					w.Header().Set("Content-Type", tt.contentType)
					for n < tt.total {
						k, err := w.Write([]byte(line))
						n += k
						if err != nil {
							return
						}
					}
				}
			}
			srv := newServer(t, h)
			c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM})
			var res Response
			c.Do(context.Background(), Request{Prompt: "x"}, &res)
			n := testutil.Wait(t, "the end of the server's handler (a client that keeps the connection open holds it)", written)
			t.Logf("server wrote %d of %d bytes; Error %q", n, tt.total, res.Error)
			if res.Outcome != tt.outcome {
				t.Errorf("outcome %s, want %s", res.Outcome, tt.outcome)
			}
			if !strings.Contains(res.Error, tt.errSub) {
				t.Errorf("Error %q lacks %q", res.Error, tt.errSub)
			}
			if len(res.Error) > maxErrorText+len("…") {
				t.Errorf("Error is %d bytes, want at most %d", len(res.Error), maxErrorText+len("…"))
			}
			if n >= tt.total || n > tt.maxRead+socketSlack {
				t.Errorf("the server got %d bytes out: the client read about %d, want at most %d", n, n-socketSlack, tt.maxRead)
			}
		})
	}
}

// TestClientScrubsFileSecrets: credentials read from files are scrubbed
// from error texts like inline ones, in every form a server may echo them,
// also after the file was rotated.
func TestClientScrubsFileSecrets(t *testing.T) {
	dir := t.TempDir()
	writeSecret := func(name, value string) string {
		p := filepath.Join(dir, name)
		// A trailing newline, as editors and kubectl leave it: prometheus/common trims it.
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tokenFile := writeSecret("token", "tok-F1le-9q8w7e")
	passFile := writeSecret("password", "pa55-F1le-zx81")

	var (
		mu       sync.Mutex
		lastAuth string
	)
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		mu.Lock()
		lastAuth = auth
		mu.Unlock()
		_, cred, _ := strings.Cut(auth, " ")
		if strings.HasPrefix(auth, "Basic ") {
			b, _ := base64.StdEncoding.DecodeString(cred)
			_, cred, _ = strings.Cut(string(b), ":")
		}
		w.WriteHeader(http.StatusUnauthorized)
		switch r.URL.Query().Get("shape") {
		case "json":
			fmt.Fprintf(w, `{"error":{"message":"credential %s rejected (header '%s')","type":"authentication_error"}}`, cred, auth)
		default:
			// Bytes 294 to 300 of the body are the secret's first six,
			// and the run of spaces collapses: a cut at maxErrorText
			// made before the secrets are replaced would keep them.
			fmt.Fprintf(w, "a%s%s%s", strings.Repeat(" ", 40), strings.Repeat("-", maxErrorText-41-6), cred)
		}
	})
	srv := newServer(t, echo)

	tests := []struct {
		name   string
		file   string
		hc     config.HTTPClientConfig
		header func(secret string) string
	}{
		{"credentials_file", tokenFile,
			config.HTTPClientConfig{Authorization: &config.Authorization{Type: "Bearer", CredentialsFile: tokenFile}},
			func(s string) string { return "Bearer " + s }},
		{"password_file", passFile,
			config.HTTPClientConfig{BasicAuth: &config.BasicAuth{Username: "alice", PasswordFile: passFile}},
			func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+s)) }},
	}
	for _, tt := range tests {
		for _, shape := range []string{"json", "text"} {
			t.Run(tt.name+"/"+shape, func(t *testing.T) {
				c := mustClient(t, TargetConfig{URL: srv.URL + "?shape=" + shape, HTTPClientConfig: tt.hc})
				for i, secret := range []string{"", "r0tated-" + tt.name + "-" + shape + "-5k3"} {
					if secret != "" {
						writeSecret(filepath.Base(tt.file), secret)
					} else {
						b, _ := os.ReadFile(tt.file)
						secret = strings.TrimSpace(string(b))
					}
					var res Response
					c.Do(context.Background(), Request{Prompt: "x"}, &res)
					mu.Lock()
					got := lastAuth
					mu.Unlock()
					if want := tt.header(secret); got != want {
						t.Fatalf("request %d: the server saw Authorization %q, want %q", i, got, want)
					}
					if res.Outcome != OutcomeHTTPError || !strings.Contains(res.Error, "<secret>") {
						t.Errorf("request %d: %s %q, want http_error with <secret>", i, res.Outcome, res.Error)
					}
					for _, part := range []string{secret, secret[:6], tt.header(secret)} {
						if strings.Contains(res.Error, part) {
							t.Errorf("request %d: Error %q holds %q", i, res.Error, part)
						}
					}
				}
			})
		}
	}
}

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
			afterStream := make(chan error, 1) // how the server's read after the stream ended
			u := rawServer(t, func(conn net.Conn, _ int) {
				if !readRequest(bufio.NewReader(conn)) {
					afterStream <- errors.New("no request")
					return
				}
				if _, err := io.WriteString(conn, tt.resp); err != nil {
					afterStream <- err
					return
				}
				// Nil once the client closes its end; an error if this
				// end was closed first (the cleanup of a failed wait).
				_, err := io.Copy(io.Discard, conn)
				afterStream <- err
			})
			c := mustClient(t, TargetConfig{URL: u, Dialect: engine.DialectVLLM})
			// Twice: the second stream's close comes from the timer the
			// first one's parser left for reuse.
			for range 2 {
				var res Response
				returned := make(chan struct{})
				go func() {
					defer close(returned)
					c.Do(context.Background(), Request{Prompt: "x", MaxTokens: 1}, &res)
				}()
				// A failed wait ends the test; the server's cleanup then
				// closes the connection, which ends Do.
				testutil.Wait(t, "Do's return after [DONE] while the server holds the body open", returned)
				checkResult(t, &res, want{outcome: OutcomeSuccess, status: 200, content: true,
					output: 1, fromUsage: true, prompt: 7, promptOK: true})
				if err := testutil.Wait(t, "the client's close of the connection after [DONE]", afterStream); err != nil {
					t.Errorf("the client did not close the connection: %v", err)
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

// TestClientServerIdleTimeout checks the retry of a request lost to an
// idle connection the server closed, against a real net/http server whose
// idle timeout is 50 ms: it closes a kept-alive connection after 50 ms of
// silence, whatever the client is doing. Clients send with gaps that
// sweep across those 50 ms, so that many requests go out on a connection
// the server is closing at that moment. Every request
// must succeed: one that fails on a reused connection before any response
// byte is retried once, on a connection of its own (which the server sees
// as a request with Connection: close).
func TestClientServerIdleTimeout(t *testing.T) {
	t.Parallel()
	const (
		idle     = 50 * time.Millisecond
		senders  = 8
		requests = 60 // per sender
	)
	var served, retries atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		served.Add(1)
		if r.Close {
			retries.Add(1) // only the client's retry disables keep-alive
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, doneStream)
	}))
	srv.Config.IdleTimeout = idle
	srv.Start()
	t.Cleanup(srv.Close)
	c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM})
	t.Cleanup(c.Close)

	var mu sync.Mutex
	failures := map[string]int{} // by outcome and error
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range requests {
				var res Response
				c.Do(context.Background(), Request{Prompt: "x", MaxTokens: 1}, &res)
				if res.Outcome != OutcomeSuccess {
					mu.Lock()
					failures[string(res.Outcome)+": "+res.Error]++
					mu.Unlock()
				}
				// The stimulus: gaps from 45 to 55 ms in steps of 0.25 ms,
				// around the server's idle timeout, which is real time
				// (net/http takes no clock). Nothing waits on a gap for a
				// result and nothing is judged by its length: a loaded
				// machine only stretches the gaps, which sends fewer
				// requests into the race and cannot fail a correct client.
				step := (i*7 + s*5) % 41
				<-time.After(idle - 5*time.Millisecond + time.Duration(step)*250*time.Microsecond)
			}
		})
	}
	wg.Wait()
	total := senders * requests
	failed := 0
	for _, n := range failures {
		failed += n
	}
	t.Logf("%d requests: %d served, %d retried, %d failed", total, served.Load(), retries.Load(), failed)
	if failed > 0 {
		t.Errorf("%d of %d requests failed: %v", failed, total, failures)
	}
	if got := served.Load(); got != int64(total) {
		t.Errorf("the server answered %d requests, want %d (one per request, retries included)", got, total)
	}
}

// TestClientAbandons: a request told to abandon closes its stream after
// its tokens or its time, with outcome abandoned; the server sees the
// client leave; a stream that ends first is a success.
func TestClientAbandons(t *testing.T) {
	const token = "data: {\"choices\":[{\"delta\":{\"content\":\"t\"}}]}\n\n"
	const end = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n"
	// stream writes tokens chunks, then the end, or, with hold, waits
	// for the client to leave and reports it on left.
	stream := func(tokens int, hold bool, left chan<- struct{}) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			for range tokens {
				_, _ = io.WriteString(w, token)
				_ = rc.Flush()
			}
			if !hold {
				_, _ = io.WriteString(w, end)
				return
			}
			<-r.Context().Done()
			left <- struct{}{}
		}
	}
	tests := []struct {
		name    string
		tokens  int
		hold    bool // the server never ends the stream by itself
		abandon Abandon
		want    want
	}{
		{"after two tokens", 5, true, Abandon{AfterTokens: 2},
			want{outcome: OutcomeAbandoned, status: 200, errSub: "closed after 2 tokens", content: true, output: 2}},
		{"after a duration", 1, true, Abandon{After: 30 * time.Millisecond},
			want{outcome: OutcomeAbandoned, status: 200, errSub: "abandon.after", content: true, output: 1}},
		{"ends before its tokens", 3, false, Abandon{AfterTokens: 4},
			want{outcome: OutcomeSuccess, status: 200, content: true, output: 3}},
		{"not told to abandon", 3, false, Abandon{},
			want{outcome: OutcomeSuccess, status: 200, content: true, output: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			left := make(chan struct{}, 1)
			srv := newServer(t, stream(tt.tokens, tt.hold, left))
			c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM, RequestTimeout: time.Hour})
			var res Response
			c.Do(context.Background(), Request{Prompt: "x", Abandon: tt.abandon}, &res)
			checkResult(t, &res, tt.want)
			if tt.hold {
				<-left // the server saw the stream closed
			}
			if res.Outcome.IsError() {
				t.Errorf("outcome %s counts as an error", res.Outcome)
			}
		})
	}
}

// TestClientOllamaUpgrade: an answer without a count stays unknown even
// after the target has reported counts (a fleet being upgraded answers
// both ways); it is never read as 0.
func TestClientOllamaUpgrade(t *testing.T) {
	fixtures := []string{"ollama_0.17.4_chat.sse", "ollama_0.34.4_chat.sse", "ollama_0.17.4_chat.sse", "ollama_0.34.4_chat_uncached.sse"}
	want := []string{"?", "117", "?", "0"}
	handlers := map[string]http.HandlerFunc{}
	for _, f := range fixtures {
		handlers[f] = replayHandler(t, f)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/{fixture}/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		handlers[r.PathValue("fixture")](w, r)
	})
	srv := newServer(t, mux)
	c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectOllama})
	for i, f := range fixtures {
		if err := moveEndpoint(c, srv.URL+"/"+f); err != nil {
			t.Fatal(err)
		}
		var res Response
		c.Do(context.Background(), Request{Prompt: "x"}, &res)
		got := "?"
		if res.CachedKnown {
			got = fmt.Sprint(res.CachedTokens)
		}
		if res.Outcome != OutcomeSuccess || got != want[i] {
			t.Errorf("answer %d (%s): %s, cached %s, want success, cached %s", i, f, res.Outcome, got, want[i])
		}
	}
}

// moveEndpoint points c at base, its fast sender too.
func moveEndpoint(c *Client, base string) error {
	if err := c.setEndpoint(base); err != nil {
		return err
	}
	if c.fast != nil {
		c.fast.close()
		c.fast = newFastSender(c.endpoint, c.user, c.session)
	}
	return nil
}

// writeCountingConn counts the writes made on a connection.
type writeCountingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCountingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestRequestLeavesInOneWrite checks that a request whose headers and body
// fit the transport's write buffer goes out in one write: net/http flushes
// the headers on their own before a body it does not know to be in memory,
// which costs each side a system call and a packet more per request. A
// larger body takes two writes, shared prompt or not.
func TestRequestLeavesInOneWrite(t *testing.T) {
	srv := newServer(t, replayHandler(t, "vllm_chat.sse"))
	tests := []struct {
		name   string
		api    API
		prompt string
	}{
		{"chat, short prompt", APIChat, "the quick brown fox"},
		{"chat, 2,000-byte prompt", APIChat, strings.Repeat("the quick brown fox ", 100)},
		{"completions, 2,000-byte prompt", APICompletions, strings.Repeat("the quick brown fox ", 100)},
		{"chat, 12,000-byte prompt, shared", APIChat, strings.Repeat("the quick brown fox ", 600)},
	}
	for _, tt := range tests {
		for _, sender := range []string{"fasthttp", "net/http"} {
			t.Run(tt.name+", "+sender, func(t *testing.T) {
				c := mustClient(t, TargetConfig{URL: srv.URL, Model: "m", API: tt.api, Dialect: engine.DialectVLLM})
				var writes atomic.Int64
				dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
					conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return writeCountingConn{Conn: conn, writes: &writes}, nil
				}
				if sender == "fasthttp" {
					c.fast.dial = dial
				} else {
					c.fast, c.http = nil, &http.Transport{DialContext: dial}
				}
				t.Cleanup(c.Close)
				want := int64(1)
				if len(tt.prompt) > maxFlatBody {
					want = 2
				}
				for i := range 3 { // a new connection, then a kept-alive one
					before := writes.Load()
					var res Response
					c.Do(t.Context(), Request{Prompt: tt.prompt, MaxTokens: 8}, &res)
					if res.Outcome != OutcomeSuccess {
						t.Fatalf("request %d: %s: %s", i, res.Outcome, res.Error)
					}
					if n := writes.Load() - before; n != want {
						t.Errorf("request %d went out in %d writes, want %d", i, n, want)
					}
				}
			})
		}
	}
}

// TestClientRequestHeaders: every request names the exporter, its JSON body
// and the event stream it wants, and a header http_client_config adds to one
// of those reaches the server next to it on every request, never piling up
// from one request to the next.
func TestClientRequestHeaders(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []http.Header
	)
	replay := replayHandler(t, "vllm_chat.sse")
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		replay(w, r)
	}))
	hc := config.DefaultHTTPClientConfig
	hc.HTTPHeaders = &config.Headers{Headers: map[string]config.Header{"Accept": {Values: []string{"application/x-ndjson"}}}}
	c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM, HTTPClientConfig: hc})
	for range 3 {
		var res Response
		c.Do(context.Background(), Request{Prompt: "x"}, &res)
		if res.Outcome != OutcomeSuccess {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Error)
		}
	}
	want := http.Header{
		"User-Agent":   {"kvload-exporter"},
		"Content-Type": {"application/json"},
		"Accept":       {"text/event-stream", "application/x-ndjson"},
	}
	// The values all requests share were not written through.
	for _, v := range [][]string{contentTypeJSON, acceptEventStream, userAgent} {
		if all := v[:cap(v)]; len(all) != 1 {
			t.Errorf("a shared header value now holds %q", all)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("the server saw %d requests, want 3", len(seen))
	}
	for i, h := range seen {
		for k, v := range want {
			if !slices.Equal(h[k], v) {
				t.Errorf("request %d: %s = %q, want %q", i, k, h[k], v)
			}
		}
	}
}
