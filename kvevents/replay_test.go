package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// followStream runs Follow on s until the test ends.
func followStream(t *testing.T, s *Stream) *recorder {
	t.Helper()
	r := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Follow(ctx, s, r)
	}()
	t.Cleanup(func() {
		cancel()
		testutil.Wait(t, "Follow to return", done)
	})
	return r
}

// wireBatch encodes an EventBatch of events as vLLM's map encoding does.
func wireBatch(t *testing.T, ts float64, events ...map[string]any) []byte {
	t.Helper()
	evs := make([]any, len(events))
	for i, e := range events {
		evs[i] = e
	}
	b, err := msgpack.Marshal([]any{ts, evs, 0})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wireStored(parent any, tokens []uint32, hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
		"token_ids": tokens, "block_size": 4, "medium": "GPU", "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
}

func wireRemoved(hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 0}
}

// fakeReplay is an engine's replay socket: it answers every request with
// the batches it keeps from the one asked on, in one of vLLM's layouts.
type fakeReplay struct {
	l     net.Listener
	asked chan uint64
}

func newFakeReplay(t *testing.T, withTopic bool, kept map[uint64][]byte) *fakeReplay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeReplay{l: l, asked: make(chan uint64, 4)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			f.answer(c, withTopic, kept)
			c.Close()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return f
}

func (f *fakeReplay) answer(c net.Conn, withTopic bool, kept map[uint64][]byte) {
	zc, err := zmq4.Open(c, null.Security(), zmq4.Router, zmq4.SocketIdentity("replay"), true, nil)
	if err != nil {
		return
	}
	req, err := zc.RecvMsg()
	if err != nil || len(req.Frames) != 2 || len(req.Frames[0]) != 0 || len(req.Frames[1]) != 8 {
		return
	}
	from := binary.BigEndian.Uint64(req.Frames[1])
	f.asked <- from
	reply := func(topic, seq, payload []byte) {
		frames := [][]byte{{}, seq, payload}
		if withTopic {
			frames = [][]byte{{}, topic, seq, payload}
		}
		_ = zc.SendMsg(zmq4.NewMsgFrom(frames...))
	}
	for seq := from; seq < from+16; seq++ {
		if p, ok := kept[seq]; ok {
			reply([]byte("kv"), seqFrame(seq), p)
		}
	}
	reply([]byte{}, seqFrame(endSeq), []byte{})
	// Until the subscriber hangs up.
	_, _ = zc.RecvMsg()
}

func (f *fakeReplay) endpoint() string { return "tcp://" + f.l.Addr().String() }

// TestFollowReplay: the batches a gap skipped are asked of the replay
// socket, in either of vLLM's reply layouts, and applied before the batch
// after them: the blocks they left held are held, and no gap is counted.
// A replay that ends short (the engine kept fewer) counts a failed replay
// and the batches still missing as a gap, and loses sight of the blocks.
func TestFollowReplay(t *testing.T) {
	first := wireBatch(t, 1, wireStored(nil, toks(1, 12), 11, 12, 13))
	lostRemoval := wireBatch(t, 2, wireRemoved(13))
	lostStore := wireBatch(t, 3, wireStored(uint64(13), toks(50, 4), 50))
	after := wireBatch(t, 4, wireStored(nil, toks(100, 4), 100))
	cases := []struct {
		name      string
		withTopic bool
		kept      map[uint64][]byte
		gap       int
		replays   int
		want      Tally // of the first prompt's three blocks
	}{
		{"before v0.26.0: sequence and payload", false, map[uint64][]byte{1: lostRemoval, 2: lostStore, 3: after}, 0, 0,
			Tally{ClassUnexplained: 8, ClassEvicted: 4}},
		{"since v0.26.0: topic first", true, map[uint64][]byte{1: lostRemoval, 2: lostStore, 3: after}, 0, 0,
			Tally{ClassUnexplained: 8, ClassEvicted: 4}},
		{"the engine kept fewer", true, map[uint64][]byte{2: lostStore, 3: after}, 2, 1,
			Tally{ClassEvicted: 12}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newFakePublisher(t)
			rp := newFakeReplay(t, c.withTopic, c.kept)
			s := NewStream(p.endpoint())
			s.Replay = rp.endpoint()
			r := followStream(t, s)
			conn := testutil.Wait(t, "the subscriber's connection", p.conns)
			for _, m := range [][]byte{message([]byte("kv"), seqFrame(0), first), message([]byte("kv"), seqFrame(3), after)} {
				if _, err := conn.Write(m); err != nil {
					t.Fatal(err)
				}
			}
			if got := testutil.Wait(t, "the replay asked for", rp.asked); got != 1 {
				t.Errorf("replay asked from batch %d, want 1", got)
			}
			testutil.Eventually(t, "every batch taken", func() (bool, string) {
				g := r.get()
				return g.batches == 4-c.gap, r.String()
			})
			g := r.get()
			if g.errs[ReasonGap] != 0 || int(g.applied.Missed) != c.gap || g.errs[ReasonReplay] != c.replays {
				t.Errorf("%s: want %d batches missed, %d replays failed", r, c.gap, c.replays)
			}
			checkFirstPrompt(t, s, c.want)
		})
	}
}

// checkFirstPrompt classifies a miss of the first prompt's 12 tokens,
// sent and answered now, against s, and wants want.
func checkFirstPrompt(t *testing.T, s *Stream, want Tally) {
	t.Helper()
	now := time.Now()
	got, err := Classify([]*Stream{s}, Miss{Tokens: prompt, From: 0, To: 12, Sent: now, Until: now})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Classify: %v, want %v", got, want)
	}
}

// TestFollowReplayJoinedLate: a stream whose first batch is numbered
// shortly after the engine's start asks the replay socket for the batches
// before it, which went out while the subscription was on its way: the
// first prompt's blocks, stored in batch 0, are held, not never stored.
// Later, a stream that joins an engine long running asks for nothing.
func TestFollowReplayJoinedLate(t *testing.T) {
	kept := map[uint64][]byte{
		0: wireBatch(t, 1, wireStored(nil, toks(1, 12), 11, 12, 13)),
		1: wireBatch(t, 2, wireStored(uint64(13), toks(50, 4), 50)),
	}
	cases := []struct {
		name   string
		first  uint64 // the sequence number of the first batch the stream takes
		asked  bool
		want   Tally
		events int // batches taken
	}{
		{"batch 2 first: 0 and 1 asked for", 2, true, Tally{ClassUnexplained: 12}, 3},
		{"a first batch past lateJoinBatches: nothing asked", lateJoinBatches + 1, false, Tally{ClassNeverStored: 12}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newFakePublisher(t)
			rp := newFakeReplay(t, true, kept)
			s := NewStream(p.endpoint())
			s.Replay = rp.endpoint()
			r := followStream(t, s)
			conn := testutil.Wait(t, "the subscriber's connection", p.conns)
			live := wireBatch(t, 3, wireStored(nil, toks(100, 4), 100))
			if _, err := conn.Write(message([]byte("kv"), seqFrame(c.first), live)); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, "every batch taken", func() (bool, string) {
				return r.get().batches == c.events, r.String()
			})
			if c.asked {
				if got := testutil.Wait(t, "the replay asked for", rp.asked); got != 0 {
					t.Errorf("replay asked from batch %d, want 0", got)
				}
			} else if len(rp.asked) != 0 {
				t.Errorf("replay asked from batch %d, want nothing asked", <-rp.asked)
			}
			if g := r.get(); g.errs[ReasonGap] != 0 || g.errs[ReasonReplay] != 0 || g.applied.Missed != 0 {
				t.Errorf("%s: want no gap and no failed replay", r)
			}
			checkFirstPrompt(t, s, c.want)
		})
	}
}

// TestFollowStalled: a publisher silent in the middle of a message is a
// stalled stream: counted, and not followed, rather than waited for.
func TestFollowStalled(t *testing.T) {
	p := newFakePublisher(t)
	s := NewStream(p.endpoint())
	s.stall = 50 * time.Millisecond
	r := followStream(t, s)
	c := testutil.Wait(t, "the subscriber's connection", p.conns)
	// No second connection: Follow connects again a moment after the
	// stall, and a test that looked late would see that one followed.
	if err := p.l.Close(); err != nil {
		t.Fatal(err)
	}
	// The topic, more frames to follow, and nothing after it.
	if _, err := c.Write([]byte{flagMore, 2, 'k', 'v'}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the stall counted", func() (bool, string) {
		return r.get().errs[ReasonStalled] >= 1, r.String()
	})
	if s.Following(time.Now()) {
		t.Error("a stalled stream counts as followed")
	}
}

// FuzzParseReply: no replay message panics its parser, and what it takes
// is one of vLLM's two layouts.
func FuzzParseReply(f *testing.F) {
	sep := []byte{0xc1, 0xc1} // splits the input into frames
	join := func(frames ...[]byte) []byte { return bytes.Join(frames, sep) }
	f.Add(join([]byte{}, seqFrame(3), []byte("payload")))
	f.Add(join([]byte{}, []byte("kv"), seqFrame(3), []byte("payload")))
	f.Add(join([]byte{}, seqFrame(endSeq), []byte{}))
	f.Add(join([]byte{}, []byte{}, seqFrame(endSeq), []byte{}))
	f.Add(join([]byte("x"), seqFrame(3)))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := bytes.Split(data, sep)
		seq, payload, end, err := parseReply(frames)
		if err != nil {
			return
		}
		if len(frames[0]) != 0 || (len(frames) != 3 && len(frames) != 4) {
			t.Fatalf("took %d frames, the first %q", len(frames), frames[0])
		}
		if end != (seq == endSeq) || (end && len(payload) != 0) {
			t.Fatalf("seq %d, end %v, payload %q", seq, end, payload)
		}
		if !end && !bytes.Equal(payload, frames[len(frames)-1]) {
			t.Fatalf("payload %q, not the last frame", payload)
		}
	})
}
