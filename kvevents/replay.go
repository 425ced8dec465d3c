package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// vLLM's replay socket (KVEventsConfig.replay_endpoint): a ZMQ ROUTER that
// keeps the engine's last buffer_steps batches (10,000 by default). A
// client (a DEALER here, which puts the empty delimiter a REQ socket would)
// sends the first sequence number it wants as 8 bytes big-endian; the
// engine answers every batch it kept from there on, each a message of the
// delimiter, the sequence number and the payload, then an end marker whose
// sequence number is -1 and whose payload is empty. Since vLLM v0.26.0
// (vllm#45177) the topic comes before the sequence number, as on the PUB
// socket, the end marker's empty; both layouts are read.
// (vllm/distributed/kv_events.py, ZmqEventPublisher._service_replay.)

const (
	// MaxReplayBatches bounds the batches one gap may be filled with: a
	// longer gap is not asked for (vLLM keeps 10,000 by default).
	MaxReplayBatches = 1 << 14
	// lateJoinBatches: a stream whose first batch is numbered at most this
	// came to an engine that had just started, and whose first batches went
	// out while the subscription was still on its way (ZeroMQ's slow
	// joiner). They are asked of the replay socket like a gap's: without
	// them the prompts stored first, which later prompts chain from, are
	// never known. A later first batch is an engine long running, whose
	// older blocks the stream cannot know anyway.
	lateJoinBatches = 64
	// replayTimeout bounds one replay, from the connection to the last
	// batch wanted: the stream's own messages wait meanwhile.
	replayTimeout = 30 * time.Second
)

// endSeq is the sequence number of the replay's end marker, -1.
const endSeq = ^uint64(0)

// errReplayShort is a replay that ended before the last batch wanted: the
// engine no longer kept them, or did not say.
var errReplayShort = errors.New("the replay ended short")

// replayBatch is one batch a replay gave back, as taken.
type replayBatch struct {
	seq   uint64
	batch Batch
}

// fetchReplay asks the replay socket at addr for batches from to to-1 and
// hands each to apply, in order, until it has them all, the socket ends
// its answer or fails, or ctx ends. It returns how many it handed over.
// A batch that does not follow the one before (the engine kept fewer)
// ends it.
func fetchReplay(ctx context.Context, addr string, from, to uint64, stall time.Duration, apply func(replayBatch)) (uint64, error) {
	d := net.Dialer{Timeout: dialTimeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer raw.Close()
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	// The whole replay within replayTimeout; each message within stall
	// besides, from the limiter.
	_ = raw.SetDeadline(time.Now().Add(replayTimeout))
	lim := newFrameLimiter(raw, MaxMessageBytes, MaxMessageFrames)
	zc, err := zmq4.Open(lim, null.Security(), zmq4.Dealer, zmq4.SocketIdentity(""), false, nil)
	if err != nil {
		return 0, err
	}
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, from))); err != nil {
		return 0, err
	}
	lim.stall = stall
	next := from
	for next < to {
		msg, err := zc.RecvMsg()
		if err != nil {
			return next - from, err
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		seq, payload, end, err := parseReply(msg.Frames)
		if err != nil {
			return next - from, err
		}
		switch {
		case end:
			return next - from, fmt.Errorf("%w: batches %d to %d wanted, the engine sent up to %d", errReplayShort, from, to-1, next-1)
		case seq < next:
			continue // sent again, or before what was asked
		case seq > next:
			return next - from, fmt.Errorf("%w: batch %d wanted, the engine kept from %d on", errReplayShort, next, seq)
		}
		b, err := Decode(payload)
		if err != nil {
			return next - from, fmt.Errorf("replayed batch %d: %w", seq, err)
		}
		apply(replayBatch{seq: seq, batch: b})
		next++
	}
	return next - from, nil
}

// parseReply reads one replay message's frames: the empty delimiter, then
// the sequence number and payload, the topic before them since vLLM
// v0.26.0. end is the end marker.
func parseReply(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	if len(frames) == 0 || len(frames[0]) != 0 {
		return 0, nil, false, errors.New("a replay message without its empty delimiter")
	}
	rest := frames[1:]
	switch {
	case len(rest) == 2 && len(rest[0]) == 8:
		seq, payload = binary.BigEndian.Uint64(rest[0]), rest[1]
	case len(rest) == 3 && len(rest[1]) == 8:
		seq, payload = binary.BigEndian.Uint64(rest[1]), rest[2]
	default:
		return 0, nil, false, fmt.Errorf("a replay message of %d frames, not a delimiter, [topic,] an 8-byte sequence number and a payload", len(frames))
	}
	if seq == endSeq {
		if len(payload) != 0 {
			return 0, nil, false, errors.New("the replay's end marker carries a payload")
		}
		return seq, nil, true, nil
	}
	return seq, payload, false, nil
}
