package emulate

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"
)

// Start serves on a loopback port; canceling its context ends every
// request, including a hung one, and wait returns once all is down.
func TestStartShutdown(t *testing.T) {
	hung := make(chan struct{})
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	e.onDone = func(r Result) {
		if r == ResultHung {
			close(hung)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, wait, err := e.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	complete(t, base, seq(1, 5), nil)

	if err := e.SetFaults(Faults{Hang: 1}); err != nil {
		t.Fatal(err)
	}
	resp := post(t, context.Background(), base+"/v1/chat/completions", chatBody("x", map[string]any{"stream": true}))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	cancel()
	<-hung
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Logf("hung body ended with %v", err)
	}
	if err := wait(); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if err := wait(); err != nil {
		t.Fatalf("second wait: %v", err)
	}
	if _, err := http.Get(base + "/health"); err == nil {
		t.Fatal("server still answering after shutdown")
	}
}

func TestStartBadAddress(t *testing.T) {
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Start(context.Background(), "127.0.0.1:notaport"); err == nil {
		t.Fatal("Start on a bad address succeeded")
	}
}

// A client that leaves mid-stream is counted as canceled, and its slot
// is freed.
func TestClientCancelMidStream(t *testing.T) {
	done := make(chan Result, 1)
	e, srv := newTestServer(t, Config{InterToken: time.Millisecond}, func(e *Engine) {
		// Prefill is instant; every decode step waits for the client
		// to leave.
		e.sleep = func(ctx context.Context, d time.Duration) error {
			if d <= 0 {
				return ctx.Err()
			}
			<-ctx.Done()
			return ctx.Err()
		}
		e.onDone = func(r Result) { done <- r }
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("x", map[string]any{"stream": true, "max_tokens": 5}))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for range 4 { // role chunk, blank, first token, blank
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if r := <-done; r != ResultCanceled {
		t.Fatalf("result %v", r)
	}
	if st := e.Stats(); st.Canceled != 1 || st.Running != 0 || st.CacheQueryTokens == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSleepCtx(t *testing.T) {
	if err := sleepCtx(context.Background(), time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleepCtx(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("sleepCtx on a canceled context: %v", err)
	}
	if err := sleepCtx(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("zero sleep on a canceled context: %v", err)
	}
}

func TestTokenizeErrors(t *testing.T) {
	_, srv := newTestServer(t, Config{Model: "m"})
	for _, tt := range []struct {
		path string
		body any
		want int
	}{
		{"/tokenize", map[string]any{"model": "other", "prompt": "x"}, http.StatusNotFound},
		{"/tokenize", map[string]any{"prompt": 5}, http.StatusBadRequest},
		{"/tokenize", map[string]any{"messages": []map[string]any{{"content": "no role"}}}, http.StatusBadRequest},
		{"/tokenize", map[string]any{"messages": []map[string]any{{"role": "user", "content": 5}}}, http.StatusBadRequest},
		{"/tokenize", `{`, http.StatusBadRequest},
		{"/detokenize", map[string]any{"tokens": []int{-1}}, http.StatusBadRequest},
		{"/detokenize", map[string]any{"tokens": []int{1 << 30}}, http.StatusBadRequest},
		{"/detokenize", `[]`, http.StatusBadRequest},
	} {
		postDecode(t, srv.URL+tt.path, tt.body, tt.want, nil)
	}
}
