//go:build linux

// Package quietsys makes system calls that cannot block, on non-blocking
// file descriptors, without telling the Go scheduler. A plain call
// (syscall.Read, unix.TimerfdSettime) first enters the scheduler's
// system-call state. When the process had been idle, that wakes the
// runtime's monitor thread (sysmon), which then polls every 20 µs until the
// process is idle again. The exporter falls idle between most of the
// tokens it reads, so plain calls woke the monitor thousands of times a
// second (docs/benchmarks.md, "Raw reads and writes on the engine
// connections").
//
// A file descriptor given here must be non-blocking: a call that blocked
// would hold its processor. Buffers handed between goroutines through a
// socket are invisible to the race detector when read or written here, so
// sockets use these calls only in builds without -race.
package quietsys

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read and Send make their call again when a signal interrupted it
// (EINTR), as the os and net packages do, so no caller sees EINTR.

// Read reads into p, which must not be empty.
func Read(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

// Send writes p, which must not be empty, to a socket; a peer that has
// gone is EPIPE, not a SIGPIPE (MSG_NOSIGNAL).
func Send(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), syscall.MSG_NOSIGNAL, 0, 0)
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

// TimerfdSettime arms the timerfd fd, relative to now.
func TimerfdSettime(fd uintptr, spec *unix.ItimerSpec) syscall.Errno {
	_, _, e := syscall.RawSyscall6(unix.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(spec)), 0, 0, 0)
	return e
}
