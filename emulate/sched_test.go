package emulate

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// With two running slots and more requests than that, requests queue, in
// vllm:num_requests_waiting and Stats. The engine's sleep is a gate held
// closed, so the first two requests sit in prefill until released.
func TestQueueing(t *testing.T) {
	gate := make(chan struct{})
	queued := make(chan struct{}, 64)
	e, srv := newTestServer(t, Config{MaxRunning: 2, Overhead: time.Millisecond}, func(e *Engine) {
		e.sleep = func(ctx context.Context, d time.Duration) error {
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		e.sched.onQueue = func() { queued <- struct{}{} }
	})

	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			resp, err := doRawNoFatal(srv.URL+"/v1/completions", map[string]any{"prompt": seq(i*100, 20), "max_tokens": 2})
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs <- errors.New(resp.Status)
			}
		})
	}
	// n-2 requests must queue behind the two that hold the slots.
	for range n - 2 {
		<-queued
	}
	if got := testutil.ToFloat64(e.m.waitingFunc); got != n-2 {
		t.Fatalf("num_requests_waiting %v, want %d", got, n-2)
	}
	if got := testutil.ToFloat64(e.m.runningFunc); got != 2 {
		t.Fatalf("num_requests_running %v, want 2", got)
	}
	if st := e.Stats(); st.Waiting != n-2 || st.Running != 2 {
		t.Fatalf("stats running %d waiting %d", st.Running, st.Waiting)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := e.Stats(); st.Success != n || st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("stats after %+v", st)
	}
}

// A request that gives up while queued leaves the queue and is counted
// as canceled; the slot holders are unaffected.
func TestQueueCancel(t *testing.T) {
	s := newScheduler(1)
	if err := s.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{}, 1)
	s.onQueue = func() { queued <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- s.acquire(ctx) }()
	<-queued
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire: %v", err)
	}
	if r, w := s.counts(); r != 1 || w != 0 {
		t.Fatalf("running %d waiting %d", r, w)
	}
	s.release()
	if r, w := s.counts(); r != 0 || w != 0 {
		t.Fatalf("running %d waiting %d", r, w)
	}
}
