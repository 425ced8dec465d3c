package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
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
