package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// TestFrameLimiter: the limiter follows the framing however the bytes are
// cut, lets messages up to the limits through, and fails the read that
// carries the header of a frame that would take its message past them:
// its bytes, or its frames (empty frames, which cost the library a slice
// header each and the sender two bytes, are counted as any other).
func TestFrameLimiter(t *testing.T) {
	greeting := bytes.Repeat([]byte{0xff}, zmtpGreeting)
	big := bytes.Repeat([]byte{'x'}, 300) // a long frame
	empty := func(n int) [][]byte { return make([][]byte, n) }
	cases := []struct {
		name   string
		stream []byte
		limit  uint64
		tooBig bool
	}{
		{"messages within the limit", cat(greeting, message([]byte("t"), seqFrame(0), big), message([]byte("t"), seqFrame(1), big)), 309, false},
		{"a message's frames together past it", cat(greeting, message([]byte("t"), seqFrame(0), big)), 308, true},
		{"one long frame past it", cat(greeting, message(big)), 299, true},
		{"the limit starts again at each message", cat(greeting, message(big), message(big), message(big)), 300, false},
		{"as many empty frames as a message takes", cat(greeting, message(empty(testFrames)...)), 300, false},
		{"one empty frame more", cat(greeting, message(empty(testFrames+1)...)), 300, true},
		{"an endless message of empty frames", cat(greeting, bytes.Repeat([]byte{flagMore, 0}, 100_000)), 300, true},
		{"the frames start again at each message", cat(greeting, message(empty(testFrames)...), message(empty(testFrames)...)), 300, false},
	}
	for _, c := range cases {
		for _, cut := range []int{1, 2, 7, len(c.stream)} {
			f := newFrameLimiter(nil, c.limit, testFrames)
			var err error
			for b := c.stream; len(b) > 0 && err == nil; {
				k := min(cut, len(b))
				err = f.scan(b[:k])
				b = b[k:]
			}
			if got := errors.Is(err, errTooLarge); got != c.tooBig {
				t.Errorf("%s, cut every %d bytes: %v, want too large %v", c.name, cut, err, c.tooBig)
			}
		}
	}
}

// deadlineConn serves in and records the read deadline in force at each
// Read: what would end a silence there, whatever its length.
type deadlineConn struct {
	net.Conn // unset: only Read and SetReadDeadline are called
	in       []byte
	deadline time.Time
	reads    []time.Time
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error { c.deadline = t; return nil }

func (c *deadlineConn) Read(p []byte) (int, error) {
	c.reads = append(c.reads, c.deadline)
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.in)
	c.in = c.in[n:]
	return n, nil
}

// TestFrameLimiterStall: a read that begins inside a message (a frame's
// header or body, or after a frame that more follow) has a deadline of
// the stall, so that a publisher silent there is cut off; one that begins
// in the greeting or between messages has none, so that a stream may be
// idle between messages for as long as it likes. The deadlines are
// judged, not waited out: no silence has to outlast another.
func TestFrameLimiterStall(t *testing.T) {
	const stall = time.Minute
	greeting := bytes.Repeat([]byte{0xff}, zmtpGreeting)
	msgs := [][]byte{
		message([]byte("kv"), seqFrame(0), bytes.Repeat([]byte{'x'}, 300)), // a long frame
		message([]byte("kv"), seqFrame(1), []byte("batch")),
		message([]byte("single")),
	}
	// Where a silence may last: the offsets that end the greeting or a
	// message.
	between := []int{len(greeting)}
	stream := slices.Clone(greeting)
	for _, m := range msgs {
		stream = append(stream, m...)
		between = append(between, len(stream))
	}
	// The library reads a frame's header (2 or 9 bytes) and then its body;
	// other cuts too, down to a byte at a time.
	for _, cut := range []int{1, 2, 7, 9, len(stream)} {
		conn := &deadlineConn{in: stream}
		f := newFrameLimiter(conn, MaxMessageBytes, MaxMessageFrames)
		f.stall = stall
		var starts []int
		var begun []time.Time
		buf := make([]byte, cut)
		for off := 0; off < len(stream); {
			starts, begun = append(starts, off), append(begun, time.Now())
			n, err := f.Read(buf)
			if err != nil {
				t.Fatalf("cut every %d bytes, read at %d: %v", cut, off, err)
			}
			off += n
		}
		for i, off := range starts {
			deadline := conn.reads[i]
			inside := off > len(greeting) && !slices.Contains(between, off)
			switch {
			case inside && (deadline.IsZero() || deadline.Sub(begun[i]) < stall):
				t.Errorf("cut every %d bytes: the read at %d, inside a message, has deadline %v, want the stall (%v) from its start", cut, off, deadline, stall)
			case !inside && !deadline.IsZero():
				t.Errorf("cut every %d bytes: the read at %d, between messages, has deadline %v, want none", cut, off, deadline)
			}
		}
	}
}

// testFrames is the frame limit of TestFrameLimiter.
const testFrames = 5

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// message frames a ZMTP message of frames (short or long as they need).
func message(frames ...[]byte) []byte {
	var out []byte
	for i, f := range frames {
		flags := byte(0)
		if i < len(frames)-1 {
			flags |= flagMore
		}
		if len(f) > 255 {
			out = append(out, flags|flagLong)
			out = binary.BigEndian.AppendUint64(out, uint64(len(f)))
		} else {
			out = append(out, flags, byte(len(f)))
		}
		out = append(out, f...)
	}
	return out
}

func seqFrame(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// FuzzFrameLimiter: no stream panics the limiter, the bytes' cut never
// changes what it decides, and a stream it lets through holds no message
// past its limits, as a plain reading of the framing counts them.
func FuzzFrameLimiter(f *testing.F) {
	greeting := bytes.Repeat([]byte{0xff}, zmtpGreeting)
	f.Add(cat(greeting, message([]byte("t"), seqFrame(0), []byte("payload"))), uint8(3))
	f.Add(cat(greeting, bytes.Repeat([]byte{flagMore, 0}, 20)), uint8(1))
	f.Add(cat(greeting, []byte{flagLong}, binary.BigEndian.AppendUint64(nil, 1<<40)), uint8(5))
	const limit, frames = 64, 4
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8) {
		whole := newFrameLimiter(nil, limit, frames).scan(stream)
		step := max(int(cut), 1)
		cutUp := newFrameLimiter(nil, limit, frames)
		var err error
		for b := stream; len(b) > 0 && err == nil; b = b[min(step, len(b)):] {
			err = cutUp.scan(b[:min(step, len(b))])
		}
		if (whole == nil) != (err == nil) {
			t.Fatalf("whole: %v; cut every %d bytes: %v", whole, step, err)
		}
		if whole != nil {
			return
		}
		// The plain reading: every complete frame header, message by message.
		b := stream[min(zmtpGreeting, len(stream)):]
		msgBytes, msgFrames := uint64(0), 0
		for len(b) >= 2 {
			flags, size, hdr := b[0], uint64(b[1]), 2
			if flags&flagLong != 0 {
				if len(b) < 9 {
					break
				}
				size, hdr = binary.BigEndian.Uint64(b[1:9]), 9
			}
			msgBytes += size
			msgFrames++
			if msgBytes > limit || msgFrames > frames {
				t.Fatalf("let through a message of %d bytes in %d frames", msgBytes, msgFrames)
			}
			if uint64(len(b)-hdr) < size {
				break
			}
			b = b[hdr+int(size):]
			if flags&flagMore == 0 {
				msgBytes, msgFrames = 0, 0
			}
		}
	})
}
