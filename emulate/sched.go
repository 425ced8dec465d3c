package emulate

import (
	"context"
	"sync"
)

// scheduler admits at most max sequences at once and queues the rest in
// arrival order. A plain semaphore channel would not do: waiters on a
// channel in a select are not served strictly first come, first served,
// and the queue length must be observable for vllm:num_requests_waiting.
type scheduler struct {
	mu      sync.Mutex
	max     int
	running int
	queue   []chan struct{} // closed when the slot is handed over
	onQueue func()          // test hook, called after a request is queued
}

func newScheduler(limit int) *scheduler { return &scheduler{max: limit} }

// acquire blocks until a slot is free or ctx ends. On success the caller
// must call release.
func (s *scheduler) acquire(ctx context.Context) error {
	s.mu.Lock()
	if s.running < s.max && len(s.queue) == 0 {
		s.running++
		s.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	s.queue = append(s.queue, ready)
	hook := s.onQueue
	s.mu.Unlock()
	if hook != nil {
		hook()
	}

	select {
	case <-ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	for i, q := range s.queue {
		if q == ready {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			s.mu.Unlock()
			return ctx.Err()
		}
	}
	s.mu.Unlock()
	// The slot was handed over while ctx ended: pass it on.
	s.release()
	return ctx.Err()
}

// release frees a slot, handing it straight to the oldest waiter if any,
// so that running never dips while requests wait.
func (s *scheduler) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) > 0 {
		next := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		close(next)
		return
	}
	s.running--
}

// counts returns the running and waiting numbers.
func (s *scheduler) counts() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, len(s.queue)
}
