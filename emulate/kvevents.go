package emulate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/vmihailenco/msgpack/v5"
)

// KV cache events, as vLLM publishes them with --kv-events-config: a ZMQ PUB
// socket whose every message has three frames, the topic, an 8-byte
// big-endian sequence number counting from 0, and a msgpack EventBatch
// [ts, events, data_parallel_rank]. Each event is BlockStored (the blocks a
// request's prefill made reusable: their hashes, the hash of the block
// before them, their token ids and block size, and in the map encoding
// their extra keys, where a salted prompt's first block carries its cache
// salt), BlockRemoved (evicted blocks) or AllBlocksCleared (the cache
// emptied). vLLM encodes each event as a map tagged by its "type" key since
// its map encoding, and as a tagged array before; the batch stays an array
// in both. The array form is that of releases before extra_keys.
//
// The emulator's block hashes are its own (FNV-1a over the parent's hash
// and the block's tokens, a first block's over its salt too): a subscriber
// may only use them to link a block to its parent, as it must with vLLM's
// seeded hashes.

// KVEventsFormat is how the emulator encodes each event of a batch.
type KVEventsFormat string

// The event encodings.
const (
	// KVEventsMap tags each event with a "type" key among named fields
	// (vLLM since its map encoding).
	KVEventsMap KVEventsFormat = "map"
	// KVEventsArray is the older positional form: the tag, then the
	// fields in declaration order.
	KVEventsArray KVEventsFormat = "array"
)

const (
	// maxPendingEvents bounds the events waiting for the publisher; beyond
	// it events are dropped and the sequence number skips one, so that a
	// subscriber sees the loss as a gap, as it would with a real engine's
	// full queue.
	maxPendingEvents = 1 << 16
	// kvWriteTimeout drops a subscriber that does not read its messages.
	kvWriteTimeout = 2 * time.Second
	// kvHandshakeTimeout bounds a new subscriber's ZMTP handshake.
	kvHandshakeTimeout = 5 * time.Second
	// KVEventsMaxSubscribers bounds the subscribers (connections, their
	// handshake done or not) served at once: each holds a file descriptor
	// and two goroutines, and a SUB socket is idle by nature, so that no
	// timeout tells one left open from one listening. A connection past it
	// is closed at once, counted (Stats.KVEventsSubscribersRefused) and
	// logged by the failure-streak rule (refusalStreak).
	KVEventsMaxSubscribers = 64
	// refusalLogInterval is the least time between two lines of one
	// streak of refused connections: one when it starts, then at most one
	// this often, as the daemon logs failing requests.
	refusalLogInterval = 30 * time.Second
	// KVEventsReplayBatches is how many of the last batches the replay
	// socket keeps (vLLM's buffer_steps default).
	KVEventsReplayBatches = 10_000
)

// kvEndSeq is the sequence number of a replay's end marker: -1 as 8 bytes.
var kvEndSeq = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// kvEarlyBatches bounds the batches kept for one subscriber while its
// handshake is under way.
const kvEarlyBatches = 64

// kvSubscriber is one subscriber's connection. The batches published
// while its handshake is under way are kept (early, at most
// kvEarlyBatches) and sent first once it is done: a subscriber that
// connected before a batch went out gets it, as the exporter expects of
// an engine it followed from the start.
type kvSubscriber struct {
	zc    *zmq4.Conn // nil until the handshake is done
	early []zmq4.Msg
	// send orders the sends: the early batches before any later one.
	send sync.Mutex
}

// kvSentBatch is one batch kept for the replay socket.
type kvSentBatch struct {
	seq     uint64
	payload []byte
}

// kvEventKind is one of vLLM's three event types.
type kvEventKind int

const (
	kvStored kvEventKind = iota
	kvRemoved
	kvCleared
)

// kvEvent is one cache event waiting to be published.
type kvEvent struct {
	kind      kvEventKind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []int
	blockSize int
	// firstSalt is the cache salt that the first block's hash covers: a
	// salted prompt's first block only (vLLM adds the salt to the extra
	// keys of the block at token 0, and the chain carries it on).
	firstSalt string
}

// kvPublisher publishes the prefix cache's events. The cache calls stored,
// removed and cleared under its own lock; they only queue. Serve's run
// goroutine sends each queued run of events as one batch to every
// subscriber, and its accept goroutine takes new subscribers.
type kvPublisher struct {
	endpoint string // as configured: tcp://host:port
	topic    []byte
	format   KVEventsFormat
	now      func() time.Time
	// logger tells of connections refused at the cap (Engine.LogTo); set
	// before the publisher serves.
	logger log.Logger
	// replayEndpoint binds the replay socket; "" for none.
	replayEndpoint string
	// drop is the share of batches not sent, drawn by dropRNG (the run
	// goroutine's alone).
	drop    float64
	dropRNG *rand.Rand
	dropped int64 // batches not sent, drop drawing them

	mu       sync.Mutex
	pending  []kvEvent
	lost     bool // events were dropped since the last batch
	listener net.Listener
	// subs holds every connection, so that serve can close all of them;
	// at most maxSubs.
	subs    map[net.Conn]*kvSubscriber
	maxSubs int
	refused int64 // connections closed, maxSubs being served
	seq     uint64
	wake    chan struct{}
	// The replay socket: its listener, its clients (at most maxSubs), and
	// the last KVEventsReplayBatches batches, a ring whose oldest is at
	// keptHead.
	replayListener net.Listener
	replayConns    map[net.Conn]bool
	kept           []kvSentBatch
	keptHead       int
}

func newKVPublisher(cfg Config, now func() time.Time) *kvPublisher {
	return &kvPublisher{endpoint: cfg.KVEvents, topic: []byte(cfg.KVEventsTopic), format: cfg.KVEventsFormat, now: now,
		logger: log.NewNopLogger(), replayEndpoint: cfg.KVEventsReplayEndpoint, drop: cfg.KVEventsDrop,
		dropRNG: rand.New(rand.NewPCG(cfg.Seed, 0x6b76)), replayConns: map[net.Conn]bool{},
		subs: map[net.Conn]*kvSubscriber{}, maxSubs: KVEventsMaxSubscribers, wake: make(chan struct{}, 1)}
}

// kvAddress is the host:port of a tcp:// endpoint.
func kvAddress(endpoint string) (string, error) {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("kv_events %q: only tcp://host:port endpoints are served", endpoint)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("kv_events %q: %w", endpoint, err)
	}
	return addr, nil
}

// bind listens on the endpoint, once; later calls do nothing.
func (p *kvPublisher) bind() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listener != nil {
		return nil
	}
	addr, err := kvAddress(p.endpoint)
	if err != nil {
		return err
	}
	var replay net.Listener
	if p.replayEndpoint != "" {
		raddr, err := kvAddress(p.replayEndpoint)
		if err != nil {
			return err
		}
		if replay, err = net.Listen("tcp", raddr); err != nil {
			return fmt.Errorf("kv_events_replay_endpoint: %w", err)
		}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		if replay != nil {
			_ = replay.Close()
		}
		return fmt.Errorf("kv_events: %w", err)
	}
	p.listener, p.replayListener = l, replay
	return nil
}

// ReplayEndpoint is the bound replay endpoint, or "" before bind and
// without one.
func (p *kvPublisher) ReplayEndpoint() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replayListener == nil {
		return ""
	}
	return "tcp://" + p.replayListener.Addr().String()
}

// KVEventsDropped is how many event batches the engine did not send,
// Config.KVEventsDrop drawing them.
func (e *Engine) KVEventsDropped() int64 {
	if e.events == nil {
		return 0
	}
	e.events.mu.Lock()
	defer e.events.mu.Unlock()
	return e.events.dropped
}

// KVEventsReplayEndpoint is where the engine serves replays of its KV
// events, tcp://host:port with the port bound, once Start, Serve or
// BindKVEvents has bound it; "" before, and without
// Config.KVEventsReplayEndpoint.
func (e *Engine) KVEventsReplayEndpoint() string {
	if e.events == nil {
		return ""
	}
	return e.events.ReplayEndpoint()
}

// refusedSubscribers is how many connections were closed at once, the
// publisher serving maxSubs.
func (p *kvPublisher) refusedSubscribers() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Endpoint is the bound endpoint (tcp://host:port, the port chosen when
// the configuration said 0), or "" before bind.
func (p *kvPublisher) Endpoint() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listener == nil {
		return ""
	}
	return "tcp://" + p.listener.Addr().String()
}

// serve accepts subscribers and publishes until ctx ends, then closes the
// listener and every subscriber and returns once its goroutines have.
func (p *kvPublisher) serve(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		p.accept(ctx)
	}()
	go func() {
		defer wg.Done()
		p.run(ctx)
	}()
	if p.replayListener != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.acceptReplays(ctx)
		}()
	}
	<-ctx.Done()
	p.mu.Lock()
	_ = p.listener.Close()
	for raw := range p.subs {
		_ = raw.Close()
	}
	if p.replayListener != nil {
		_ = p.replayListener.Close()
	}
	for raw := range p.replayConns {
		_ = raw.Close()
	}
	p.mu.Unlock()
	wg.Wait()
}

// acceptReplays takes replay clients, at most maxSubs at once, each served
// by its own goroutine until it goes away.
func (p *kvPublisher) acceptReplays(ctx context.Context) {
	p.acceptEach(ctx, p.replayListener, "KV event replay clients", func(raw net.Conn) bool {
		if len(p.replayConns) >= p.maxSubs {
			return false
		}
		p.replayConns[raw] = true
		return true
	}, p.serveReplays)
}

// serveReplays answers one client's replay requests until it goes away:
// each request, an empty delimiter and a starting sequence number of 8
// bytes big-endian, gets every batch kept from that one on, then the end
// marker, in vLLM's layout since v0.26.0: delimiter, topic, sequence
// number, payload.
func (p *kvPublisher) serveReplays(raw net.Conn) {
	defer func() {
		p.mu.Lock()
		delete(p.replayConns, raw)
		p.mu.Unlock()
		_ = raw.Close()
	}()
	_ = raw.SetDeadline(time.Now().Add(kvHandshakeTimeout))
	zc, err := zmq4.Open(raw, null.Security(), zmq4.Router, zmq4.SocketIdentity("kvload-emulator-replay"), true, nil)
	if err != nil {
		return
	}
	_ = raw.SetDeadline(time.Time{})
	for {
		req, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if req.Type == zmq4.CmdMsg {
			continue
		}
		if len(req.Frames) != 2 || len(req.Frames[0]) != 0 || len(req.Frames[1]) != 8 {
			continue // vLLM logs and drops a request of another shape
		}
		from := binary.BigEndian.Uint64(req.Frames[1])
		p.mu.Lock()
		var batches []kvSentBatch
		for i := range p.kept {
			if b := p.kept[(p.keptHead+i)%len(p.kept)]; b.seq >= from {
				batches = append(batches, b)
			}
		}
		p.mu.Unlock()
		_ = raw.SetWriteDeadline(time.Now().Add(kvWriteTimeout))
		for _, b := range batches {
			var seq [8]byte
			binary.BigEndian.PutUint64(seq[:], b.seq)
			if zc.SendMsg(zmq4.NewMsgFrom([]byte{}, p.topic, seq[:], b.payload)) != nil {
				return
			}
		}
		if zc.SendMsg(zmq4.NewMsgFrom([]byte{}, []byte{}, kvEndSeq[:], []byte{})) != nil {
			return
		}
	}
}

// accept takes subscribers: each gets a ZMTP handshake as a PUB socket and
// a reader of its subscriptions until it goes away. Every message goes to
// every subscriber: a SUB socket filters topics itself.
func (p *kvPublisher) accept(ctx context.Context) {
	p.acceptEach(ctx, p.listener, "KV event subscribers", func(raw net.Conn) bool {
		if len(p.subs) >= p.maxSubs {
			return false
		}
		p.subs[raw] = &kvSubscriber{}
		return true
	}, p.subscriber)
}

// acceptEach takes connections on ln until ctx ends, each admitted by
// admit (called with p.mu held; false refuses it, counted and logged as
// one of what) and served by its own goroutine, all of which it waits for.
func (p *kvPublisher) acceptEach(ctx context.Context, ln net.Listener, what string, admit func(net.Conn) bool, serve func(net.Conn)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	refusals := refusalStreak{logger: p.logger, what: what, limit: p.maxSubs}
	for {
		raw, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return // serve closed the listener
			}
			// Out of file descriptors, say: try again shortly.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		p.mu.Lock()
		if ctx.Err() != nil {
			p.mu.Unlock()
			_ = raw.Close()
			return
		}
		if !admit(raw) {
			p.refused++
			p.mu.Unlock()
			refusals.refused(p.now(), raw.RemoteAddr())
			_ = raw.Close()
			continue
		}
		p.mu.Unlock()
		refusals.admitted()
		wg.Go(func() { serve(raw) })
	}
}

// refusalStreak logs the connections one listener refuses at its cap by
// the failure-streak rule: a line when a streak starts, then at most one
// every refusalLogInterval, and one when a connection is admitted again.
// Its accept loop alone uses it.
type refusalStreak struct {
	logger log.Logger
	what   string // "KV event subscribers"
	limit  int
	// pending are the refusals since the last line, total those of the
	// streak; lastLine is zero outside a streak.
	pending, total int
	lastLine       time.Time
}

// refused counts a connection from remote refused at now.
func (r *refusalStreak) refused(now time.Time, remote net.Addr) {
	r.pending++
	r.total++
	if !r.lastLine.IsZero() && now.Sub(r.lastLine) < refusalLogInterval {
		return
	}
	kv := []any{"msg", r.what + " refused: as many are served as the publisher takes", "max", r.limit,
		"refused", r.pending, "last_remote", remote}
	if !r.lastLine.IsZero() {
		kv = append(kv, "since", now.Sub(r.lastLine).Round(time.Second).String())
	}
	level.Warn(r.logger).Log(kv...)
	r.pending, r.lastLine = 0, now
}

// admitted ends a streak: a connection was taken again.
func (r *refusalStreak) admitted() {
	if r.lastLine.IsZero() {
		return
	}
	level.Info(r.logger).Log("msg", r.what+" admitted again", "refused", r.total)
	r.pending, r.total, r.lastLine = 0, 0, time.Time{}
}

// subscriber handles one connection until it closes.
func (p *kvPublisher) subscriber(raw net.Conn) {
	defer func() {
		p.mu.Lock()
		delete(p.subs, raw)
		p.mu.Unlock()
		_ = raw.Close()
	}()
	_ = raw.SetDeadline(time.Now().Add(kvHandshakeTimeout))
	zc, err := zmq4.Open(raw, null.Security(), zmq4.Pub, zmq4.SocketIdentity("kvload-emulator"), true, nil)
	if err != nil {
		return
	}
	_ = raw.SetDeadline(time.Time{})
	p.mu.Lock()
	sub := p.subs[raw]
	p.mu.Unlock()
	sub.send.Lock()
	p.mu.Lock()
	sub.zc = zc
	early := sub.early
	sub.early = nil
	p.mu.Unlock()
	for _, msg := range early {
		_ = raw.SetWriteDeadline(time.Now().Add(kvWriteTimeout))
		if zc.SendMsg(msg) != nil {
			_ = raw.Close() // the read below ends
			break
		}
	}
	sub.send.Unlock()
	// Subscriptions are read and dropped: every subscriber gets every
	// message. A read error is the subscriber gone (or closed by serve).
	for {
		if _, err := zc.RecvMsg(); err != nil {
			return
		}
	}
}

// queue adds an event for the next batch.
func (p *kvPublisher) queue(ev kvEvent) {
	p.mu.Lock()
	if len(p.pending) >= maxPendingEvents {
		p.lost = true
	} else {
		p.pending = append(p.pending, ev)
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *kvPublisher) stored(salt string, parent uint64, hasParent bool, hashes []uint64, tokens []int, blockSize int) {
	ev := kvEvent{kind: kvStored, hashes: hashes, parent: parent, hasParent: hasParent, tokens: tokens, blockSize: blockSize}
	if !hasParent {
		ev.firstSalt = salt
	}
	p.queue(ev)
}

func (p *kvPublisher) removed(hashes []uint64) { p.queue(kvEvent{kind: kvRemoved, hashes: hashes}) }

func (p *kvPublisher) cleared() { p.queue(kvEvent{kind: kvCleared}) }

// run publishes the pending events as one batch each time some are queued.
func (p *kvPublisher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		events, lost, drop := p.pending, p.lost, p.drop
		p.pending, p.lost = nil, false
		if len(events) == 0 {
			// A wake-up whose events an earlier round took.
			p.mu.Unlock()
			continue
		}
		if lost {
			p.seq++ // the dropped events' batch, never sent
		}
		seq := p.seq
		p.seq++
		p.mu.Unlock()
		payload, err := encodeKVBatch(p.format, float64(p.now().UnixNano())/1e9, events)
		if err != nil {
			continue // only our own values get here
		}
		if p.replayListener != nil {
			p.mu.Lock()
			if len(p.kept) < KVEventsReplayBatches {
				p.kept = append(p.kept, kvSentBatch{seq, payload})
			} else {
				p.kept[p.keptHead] = kvSentBatch{seq, payload}
				p.keptHead = (p.keptHead + 1) % len(p.kept)
			}
			p.mu.Unlock()
		}
		if drop > 0 && p.dropRNG.Float64() < drop {
			p.mu.Lock()
			p.dropped++
			p.mu.Unlock()
			continue // kept for the replay, not sent
		}
		var seqFrame [8]byte
		binary.BigEndian.PutUint64(seqFrame[:], seq)
		msg := zmq4.NewMsgFrom(p.topic, seqFrame[:], payload)
		ready := make(map[net.Conn]*kvSubscriber, len(p.subs))
		p.mu.Lock()
		for raw, sub := range p.subs {
			switch {
			case sub.zc != nil:
				ready[raw] = sub
			case len(sub.early) < kvEarlyBatches:
				sub.early = append(sub.early, msg)
			}
		}
		p.mu.Unlock()
		for raw, sub := range ready {
			sub.send.Lock()
			_ = raw.SetWriteDeadline(time.Now().Add(kvWriteTimeout))
			if err := sub.zc.SendMsg(msg); err != nil {
				_ = raw.Close() // its reader ends and removes it
			}
			sub.send.Unlock()
		}
	}
}

// encodeKVBatch encodes one EventBatch: [ts, events, data_parallel_rank].
func encodeKVBatch(format KVEventsFormat, ts float64, events []kvEvent) ([]byte, error) {
	var buf strings.Builder
	enc := msgpack.NewEncoder(&buf)
	err := errors.Join(enc.EncodeArrayLen(3), enc.EncodeFloat64(ts), enc.EncodeArrayLen(len(events)))
	for i := range events {
		if format == KVEventsArray {
			err = errors.Join(err, encodeKVArray(enc, &events[i]))
		} else {
			err = errors.Join(err, encodeKVMap(enc, &events[i]))
		}
	}
	err = errors.Join(err, enc.EncodeUint(0)) // one engine, data-parallel rank 0
	return []byte(buf.String()), err
}

// encodeKVMap writes an event as vLLM's map encoding does, with the fields a
// single-group, GPU-only engine without LoRA sends.
func encodeKVMap(enc *msgpack.Encoder, ev *kvEvent) error {
	switch ev.kind {
	case kvStored:
		err := errors.Join(enc.EncodeMapLen(10), enc.EncodeString("type"), enc.EncodeString("BlockStored"),
			enc.EncodeString("block_hashes"), encodeHashes(enc, ev.hashes),
			enc.EncodeString("parent_block_hash"), encodeParent(enc, ev),
			enc.EncodeString("token_ids"), encodeTokens(enc, ev.tokens),
			enc.EncodeString("block_size"), enc.EncodeUint(uint64(ev.blockSize)),
			enc.EncodeString("lora_id"), enc.EncodeNil(),
			enc.EncodeString("medium"), enc.EncodeString("GPU"),
			enc.EncodeString("lora_name"), enc.EncodeNil(),
			enc.EncodeString("extra_keys"), encodeExtraKeys(enc, ev))
		return errors.Join(err, enc.EncodeString("group_idx"), enc.EncodeUint(0))
	case kvRemoved:
		return errors.Join(enc.EncodeMapLen(4), enc.EncodeString("type"), enc.EncodeString("BlockRemoved"),
			enc.EncodeString("block_hashes"), encodeHashes(enc, ev.hashes),
			enc.EncodeString("medium"), enc.EncodeString("GPU"),
			enc.EncodeString("group_idx"), enc.EncodeUint(0))
	default:
		return errors.Join(enc.EncodeMapLen(1), enc.EncodeString("type"), enc.EncodeString("AllBlocksCleared"))
	}
}

// encodeKVArray writes an event in the positional form of vLLM releases
// before the map encoding that had medium but not yet lora_name.
func encodeKVArray(enc *msgpack.Encoder, ev *kvEvent) error {
	switch ev.kind {
	case kvStored:
		return errors.Join(enc.EncodeArrayLen(7), enc.EncodeString("BlockStored"), encodeHashes(enc, ev.hashes),
			encodeParent(enc, ev), encodeTokens(enc, ev.tokens), enc.EncodeUint(uint64(ev.blockSize)),
			enc.EncodeNil(), enc.EncodeString("GPU"))
	case kvRemoved:
		return errors.Join(enc.EncodeArrayLen(3), enc.EncodeString("BlockRemoved"), encodeHashes(enc, ev.hashes),
			enc.EncodeString("GPU"))
	default:
		return errors.Join(enc.EncodeArrayLen(1), enc.EncodeString("AllBlocksCleared"))
	}
}

// encodeExtraKeys writes what else than its tokens each block's hash
// covers, as vLLM does since its extra_keys: one entry a block, nil for
// none, else a tuple (an array). For a text prompt without an adapter that
// is the cache salt alone, on the prompt's first block.
func encodeExtraKeys(enc *msgpack.Encoder, ev *kvEvent) error {
	err := enc.EncodeArrayLen(len(ev.hashes))
	for i := range ev.hashes {
		if i == 0 && ev.firstSalt != "" {
			err = errors.Join(err, enc.EncodeArrayLen(1), enc.EncodeString(ev.firstSalt))
			continue
		}
		err = errors.Join(err, enc.EncodeNil())
	}
	return err
}

func encodeHashes(enc *msgpack.Encoder, hashes []uint64) error {
	err := enc.EncodeArrayLen(len(hashes))
	for _, h := range hashes {
		err = errors.Join(err, enc.EncodeUint(h))
	}
	return err
}

func encodeParent(enc *msgpack.Encoder, ev *kvEvent) error {
	if !ev.hasParent {
		return enc.EncodeNil()
	}
	return enc.EncodeUint(ev.parent)
}

func encodeTokens(enc *msgpack.Encoder, tokens []int) error {
	err := enc.EncodeArrayLen(len(tokens))
	for _, t := range tokens {
		err = errors.Join(err, enc.EncodeUint(uint64(t)))
	}
	return err
}
