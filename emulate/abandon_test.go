package emulate

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestAbandonedSlot: a client that closes its stream mid-way frees its
// running slot at once; with HoldAbandonedSlots the engine generates on
// into the void, the slot held (a second request waits) until the output
// would have ended.
func TestAbandonedSlot(t *testing.T) {
	const maxTokens = 5
	for _, hold := range []bool{false, true} {
		name := map[bool]string{false: "freed", true: "held"}[hold]
		t.Run(name, func(t *testing.T) {
			gate := make(chan struct{})
			steps := make(chan struct{}, maxTokens)
			queued := make(chan struct{}, 1)
			done := make(chan Result, 2)
			e, err := New(Config{InterToken: time.Hour, MaxRunning: 1, HoldAbandonedSlots: hold})
			if err != nil {
				t.Fatal(err)
			}
			// Prefill is instant; every decode step (an hour apart, so
			// never already due) waits for the gate or for its context.
			e.sleep = func(ctx context.Context, d time.Duration) error {
				if d <= 0 {
					return ctx.Err()
				}
				steps <- struct{}{}
				select {
				case <-gate:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			e.onDone = func(r Result) { done <- r }
			e.sched.onQueue = func() { queued <- struct{}{} }
			// left reports the first request's client gone, as the server sees it.
			left := make(chan struct{}, 1)
			first := true
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if first {
					first = false
					go func() { <-r.Context().Done(); left <- struct{}{} }()
				}
				e.Handler().ServeHTTP(w, r)
			}))
			defer srv.Close()

			ctx, cancel := context.WithCancel(context.Background())
			resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("x", map[string]any{"stream": true, "max_tokens": maxTokens}))
			br := bufio.NewReader(resp.Body)
			for range 4 { // role chunk, blank, first token, blank
				if _, err := br.ReadString('\n'); err != nil {
					t.Fatal(err)
				}
			}
			<-steps // the engine waits to decode the second token
			cancel()
			resp.Body.Close()
			<-left

			// A second request, sent while the first's client is gone.
			second := make(chan *http.Response, 1)
			go func() {
				second <- post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("y", map[string]any{"stream": true, "max_tokens": 1}))
			}()
			if !hold {
				if r := <-done; r != ResultCanceled {
					t.Fatalf("first request: %v, want canceled", r)
				}
			} else {
				<-queued // the slot is still held: the second request waits
				if st := e.Stats(); st.Running != 1 || st.Waiting != 1 {
					t.Fatalf("with the client gone: running %d waiting %d, want 1 and 1", st.Running, st.Waiting)
				}
				for range maxTokens - 2 { // the rest of the output, into the void
					gate <- struct{}{}
					<-steps
				}
				gate <- struct{}{}
				if r := <-done; r != ResultCanceled {
					t.Fatalf("first request: %v, want canceled", r)
				}
			}
			r := <-second
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
			if got := <-done; got != ResultSuccess {
				t.Fatalf("second request: %v, want success", got)
			}
			if st := e.Stats(); st.Canceled != 1 || st.Running != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}
