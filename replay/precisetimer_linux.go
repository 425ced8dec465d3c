package replay

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// alarmTimer is a runtime timer with a timerfd alarm beside it (see
// precisetimer.go). The runtime timer alone decides what is delivered, with
// its Go 1.23 Reset and Stop guarantees; the timerfd, armed for the same
// deadline and registered with the network poller (edge-triggered, never
// read), only wakes the thread sleeping in epoll_wait on time, which then
// runs the timers that are due. Without the fd (none could be created) the
// timer is the runtime's, as accurate as that is.
type alarmTimer struct {
	t *time.Timer

	mu    sync.Mutex
	alarm *os.File // nil when stopped or when no timerfd could be had
}

// alarmSlack is how long after the deadline the alarm rings. A process at
// work runs due timers at every scheduling point, so the alarm matters only
// when it is idle; ringing a little late lets activity run the timer
// first, and the next Reset then re-arms the alarm before it rings, which
// saves a wake-up of the whole process.
var alarmSlack = 200 * time.Microsecond

func newPreciseTimer() DispatchTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &alarmTimer{t: t}
}

func (a *alarmTimer) C() <-chan time.Time { return a.t.C }

func (a *alarmTimer) Reset(d time.Duration) {
	// The runtime timer first: the alarm, armed after it for as long,
	// rings no earlier than it is due.
	a.t.Reset(d)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.alarm == nil {
		a.alarm = openAlarm()
		if a.alarm == nil {
			return
		}
	}
	// A zero it_value would disarm the fd: 1 ns is as good as now.
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(int64(d+alarmSlack), 1))}
	if err := unix.TimerfdSettime(int(a.alarm.Fd()), 0, &spec, nil); err != nil {
		// Not expected of a valid fd; the runtime timer still fires.
		_ = a.alarm.Close()
		a.alarm = nil
	}
}

// Stop stops the runtime timer and releases the fd.
func (a *alarmTimer) Stop() {
	a.t.Stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.alarm != nil {
		_ = a.alarm.Close()
		a.alarm = nil
	}
}

// openAlarm creates a timerfd, non-blocking so that os.NewFile registers it
// with the poller; nil if that fails.
func openAlarm() *os.File {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), "timerfd")
}
