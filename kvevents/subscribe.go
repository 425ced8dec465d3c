package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// ErrorReason is why a stream's events were not all taken: a label value
// of kvload_kv_events_errors_total.
type ErrorReason string

// The reasons of kvload_kv_events_errors_total.
const (
	// ReasonUnreachable: a connection to the endpoint failed.
	ReasonUnreachable ErrorReason = "unreachable"
	// ReasonDisconnected: an open stream broke.
	ReasonDisconnected ErrorReason = "disconnected"
	// ReasonDecode: a message was not an event batch.
	ReasonDecode ErrorReason = "decode"
	// ReasonTooLarge: a message was longer than MaxMessageBytes.
	ReasonTooLarge ErrorReason = "too_large"
	// ReasonGap: batches the sequence numbers skipped, one count each.
	ReasonGap ErrorReason = "gap"
	// ReasonRestart: the sequence numbers went back, or jumped by more
	// than MaxSequenceJump: the engine started again (or the number means
	// nothing), and what the stream held is let go.
	ReasonRestart ErrorReason = "restart"
	// ReasonUnlinked: stored blocks whose parent the stream never saw
	// stored, one count each: they cannot be keyed by their tokens.
	ReasonUnlinked ErrorReason = "unlinked"
	// ReasonOverflow: stored blocks not kept, the store being full, or
	// whose token ids do not fill their blocks.
	ReasonOverflow ErrorReason = "overflow"
	// ReasonStalled: the publisher went silent in the middle of a message
	// for longer than stallTimeout; the connection is dropped.
	ReasonStalled ErrorReason = "stalled"
	// ReasonReplay: a gap the replay socket did not fill, one count a
	// gap: it failed, or the engine no longer kept the batches. What it
	// did not give back counts as gap.
	ReasonReplay ErrorReason = "replay"
)

// ErrorReasons lists every reason, for initialising series.
var ErrorReasons = [...]ErrorReason{ReasonUnreachable, ReasonDisconnected, ReasonDecode, ReasonTooLarge, ReasonGap,
	ReasonRestart, ReasonUnlinked, ReasonOverflow, ReasonStalled, ReasonReplay}

// MaxMessageBytes bounds one message (topic, sequence and payload): a
// prefill of 128k tokens is about 700 KB of token ids.
const MaxMessageBytes = 32 << 20

// MaxMessageFrames bounds the frames of one message, counted as their
// headers arrive: vLLM sends 3 (topic, sequence number, payload).
const MaxMessageFrames = 16

const (
	dialTimeout      = 3 * time.Second
	handshakeTimeout = 5 * time.Second
	// stallTimeout is how long a publisher may be silent in the middle of
	// a message: vLLM sends a message's frames at once.
	stallTimeout = 10 * time.Second
	// Reconnection waits from firstRetry, doubling up to maxRetry.
	firstRetry = 250 * time.Millisecond
	maxRetry   = 30 * time.Second
)

// Reporter hears what a followed stream does. Its methods are called from
// the stream's goroutine and must not block for long.
type Reporter interface {
	// Up says the stream connected (true) or lost its connection (false).
	Up(s *Stream, up bool)
	// Batch says a batch was applied, with what was wrong in it.
	Batch(s *Stream, a Applied)
	// Error counts n events of reason, err saying more where there is one.
	Error(s *Stream, reason ErrorReason, n int, err error)
}

// Address checks a configured endpoint, tcp://host:port, and returns its
// host:port.
func Address(endpoint string) (string, error) {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q: only tcp://host:port endpoints are supported", endpoint)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q: %w", endpoint, err)
	}
	if n, err := strconv.ParseUint(port, 10, 64); err == nil && n == 0 {
		port = "0" // however many zeros: no port
	}
	if host == "" || host == "*" || port == "" || port == "0" || port == "*" {
		return "", fmt.Errorf("%q: a subscriber needs a host and a port", endpoint)
	}
	return addr, nil
}

// Follow subscribes to s's endpoint and applies every batch to s until ctx
// ends, connecting again, with a growing wait, whenever the connection
// fails or breaks. With s.Replay, the batches a gap skipped, and those an
// engine just started sent before the subscription took, are
// asked of the engine's replay socket before the batch after them is
// applied.
func Follow(ctx context.Context, s *Stream, r Reporter) {
	defer s.markTried()
	addr, err := Address(s.Endpoint)
	if err != nil {
		r.Error(s, ReasonUnreachable, 1, err)
		return
	}
	replay := ""
	if s.Replay != "" {
		if replay, err = Address(s.Replay); err != nil {
			r.Error(s, ReasonReplay, 1, fmt.Errorf("kv events replay: %w", err))
		}
	}
	wait := firstRetry
	for ctx.Err() == nil {
		err := session(ctx, s, addr, replay, r, func() { wait = firstRetry })
		s.markTried()
		if ctx.Err() != nil {
			return
		}
		reason := ReasonUnreachable
		switch {
		case errors.Is(err, errTooLarge):
			reason = ReasonTooLarge
		case errors.Is(err, errStalled):
			reason = ReasonStalled
		case errors.Is(err, errSessionBroke):
			reason = ReasonDisconnected
		}
		r.Error(s, reason, 1, fmt.Errorf("kv events %s: %w", s.Endpoint, err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, maxRetry)
	}
}

// errSessionBroke marks the end of a session that had connected.
var errSessionBroke = errors.New("connection lost")

// session connects once and applies batches until the connection ends,
// asking replay (host:port, "" for none) for the batches of each gap.
// connected runs once the handshake is done.
func session(ctx context.Context, s *Stream, addr, replay string, r Reporter, connected func()) error {
	d := net.Dialer{Timeout: dialTimeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer raw.Close()
	// Closing the connection is what ends a read blocked in the library.
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	_ = raw.SetDeadline(time.Now().Add(handshakeTimeout))
	lim := newFrameLimiter(raw, MaxMessageBytes, MaxMessageFrames)
	zc, err := zmq4.Open(lim, null.Security(), zmq4.Sub, zmq4.SocketIdentity(""), false, nil)
	if err != nil {
		return err
	}
	// Every topic: vLLM's is empty unless configured, and the exporter
	// is told endpoints, not topics.
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil {
		return err
	}
	_ = raw.SetDeadline(time.Time{})
	lim.stall = s.stall
	s.Connected(time.Now())
	s.markTried()
	r.Up(s, true)
	defer func() {
		s.Disconnected()
		r.Up(s, false)
	}()
	connected()
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return fmt.Errorf("%w: %w", errSessionBroke, err)
		}
		if msg.Type == zmq4.CmdMsg {
			continue // a PING, answered by the library
		}
		at := time.Now()
		seq, b, err := parseMessage(msg.Frames)
		if err != nil {
			s.Lost(at)
			r.Error(s, ReasonDecode, 1, fmt.Errorf("kv events %s: %w", s.Endpoint, err))
			continue
		}
		if replay != "" {
			if from, after, ok := s.gapBefore(seq, MaxReplayBatches); ok {
				fillGap(ctx, s, replay, from, seq, engineClock(at, b.TS), after, at, r)
			}
		}
		a := s.Apply(ctx, seq, &b, s.clock(at, b.TS))
		if ctx.Err() != nil {
			return ctx.Err() // stopped, perhaps half-way through the batch
		}
		r.Batch(s, a)
	}
}

// fillGap asks the replay socket at replay for batches from to to-1, which
// came between the batches taken at after and at, and applies those it
// gives back. Each is timed by its own clock, offset to the exporter's
// (offset), within (after, at]: what a request sent meanwhile met. A
// classification waits for it.
func fillGap(ctx context.Context, s *Stream, replay string, from, to uint64, offset time.Duration, after, at time.Time, r Reporter) {
	defer s.startReplay()()
	prev := after
	_, err := fetchReplay(ctx, replay, from, to, s.stall, func(rb replayBatch) {
		t := at
		if offset != noOffset {
			t = time.Unix(0, int64(rb.batch.TS*1e9)).Add(offset)
		}
		if t.After(at) {
			t = at
		}
		if t.Before(prev) {
			t = prev
		}
		prev = t
		r.Batch(s, s.Apply(ctx, rb.seq, &rb.batch, t))
	})
	if err != nil && ctx.Err() == nil {
		r.Error(s, ReasonReplay, 1, fmt.Errorf("kv events replay %s of batches %d to %d: %w", s.Replay, from, to-1, err))
	}
}

// noOffset: the engine's clock cannot be read.
const noOffset = time.Duration(math.MinInt64)

// engineClock is the exporter's clock less the engine's, from a batch of
// engine time ts taken at at.
func engineClock(at time.Time, ts float64) time.Duration {
	if math.IsNaN(ts) || ts <= 0 || ts > math.MaxInt64/1e9 {
		return noOffset
	}
	return at.Sub(time.Unix(0, int64(ts*1e9)))
}

// parseMessage reads a message's frames: topic, 8-byte big-endian
// sequence number, payload.
func parseMessage(frames [][]byte) (uint64, Batch, error) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		return 0, Batch{}, fmt.Errorf("a message of %d frames, not topic, 8-byte sequence number and payload", len(frames))
	}
	seq := binary.BigEndian.Uint64(frames[1])
	b, err := Decode(frames[2])
	if err != nil {
		return seq, Batch{}, fmt.Errorf("batch %d: %w", seq, err)
	}
	return seq, b, nil
}
