//go:build linux

package main

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The sink's handler runs when its process gets a CPU, which at 5,000/s on
// two cores can be tens of milliseconds after the request reached its
// socket: a lag measured there is the sink's run queue as much as the
// tool's. The kernel stamps each segment as it is received, and on the
// loopback that happens inside the sender's write, so the stamp on a
// request's first bytes is the instant the tool sent it, whatever the
// sink's scheduling. The sink asks for the stamps (SO_TIMESTAMPNS) on its
// listening socket, which every accepted one inherits, and keeps both times.

// wireListener accepts connections that read with the kernel's receive
// stamps.
type wireListener struct{ net.Listener }

// newWireListener asks for the stamps on the listening socket: an accepted
// socket inherits the option, so even a request that comes before Accept
// returns is stamped.
func newWireListener(ln net.Listener) wireListener {
	if tl, ok := ln.(*net.TCPListener); ok {
		if raw, err := tl.SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) })
		}
	}
	return wireListener{ln}
}

func (l wireListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		if raw, err := tc.SyscallConn(); err == nil {
			return &wireConn{TCPConn: tc, raw: raw}, nil
		}
	}
	return c, nil // no stamps: the handler's clock stands in
}

// wireConn reads with recvmsg to get the receive stamp of every read.
type wireConn struct {
	*net.TCPConn
	raw syscall.RawConn
	// first is the receive stamp (Unix ns) of the first bytes read since
	// the handler last took it: a request's, since neither tool pipelines.
	first atomic.Int64
	oob   [64]byte // one reader at a time: the server's
}

func (c *wireConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n, oobn int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), p, c.oob[:], 0)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	if n == 0 {
		return 0, io.EOF
	}
	if ts := receiveStamp(c.oob[:oobn]); ts != 0 {
		c.first.CompareAndSwap(0, ts)
	}
	return n, nil
}

// receiveStamp is the SO_TIMESTAMPNS stamp among a read's control
// messages, in Unix nanoseconds; 0 if there is none.
func receiveStamp(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := (*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			return ts.Nano()
		}
	}
	return 0
}

type wireConnKey struct{}

// withWireConn is the server's ConnContext: the handler finds its
// connection's stamps through the request's context.
func withWireConn(ctx context.Context, c net.Conn) context.Context {
	if wc, ok := c.(*wireConn); ok {
		return context.WithValue(ctx, wireConnKey{}, wc)
	}
	return ctx
}

// takeReceiveStamp returns the receive stamp of the request being served
// on ctx's connection and forgets it; 0 when there is none.
func takeReceiveStamp(ctx context.Context) int64 {
	wc, ok := ctx.Value(wireConnKey{}).(*wireConn)
	if !ok {
		return 0
	}
	return wc.first.Swap(0)
}
