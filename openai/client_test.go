package openai

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/prometheus/common/config"
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
				c.endpoint = srv.URL + "/" + f + "/v1/chat/completions"
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
