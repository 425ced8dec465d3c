package openai

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

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
				// around the server's idle timeout; nothing waits on it
				// for a result.
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
