package replay

import "time"

// The Go runtime's timers are late by up to a millisecond when the process
// is idle: the thread that sleeps for the next timer waits in epoll_wait,
// whose timeout is in whole milliseconds, rounded up below 1 ms. A
// dispatcher on such timers sends 0.5 ms late on average and up to 1 ms
// (docs/benchmarks.md), more than the sub-millisecond accuracy the replay
// aims for.
//
// On Linux the dispatcher therefore sleeps on a timerfd of its own
// (precisetimer_linux.go): it reads the fd through the network poller, so
// the kernel's high-resolution timer ends epoll_wait at the deadline and
// the poller hands the dispatcher straight back, with no channel send and
// no other goroutine woken on the way. A read deadline at the same instant
// stands in for the fd when the process is busy and nobody polls: the
// runtime checks its timers at every scheduling point. Waking it early
// (a finished turn, Stop, a canceled context) moves that deadline into the
// past. Elsewhere, and for every other wait, the timers are the runtime's.

// sleeper is what the dispatcher sleeps on when its timer offers it.
type sleeper interface {
	// Arm sets the end of the next Sleep to d from now and forgets any
	// Wake before it. It reports false when the sleeper cannot be used:
	// the caller then waits on the timer's channel instead.
	Arm(d time.Duration) bool
	// Sleep blocks until the armed time has come or Wake is called after
	// Arm, whichever is first.
	Sleep()
	// Wake ends the current Sleep, or the next one if none is under way.
	// Any goroutine may call it.
	Wake()
}

// runtimeTimer is a DispatchTimer on the runtime's timers.
type runtimeTimer struct{ t *time.Timer }

// NewRuntimeTimer is a stopped DispatchTimer on the runtime's timers alone,
// for waits that need no sub-millisecond accuracy (a file watch's quiet).
func NewRuntimeTimer() DispatchTimer { return newRuntimeTimer() }

func newRuntimeTimer() runtimeTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return runtimeTimer{t}
}

func (r runtimeTimer) C() <-chan time.Time   { return r.t.C }
func (r runtimeTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r runtimeTimer) Stop()                 { r.t.Stop() }
