package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// emulated is an engine emulator serving on loopback.
type emulated struct {
	*emulate.Engine
	URL  string
	stop func()
}

// startEmulator serves an engine of cfg until the test ends or Stop.
func startEmulator(t *testing.T, cfg emulate.Config) *emulated {
	t.Helper()
	e, err := emulate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	url, wait, err := e.Start(ctx, "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	em := &emulated{Engine: e, URL: url, stop: sync.OnceFunc(func() { cancel(); _ = wait() })}
	t.Cleanup(em.stop)
	return em
}

func (e *emulated) Stop() { e.stop() }

// recorder is a Reporter that keeps what it hears.
type recorder struct {
	mu      sync.Mutex
	up      bool
	ups     int
	batches int
	errs    map[ErrorReason]int
	last    error
	msgs    []string // every error's text
	applied Applied
}

func newRecorder() *recorder { return &recorder{errs: map[ErrorReason]int{}} }

func (r *recorder) Up(_ *Stream, up bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.up = up
	if up {
		r.ups++
	}
}

func (r *recorder) Batch(_ *Stream, a Applied) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches++
	r.applied.Missed += a.Missed
	r.applied.Restarted = r.applied.Restarted || a.Restarted
}

func (r *recorder) Error(_ *Stream, reason ErrorReason, n int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs[reason] += n
	r.last = err
	if err != nil {
		r.msgs = append(r.msgs, err.Error())
	}
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("up %v (%d times), %d batches, errors %v (last %v), %+v", r.up, r.ups, r.batches, r.errs, r.last, r.applied)
}

// seen is a copy of what a recorder heard.
type seen struct {
	up           bool
	ups, batches int
	errs         map[ErrorReason]int
	applied      Applied
}

func (r *recorder) get() seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := seen{up: r.up, ups: r.ups, batches: r.batches, applied: r.applied, errs: map[ErrorReason]int{}}
	for k, v := range r.errs {
		c.errs[k] = v
	}
	return c
}

// follow runs Follow on a stream at endpoint until the test ends.
func follow(t *testing.T, endpoint string) (*Stream, *recorder) {
	t.Helper()
	s := NewStream(endpoint)
	return s, followStream(t, s)
}

// prompt posts a completion of token ids to the emulator at base.
func complete(t *testing.T, base string, ids []uint32) {
	t.Helper()
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, id)
	}
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": [`+b.String()+`], "max_tokens": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %s", resp.Status)
	}
}

// classify classifies a whole prompt's blocks as missed, as of now.
func classifyNow(t *testing.T, s *Stream, ids []uint32) Tally {
	t.Helper()
	now := time.Now()
	got, err := Classify([]*Stream{s}, Miss{Tokens: ids, From: 0, To: len(ids) / 4 * 4, BlockSize: 4, Sent: now, Until: now})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestFollowEmulator: the events of the emulated engine (an independent
// publisher) as a subscriber follows them: blocks stored, evicted and
// cleared, then the engine gone, restarted on the same endpoint, and
// followed again with its cache empty.
func TestFollowEmulator(t *testing.T) {
	cfg := emulate.Config{BlockSize: 4, CapacityBlocks: 6, KVEvents: "tcp://127.0.0.1:0"}
	e := startEmulator(t, cfg)
	endpoint := e.KVEventsEndpoint()
	s, r := follow(t, endpoint)

	// The publisher counts a subscriber a moment after its handshake:
	// new prompts go until one's events arrive.
	tries := 0
	warm := func(base string) {
		tries++
		complete(t, base, toks(10000*tries, 5)) // one block each
	}
	testutil.Eventually(t, "the first events", func() (bool, string) {
		warm(e.URL)
		return r.get().batches > 0, r.String()
	})
	a, b, c, d := toks(1, 9), toks(100, 9), toks(200, 9), toks(300, 9)
	for _, p := range [][]uint32{a, b, c, d} { // 2 blocks each: the warm-ups' and a's go
		complete(t, e.URL, p)
	}
	testutil.Eventually(t, "a's blocks evicted", func() (bool, string) {
		got := classifyNow(t, s, a)
		return got[ClassEvicted] == 8, fmt.Sprint(got, "; ", r)
	})
	if got := classifyNow(t, s, d); got[ClassUnexplained] != 8 {
		t.Errorf("d's blocks: %v, want held (unexplained)", got)
	}
	e.Flush()
	testutil.Eventually(t, "d's blocks cleared", func() (bool, string) {
		got := classifyNow(t, s, d)
		return got[ClassCleared] == 8, fmt.Sprint(got, "; ", r)
	})

	// The engine goes, and comes back on the same endpoint.
	complete(t, e.URL, c) // c stored again after the flush
	testutil.Eventually(t, "c's blocks held", func() (bool, string) {
		got := classifyNow(t, s, c)
		return got[ClassUnexplained] == 8, fmt.Sprint(got, "; ", r)
	})
	e.Stop()
	testutil.Eventually(t, "the stream down", func() (bool, string) {
		g := r.get()
		return !g.up && g.errs[ReasonDisconnected] == 1, r.String()
	})
	cfg.KVEvents = endpoint
	e2 := startEmulator(t, cfg)
	testutil.Eventually(t, "the stream up again and a batch of the new engine", func() (bool, string) {
		warm(e2.URL)
		g := r.get()
		return g.ups == 2 && g.applied.Restarted, r.String()
	})
	if got := classifyNow(t, s, c); got[ClassCleared] != 8 {
		t.Errorf("c's blocks after the engine restarted: %v, want cleared", got)
	}
}

// TestFollowUnreachable: an endpoint nobody serves is counted as
// unreachable, tried again, and Follow returns when told.
func TestFollowUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a port nobody listens on
	s, r := follow(t, "tcp://"+addr)
	testutil.Eventually(t, "two failed connections", func() (bool, string) {
		return r.get().errs[ReasonUnreachable] >= 2, r.String()
	})
	if s.Following(time.Now()) {
		t.Error("an unreachable stream counts as followed")
	}
}

// fakePublisher serves one subscriber at a time and writes what the test
// gives it.
type fakePublisher struct {
	l     net.Listener
	conns chan net.Conn // handshaken connections
}

func newFakePublisher(t *testing.T) *fakePublisher {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePublisher{l: l, conns: make(chan net.Conn, 4)}
	done := make(chan struct{})
	// Every connection stays referenced until the cleanup closes it: one
	// the test no longer uses would otherwise be closed by its finalizer
	// at the next garbage collection, and the subscriber would see the
	// publisher leave at a moment that depends on the machine.
	var accepted []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted = append(accepted, c)
			if _, err := zmq4.Open(c, null.Security(), zmq4.Pub, zmq4.SocketIdentity("fake"), true, nil); err != nil {
				c.Close()
				continue
			}
			p.conns <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done // accepted is the cleanup's from here
		close(p.conns)
		for _, c := range accepted {
			c.Close()
		}
	})
	return p
}

func (p *fakePublisher) endpoint() string { return "tcp://" + p.l.Addr().String() }

// TestFollowBadMessages: a payload that is not an event batch is counted
// and passed over, and the stream goes on; a frame announced larger than
// MaxMessageBytes ends the connection before its body is allocated.
func TestFollowBadMessages(t *testing.T) {
	p := newFakePublisher(t)
	s, r := follow(t, p.endpoint())
	c := testutil.Wait(t, "the subscriber's connection", p.conns)
	good := []byte("\x93\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x91\x81\xa4type\xb0AllBlocksCleared\x00")
	for _, m := range [][]byte{
		message([]byte("kv"), seqFrame(0), []byte("\x92\x01")), // a batch without events
		message([]byte("kv"), seqFrame(1)),                     // two frames
		message([]byte("kv"), seqFrame(2), good),
	} {
		if _, err := c.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "two decode errors and a batch", func() (bool, string) {
		g := r.get()
		return g.errs[ReasonDecode] == 2 && g.batches == 1, r.String()
	})
	r.mu.Lock()
	first := r.msgs[0]
	r.mu.Unlock()
	if !strings.Contains(first, p.endpoint()) || !strings.Contains(first, "batch 0:") {
		t.Errorf("the first decode error %q: want it to name the endpoint %s and batch 0", first, p.endpoint())
	}
	if !s.Following(time.Now()) {
		t.Error("a stream whose bad batches were counted: want it still followed from the last")
	}
	// 1 TiB announced: a read of it would fail the test's memory.
	huge := append([]byte{flagLong}, binary.BigEndian.AppendUint64(nil, 1<<40)...)
	if _, err := c.Write(huge); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the too-large message refused", func() (bool, string) {
		return r.get().errs[ReasonTooLarge] == 1, r.String()
	})
}

// TestFollowEndlessEmptyFrames: a message of ever more empty frames ends
// the connection once it has more than MaxMessageFrames, counted as too
// large: its frames are counted as their headers arrive, not once the
// message is whole.
func TestFollowEndlessEmptyFrames(t *testing.T) {
	p := newFakePublisher(t)
	_, r := follow(t, p.endpoint())
	c := testutil.Wait(t, "the subscriber's connection", p.conns)
	// Written from a goroutine: once the subscriber stops reading, a
	// write blocks until the test's cleanup closes the connection.
	go func() {
		empty := bytes.Repeat([]byte{flagMore, 0}, 4096)
		for {
			if _, err := c.Write(empty); err != nil {
				return
			}
		}
	}()
	testutil.Eventually(t, "the endless message refused", func() (bool, string) {
		return r.get().errs[ReasonTooLarge] >= 1, r.String()
	})
}

// stopAfter is a context that its Err's calls cancel: the calls after the
// first skip return nil, and the one after skip ends the context. Apply
// asks it between events, so that cancelling it mid-batch is a stop that
// comes while a hostile batch is being applied.
type stopAfter struct {
	context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex
	armed   bool // counting: the hostile batch is on its way
	skip    int
	stopped bool
}

func (c *stopAfter) Err() error {
	c.mu.Lock()
	if c.armed && !c.stopped {
		if c.skip == 0 {
			c.stopped = true
			c.cancel()
		}
		c.skip--
	}
	c.mu.Unlock()
	return c.Context.Err()
}

// TestFollowStopMidBatch: a stop while a hostile batch (20,000 clears,
// each after a store) is being applied ends Follow at the next event: the
// batch is neither finished nor reported.
func TestFollowStopMidBatch(t *testing.T) {
	p := newFakePublisher(t)
	base, cancel := context.WithCancel(context.Background())
	ctx := &stopAfter{Context: base, cancel: cancel, skip: 1000}
	s, r := NewStream(p.endpoint()), newRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Follow(ctx, s, r)
	}()
	t.Cleanup(func() {
		cancel()
		testutil.Wait(t, "Follow to return", done)
	})
	c := testutil.Wait(t, "the subscriber's connection", p.conns)
	hostile := hostilePayload(t, 40_000, func(enc *msgpack.Encoder) error {
		return errors.Join(enc.EncodeMapLen(1), enc.EncodeString("type"), enc.EncodeString("AllBlocksCleared"))
	})
	ctx.mu.Lock()
	ctx.armed = true
	ctx.mu.Unlock()
	if _, err := c.Write(message([]byte("kv"), seqFrame(0), hostile)); err != nil {
		t.Fatal(err)
	}
	testutil.Wait(t, "Follow to return, stopped mid-batch", done)
	if g := r.get(); g.batches != 0 {
		t.Errorf("%d batches reported, want the hostile one left half-way", g.batches)
	}
}

// oneByteHashes is a payload of events BlockRemoved events, each of
// maxHashes hashes of one byte: 31 MiB for 480 events, which old decoding
// held as 1 GiB of hashes.
func oneByteHashes(events int) []byte {
	event := []byte("\x82\xa4type\xacBlockRemoved\xacblock_hashes\xdc")
	event = binary.BigEndian.AppendUint16(event, maxHashes-1)
	event = append(event, bytes.Repeat([]byte{1}, maxHashes-1)...)
	out := []byte("\x93\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\xdd")
	out = binary.BigEndian.AppendUint32(out, uint32(events))
	out = append(out, bytes.Repeat(event, events)...)
	return append(out, 0)
}

// TestFollowHostileHashes: three messages of 31 MiB of one-byte hashes
// are refused as they are decoded, what following them allocates staying
// within a few times MaxMessageBytes and MaxBatchBytes.
func TestFollowHostileHashes(t *testing.T) {
	p := newFakePublisher(t)
	_, r := follow(t, p.endpoint())
	c := testutil.Wait(t, "the subscriber's connection", p.conns)
	payload := oneByteHashes(480)
	if len(payload) > MaxMessageBytes-64 {
		t.Fatalf("a payload of %d bytes, more than a message takes", len(payload))
	}
	var msgs [][]byte
	for i := range 3 {
		msgs = append(msgs, message([]byte("kv"), seqFrame(uint64(i)), payload))
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, m := range msgs {
		if _, err := c.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "three batches refused", func() (bool, string) {
		return r.get().errs[ReasonDecode] == 3, r.String()
	})
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d MiB allocated for 3 messages of %d MiB", allocated>>20, len(payload)>>20)
	// Each message: the library's copy and the decoding's bound, and 8 MiB
	// for the rest of the test process.
	if limit := uint64(3*(MaxMessageBytes+MaxBatchBytes) + 8<<20); allocated > limit {
		t.Errorf("%d MiB allocated, more than %d MiB", allocated>>20, limit>>20)
	}
	r.mu.Lock()
	last := r.msgs[len(r.msgs)-1]
	r.mu.Unlock()
	if !strings.Contains(last, "more than the batch's bound") {
		t.Errorf("the last error %q: want it refused for the batch's bound", last)
	}
}
