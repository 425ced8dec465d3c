//go:build linux

package quietsys

import (
	"bytes"
	"encoding/binary"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The kernel's own calls are the truth: what Send wrote, unix.Read reads;
// what unix.Write wrote, Read reads; and a timerfd armed here expires as
// one armed by unix.TimerfdSettime would.

func socketPair(t *testing.T) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func TestReadAndSend(t *testing.T) {
	a, b := socketPair(t)
	buf := make([]byte, 64)
	if n, e := Read(uintptr(a), buf); e != syscall.EAGAIN {
		t.Fatalf("Read of an empty socket = %d, %v; want EAGAIN", n, e)
	}
	if n, e := Send(uintptr(a), []byte("hello")); n != 5 || e != 0 {
		t.Fatalf("Send = %d, %v", n, e)
	}
	if n, err := unix.Read(b, buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("the peer read %q, %v", buf[:n], err)
	}
	if _, err := unix.Write(b, []byte("world")); err != nil {
		t.Fatal(err)
	}
	if n, e := Read(uintptr(a), buf); e != 0 || string(buf[:n]) != "world" {
		t.Fatalf("Read = %q, %v", buf[:n], e)
	}
	unix.Close(b)
	if n, e := Read(uintptr(a), buf); n != 0 || e != 0 {
		t.Fatalf("Read after the peer closed = %d, %v; want 0 (end of stream)", n, e)
	}
	// With the peer gone a send fails, and no SIGPIPE ends the test.
	if _, e := Send(uintptr(a), bytes.Repeat([]byte("x"), 10)); e != syscall.EPIPE {
		t.Fatalf("Send to a closed peer: %v, want EPIPE", e)
	}
}

func TestTimerfdSettime(t *testing.T) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(time.Hour))}
	if e := TimerfdSettime(uintptr(fd), &spec); e != 0 {
		t.Fatal(e)
	}
	var cur unix.ItimerSpec
	if err := unix.TimerfdGettime(fd, &cur); err != nil {
		t.Fatal(err)
	}
	if left := time.Duration(cur.Value.Nano()); left <= 59*time.Minute || left > time.Hour {
		t.Fatalf("armed for an hour, the kernel says %v left", left)
	}
	// Armed for 1 ns, it has expired once by the time a blocking poll says so.
	spec.Value = unix.NsecToTimespec(1)
	if e := TimerfdSettime(uintptr(fd), &spec); e != 0 {
		t.Fatal(e)
	}
	if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1); err != nil {
		t.Fatal(err)
	}
	var count [8]byte
	if n, e := Read(uintptr(fd), count[:]); n != 8 || e != 0 || binary.NativeEndian.Uint64(count[:]) != 1 {
		t.Fatalf("expiry read = %d bytes %v, count %d; want 1", n, e, binary.NativeEndian.Uint64(count[:]))
	}
	if e := TimerfdSettime(^uintptr(0)>>1, &spec); e != syscall.EBADF {
		t.Fatalf("a bad descriptor gave %v, want EBADF", e)
	}
}
