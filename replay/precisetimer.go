package replay

import "time"

// The Go runtime's timers are late by up to a millisecond when the process
// is idle: the thread that sleeps for the next timer waits in epoll_wait,
// whose timeout is in whole milliseconds, rounded up below 1 ms. A
// dispatcher on such timers sends 0.5 ms late on average and up to 1 ms
// (docs/benchmarks.md), more than the sub-millisecond accuracy the replay
// aims for.
//
// On Linux, SystemClock's timers are therefore timerfds read through the
// runtime's network poller (precisetimer_linux.go): the kernel's
// high-resolution timer makes the fd readable at the deadline, which wakes
// epoll_wait at once, whatever its timeout. No thread blocks and nothing
// spins; an arming costs one timerfd_settime and a firing one read.
// Elsewhere they are the runtime's timers.

// runtimeTimer is a DispatchTimer on the runtime's timers.
type runtimeTimer struct{ t *time.Timer }

func newRuntimeTimer() runtimeTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return runtimeTimer{t}
}

func (r runtimeTimer) C() <-chan time.Time   { return r.t.C }
func (r runtimeTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r runtimeTimer) Stop()                 { r.t.Stop() }
