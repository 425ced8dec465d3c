package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// errTooLarge is a ZMTP message longer than the subscriber takes.
var errTooLarge = errors.New("message too large")

// errStalled is a peer silent in the middle of a message for longer than
// the limiter's stall: a publisher that hangs, or a half-open connection.
var errStalled = errors.New("silent in the middle of a message")

// ZMTP 3 framing (rfc.zeromq.org/spec/23): a 64-byte greeting, then frames
// of a flags byte (bit 0 more frames follow, bit 1 an 8-byte size, bit 2 a
// command), the size in 1 or 8 big-endian bytes, and the body. The ZMQ
// library reads a command's frames as a message's (more follow while bit 0
// is set), so both are counted alike.
const (
	zmtpGreeting = 64
	flagMore     = 0x01
	flagLong     = 0x02
)

// frameLimiter passes a connection's bytes through and follows its ZMTP
// framing: a frame whose size, with the frames of its message before it,
// exceeds limit, or a message of more than maxFrames frames, fails the
// read that carries the frame's header, so that the ZMQ library never
// allocates its body (it makes a buffer of whatever size a frame header
// says) nor keeps one more frame of the message (an empty frame costs two
// bytes on the wire and a slice header, 24 bytes, in the library).
type frameLimiter struct {
	net.Conn
	limit     uint64
	maxFrames int
	// stall, once set (after the handshake, which has its own deadline),
	// bounds how long a message may go without a byte once it started;
	// between messages a stream may be silent for good. armed: a read
	// deadline is set.
	stall time.Duration
	armed bool

	greeting uint64 // greeting bytes still to pass
	hdr      [9]byte
	hdrLen   int    // header bytes read so far
	body     uint64 // body bytes of the current frame still to pass
	more     bool   // the current frame is not its message's last
	msg      uint64 // bytes of the current message's frames so far
	frames   int    // frames of the current message so far
}

func newFrameLimiter(c net.Conn, limit uint64, maxFrames int) *frameLimiter {
	return &frameLimiter{Conn: c, limit: limit, maxFrames: maxFrames, greeting: zmtpGreeting}
}

func (f *frameLimiter) Read(p []byte) (int, error) {
	if f.stall > 0 {
		mid := f.midMessage()
		if mid {
			// From this read on: a message may be long, but not silent.
			_ = f.SetReadDeadline(time.Now().Add(f.stall))
		} else if f.armed {
			_ = f.SetReadDeadline(time.Time{})
		}
		f.armed = mid
	}
	n, err := f.Conn.Read(p)
	if serr := f.scan(p[:n]); serr != nil {
		return 0, serr
	}
	if err != nil && f.armed && errors.Is(err, os.ErrDeadlineExceeded) {
		return n, fmt.Errorf("%w for %v", errStalled, f.stall)
	}
	return n, err
}

// midMessage tells whether the bytes so far end inside a message: in a
// frame's header or body, or after a frame that more follow.
func (f *frameLimiter) midMessage() bool {
	return f.greeting == 0 && (f.hdrLen > 0 || f.body > 0 || f.more)
}

// scan follows the framing over b.
func (f *frameLimiter) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case f.greeting > 0:
			k := min(uint64(len(b)), f.greeting)
			f.greeting -= k
			b = b[k:]
		case f.body > 0:
			k := min(uint64(len(b)), f.body)
			f.body -= k
			b = b[k:]
			if f.body == 0 && !f.more {
				f.msg, f.frames = 0, 0
			}
		default:
			k := copy(f.hdr[f.hdrLen:f.hdrNeed(b[0])], b)
			f.hdrLen += k
			b = b[k:]
			if f.hdrLen < f.hdrNeed(f.hdr[0]) {
				continue
			}
			if err := f.frame(); err != nil {
				return err
			}
		}
	}
	return nil
}

// hdrNeed is the length of the header that starts with flags (or with the
// first byte at hand when none is read yet).
func (f *frameLimiter) hdrNeed(first byte) int {
	flags := first
	if f.hdrLen > 0 {
		flags = f.hdr[0]
	}
	if flags&flagLong != 0 {
		return 9
	}
	return 2
}

// frame takes a complete header.
func (f *frameLimiter) frame() error {
	flags := f.hdr[0]
	size := uint64(f.hdr[1])
	if flags&flagLong != 0 {
		size = binary.BigEndian.Uint64(f.hdr[1:9])
	}
	f.hdrLen = 0
	if size > f.limit || f.msg+size > f.limit {
		return fmt.Errorf("a frame of %d bytes after %d of its message, more than %d: %w", size, f.msg, f.limit, errTooLarge)
	}
	f.frames++
	if f.frames > f.maxFrames {
		return fmt.Errorf("a message of more than %d frames: %w", f.maxFrames, errTooLarge)
	}
	f.msg += size
	f.more = flags&flagMore != 0
	f.body = size
	if size == 0 && !f.more {
		f.msg, f.frames = 0, 0
	}
	return nil
}
