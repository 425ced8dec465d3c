package replay

import "time"

// The Go runtime's timers are late by up to a millisecond when the process
// is idle: the thread that sleeps for the next timer waits in epoll_wait,
// whose timeout is in whole milliseconds, rounded up below 1 ms. A
// dispatcher on such timers sends 0.5 ms late on average and up to 1 ms
// (docs/benchmarks.md), more than the sub-millisecond accuracy the replay
// aims for.
//
// On Linux, SystemClock's timers are therefore runtime timers with a
// timerfd alarm beside them (precisetimer_linux.go): the kernel's
// high-resolution timer makes the fd ready at the deadline, which ends
// epoll_wait at once, whatever its timeout, and the woken thread runs the
// runtime timer that has just come due. No thread blocks, nothing spins,
// and no goroutine is added; an arming costs one timerfd_settime call, and
// a firing one more wake-up of an idle process than the runtime's timers
// would take (BenchmarkDispatchAlarmSlack measures both).
// Elsewhere they are the runtime's timers alone.

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
