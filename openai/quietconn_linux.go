//go:build linux && !race

package openai

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/prometheus/common/config"

	"github.com/kvload-exporter/kvload-exporter/internal/quietsys"
)

// transportOptions has the engine clients dial quiet connections; race
// builds keep plain ones, which the race detector can see through (see
// quietsys).
func transportOptions() []config.HTTPClientOption {
	return []config.HTTPClientOption{config.WithDialContextFunc(dialQuiet)}
}

// dialEngine dials an engine's connection for the fast sender.
var dialEngine = dialQuiet

// dialQuiet dials as net.Dialer does and wraps a TCP connection in a
// quietConn.
func dialQuiet(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c, nil // closed already: its first read or write says so
	}
	q := &quietConn{Conn: tc}
	q.r.call, q.r.fn = raw.Read, q.readSome
	q.w.call, q.w.fn = raw.Write, q.writeAll
	return q, nil
}

// quietConn is a TCP connection whose reads and writes are made with
// quietsys on its non-blocking socket (why: see that package), waiting for
// the network poller as net.TCPConn does.
type quietConn struct {
	net.Conn // an interface, so that *net.TCPConn's ReadFrom and WriteTo are not promoted
	r, w     rawCall
}

// rawCall is one direction's state: the function handed to the RawConn is
// made once, so a call allocates nothing, and it finds its buffer here.
type rawCall struct {
	mu   sync.Mutex
	call func(func(fd uintptr) bool) error // the RawConn's Read or Write
	fn   func(fd uintptr) bool             // readSome or writeAll
	buf  []byte
	n    int
	err  error // the system call's
}

// do runs fn on p through the poller: n and ioErr are what fn did, err the
// poller's own failure (a deadline, a closed connection).
func (r *rawCall) do(p []byte) (n int, ioErr, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf, r.n, r.err = p, 0, nil
	err = r.call(r.fn)
	n, ioErr = r.n, r.err
	r.buf = nil
	return n, ioErr, err
}

// maxIO bounds one system call, as the poller's own reads and writes are.
const maxIO = 1 << 30

// CloseWrite shuts down the sending side, as net.TCPConn's does.
func (c *quietConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *quietConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, ioErr, err := c.r.do(p[:min(len(p), maxIO)])
	switch {
	case err != nil:
		return n, c.opError("read", err)
	case errors.Is(ioErr, io.EOF):
		return n, io.EOF // bare, as readers compare it
	case ioErr != nil:
		return n, c.opError("read", ioErr)
	}
	return n, nil
}

func (c *quietConn) readSome(fd uintptr) bool {
	r := &c.r
	n, e := quietsys.Read(fd, r.buf)
	switch {
	case e == syscall.EAGAIN:
		return false
	case e != 0:
		r.err = os.NewSyscallError("read", e)
	case n == 0:
		r.err = io.EOF
	default:
		r.n = n
	}
	return true
}

func (c *quietConn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, ioErr, err := c.w.do(p)
	if err == nil {
		err = ioErr
	}
	if err != nil {
		err = c.opError("write", err)
	}
	return n, err
}

func (c *quietConn) writeAll(fd uintptr) bool {
	w := &c.w
	for w.n < len(w.buf) {
		rest := w.buf[w.n:]
		rest = rest[:min(len(rest), maxIO)]
		n, e := quietsys.Send(fd, rest)
		switch {
		case e == syscall.EAGAIN:
			return false
		case e != 0:
			w.err = os.NewSyscallError("write", e)
			return true
		}
		w.n += n
	}
	return true
}

// opError wraps err as net.TCPConn does, so that net/http and its callers
// see the same errors (a timeout is still a net.Error with Timeout true).
func (c *quietConn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
