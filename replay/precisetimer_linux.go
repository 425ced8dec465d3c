package replay

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvload-exporter/kvload-exporter/internal/quietsys"
)

// preciseTimer is a runtime timer for the channel waits (C, Reset, Stop)
// and, for the dispatcher's own waits, a sleeper on a timerfd (see
// precisetimer.go).
type preciseTimer struct {
	runtimeTimer

	mu     sync.Mutex
	file   *os.File        // the timerfd, registered with the poller; nil before the first Arm and after Stop
	raw    syscall.RawConn // file's, for waiting without a read that can only fail
	fd     int             // file's descriptor: File.Fd would put it in blocking mode, out of the poller
	broken bool            // no timerfd could be had or used: Arm reports false from then on

	// The state of one Sleep's wait, kept here so that the function
	// handed to raw.Read is made once: only the dispatcher sleeps.
	polled   bool
	readErr  error
	expiries [8]byte
	readFn   func(fd uintptr) bool
}

func newPreciseTimer() DispatchTimer {
	p := &preciseTimer{runtimeTimer: newRuntimeTimer()}
	p.readFn = p.readExpiry
	return p
}

// Stop stops the runtime timer and releases the timerfd; a later Arm opens
// another.
func (p *preciseTimer) Stop() {
	p.runtimeTimer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.file != nil {
		_ = p.file.Close()
		p.file, p.raw = nil, nil
	}
}

func (p *preciseTimer) Arm(d time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken {
		return false
	}
	if p.file == nil && !p.open() {
		p.broken = true
		return false
	}
	// A zero it_value would disarm the fd: 1 ns is as good as now. Setting
	// it also clears an expiry nobody read.
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(int64(d), 1))}
	if quietsys.TimerfdSettime(uintptr(p.fd), &spec) != 0 || p.file.SetReadDeadline(time.Now().Add(d)) != nil {
		p.closeBroken()
		return false
	}
	return true
}

func (p *preciseTimer) Sleep() {
	p.mu.Lock()
	f, raw := p.file, p.raw
	p.mu.Unlock()
	if f == nil {
		return
	}
	p.polled, p.readErr = false, nil
	err := raw.Read(p.readFn)
	if err == nil {
		err = p.readErr
	}
	switch {
	case err == nil, errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, os.ErrClosed):
		// The fd's expiry, the deadline or a Wake, or Stop.
	default:
		// Not expected of a timerfd; the runtime timer takes over rather
		// than a dispatcher that would spin on a failing read.
		p.mu.Lock()
		if p.file == f {
			p.closeBroken()
		}
		p.mu.Unlock()
	}
}

// readExpiry is Sleep's function for raw.Read, which calls it until it
// returns true and waits for the poller between calls. The fd was just armed
// for later, so the first call only asks for that wait; a call after it
// reads the expiry count, and a read that finds none (a readiness the poller
// kept from an expiry before the last Arm) asks for another wait.
func (p *preciseTimer) readExpiry(fd uintptr) bool {
	if !p.polled {
		p.polled = true
		return false
	}
	_, e := quietsys.Read(fd, p.expiries[:]) // quietly, as Arm's settime (see quietsys)
	if e == unix.EAGAIN {
		return false
	}
	if e != 0 {
		p.readErr = e
	}
	return true
}

// wokenAt is a read deadline long past: set, it ends a read at once.
var wokenAt = time.Unix(1, 0)

func (p *preciseTimer) Wake() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.file != nil {
		_ = p.file.SetReadDeadline(wokenAt)
	}
}

// open creates the timerfd, non-blocking so that os.NewFile registers it
// with the poller. It reports false if that fails.
func (p *preciseTimer) open() bool {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), "timerfd")
	raw, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return false
	}
	p.file, p.raw, p.fd = f, raw, fd
	return true
}

// closeBroken gives up the timerfd for good; p.mu is held.
func (p *preciseTimer) closeBroken() {
	_ = p.file.Close()
	p.file, p.raw = nil, nil
	p.broken = true
}
