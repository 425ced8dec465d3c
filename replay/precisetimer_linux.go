package replay

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// fdTimer is a DispatchTimer on a timerfd (see precisetimer.go). A goroutine
// reads the fd while the timer is armed or between armings; Stop closes the
// fd, which ends it, and a later Reset opens a new one. Where no timerfd can
// be had the timer falls back to the runtime's.
type fdTimer struct {
	c chan time.Time // capacity 1

	mu       sync.Mutex
	f        *os.File // the timerfd; nil when stopped or unavailable
	done     chan struct{}
	deadline time.Time
	armed    bool // reset and not yet fired or stopped
	fallback *time.Timer
}

func newPreciseTimer() DispatchTimer {
	return &fdTimer{c: make(chan time.Time, 1)}
}

func (t *fdTimer) C() <-chan time.Time { return t.c }

// Reset arms the timer to fire once d from now. As with Go 1.23 timers, no
// value of an earlier arming is received after it returns.
func (t *fdTimer) Reset(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.drainLocked()
	t.deadline, t.armed = time.Now().Add(d), true
	if t.fallback == nil && t.f == nil && !t.openLocked() {
		t.fallback = time.AfterFunc(time.Hour, t.fire)
		t.fallback.Stop()
	}
	if t.fallback != nil {
		t.fallback.Reset(d)
		return
	}
	// A zero it_value disarms a timerfd: 1 ns is as good as now.
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(int64(d), 1))}
	if err := unix.TimerfdSettime(int(t.f.Fd()), 0, &spec, nil); err != nil {
		// Not expected of a valid fd; fire rather than never.
		t.fireLocked()
	}
}

// Stop disarms the timer and releases its fd; no value of an earlier arming
// is received after it returns.
func (t *fdTimer) Stop() {
	t.mu.Lock()
	t.drainLocked()
	t.armed = false
	if t.fallback != nil {
		t.fallback.Stop()
	}
	f, done := t.f, t.done
	t.f, t.done = nil, nil
	t.mu.Unlock()
	if f != nil {
		_ = f.Close() // wakes the reader, which then exits
		<-done
	}
}

func (t *fdTimer) drainLocked() {
	select {
	case <-t.c:
	default:
	}
}

// openLocked creates the timerfd, non-blocking so that os.NewFile puts it
// in the poller, and starts its reader.
func (t *fdTimer) openLocked() bool {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return false
	}
	t.f, t.done = os.NewFile(uintptr(fd), "timerfd"), make(chan struct{})
	go t.read(t.f, t.done)
	return true
}

// read waits for expirations until f is closed.
func (t *fdTimer) read(f *os.File, done chan struct{}) {
	defer close(done)
	var buf [8]byte // the expiration count, which the timer does not need
	for {
		if _, err := f.Read(buf[:]); err != nil {
			return
		}
		t.fire()
	}
}

func (t *fdTimer) fire() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fireLocked()
}

// fireLocked delivers the current arming once its deadline has passed. An
// expiration of an earlier arming, read after a Reset, finds the new
// deadline still ahead (timers never expire early) and is ignored.
func (t *fdTimer) fireLocked() {
	now := time.Now()
	if !t.armed || now.Before(t.deadline) {
		return
	}
	t.armed = false
	select {
	case t.c <- now:
	default:
	}
}
