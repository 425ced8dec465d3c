package replay

import (
	"container/heap"
	"time"
)

// userPool holds the free users of a closed loop by the time each is
// ready to send: when its last conversation ended, plus the think time.
// A user is taken for a whole conversation and freed at its end, so no
// more requests are out than there are users, and a request's scheduled
// time is when its user was ready: its schedule lag is how late the
// exporter sent it after that (a timer's overrun, a busy dispatcher),
// never the server's time on the user's earlier requests.
type userPool struct{ ready readyTimes }

func newUserPool(users int, start time.Time) *userPool {
	p := &userPool{ready: make(readyTimes, users)}
	for i := range p.ready {
		p.ready[i] = start
	}
	return p
}

// next is when the earliest free user is ready; ok is false when every
// user is busy.
func (p *userPool) next() (at time.Time, ok bool) {
	if len(p.ready) == 0 {
		return time.Time{}, false
	}
	return p.ready[0], true
}

// take marks the earliest free user busy.
func (p *userPool) take() { heap.Pop(&p.ready) }

// free makes a user ready again at at.
func (p *userPool) free(at time.Time) { heap.Push(&p.ready, at) }

// readyTimes is a min-heap of times.
type readyTimes []time.Time

func (h readyTimes) Len() int           { return len(h) }
func (h readyTimes) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h readyTimes) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *readyTimes) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *readyTimes) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
