package emulate

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// wireEvent is one decoded event, whatever its encoding.
type wireEvent struct {
	Type      string
	Hashes    []uint64
	Parent    *uint64
	Tokens    []int
	BlockSize int
	ExtraKeys any // as decoded; nil when not sent
}

func (w wireEvent) String() string {
	p := "nil"
	if w.Parent != nil {
		p = fmt.Sprint(*w.Parent)
	}
	return fmt.Sprintf("%s%v parent %s tokens %v", w.Type, w.Hashes, p, w.Tokens)
}

// testSubscriber is a SUB connection to an engine's KV events, read
// message by message.
type testSubscriber struct {
	raw  net.Conn
	zmtp *zmq4.Conn
}

// startPublishing serves an engine of cfg, which publishes KV events, on
// a local port until the test ends, and subscribes to its events.
func startPublishing(t *testing.T, cfg Config) (*Engine, string, *testSubscriber) {
	t.Helper()
	e, base := servePublishing(t, cfg)
	return e, base, subscribe(t, e)
}

// servePublishing serves an engine of cfg on a local port until the test
// ends, and returns it and its base URL.
func servePublishing(t *testing.T, cfg Config) (*Engine, string) {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	base, wait, err := e.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = wait() })
	return e, base
}

// subscribe connects to e's events as a SUB socket. It does not wait for
// the publisher's side of the handshake: a batch published meanwhile is
// kept for the subscriber (kvSubscriber.early), and no event published
// from then on is missed.
func subscribe(t *testing.T, e *Engine) *testSubscriber {
	t.Helper()
	addr := strings.TrimPrefix(e.KVEventsEndpoint(), "tcp://")
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	zc, err := zmq4.Open(raw, null.Security(), zmq4.Sub, zmq4.SocketIdentity("test"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil { // every topic
		t.Fatal(err)
	}
	return &testSubscriber{raw: raw, zmtp: zc}
}

// next reads events until it has n, and returns them with the sequence
// numbers of the messages that carried them.
func (s *testSubscriber) next(t *testing.T, format KVEventsFormat, n int) ([]wireEvent, []uint64) {
	t.Helper()
	var events []wireEvent
	var seqs []uint64
	// A bound on a broken publisher only: the events are queued before
	// the requests that cause them are answered.
	_ = s.raw.SetReadDeadline(time.Now().Add(testutil.Ceiling))
	for len(events) < n {
		msg, err := s.zmtp.RecvMsg()
		if err != nil {
			t.Fatalf("after %v: %v", events, err)
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			t.Fatalf("a message of %d frames, want topic, 8-byte sequence, payload", len(msg.Frames))
		}
		seqs = append(seqs, binary.BigEndian.Uint64(msg.Frames[1]))
		events = append(events, decodeWireBatch(t, format, msg.Frames[2])...)
	}
	return events, seqs
}

func decodeWireBatch(t *testing.T, format KVEventsFormat, payload []byte) []wireEvent {
	t.Helper()
	var batch []any
	if err := msgpack.Unmarshal(payload, &batch); err != nil {
		t.Fatalf("batch: %v", err)
	}
	if len(batch) != 3 {
		t.Fatalf("batch of %d fields, want ts, events, rank: %v", len(batch), batch)
	}
	if _, ok := batch[0].(float64); !ok {
		t.Errorf("ts is %T, want a float", batch[0])
	}
	var out []wireEvent
	for _, raw := range batch[1].([]any) {
		var f map[string]any
		if format == KVEventsArray {
			f = arrayFields(t, raw.([]any))
		} else {
			f = raw.(map[string]any)
		}
		ev := wireEvent{Type: f["type"].(string)}
		for _, h := range asList(f["block_hashes"]) {
			ev.Hashes = append(ev.Hashes, asUint(h))
		}
		if p, ok := f["parent_block_hash"]; ok && p != nil {
			v := asUint(p)
			ev.Parent = &v
		}
		for _, tok := range asList(f["token_ids"]) {
			ev.Tokens = append(ev.Tokens, int(asUint(tok)))
		}
		if bs, ok := f["block_size"]; ok {
			ev.BlockSize = int(asUint(bs))
		}
		ev.ExtraKeys = f["extra_keys"]
		if ev.Type != "AllBlocksCleared" && f["medium"] != "GPU" {
			t.Errorf("%s: medium %v, want GPU", ev.Type, f["medium"])
		}
		out = append(out, ev)
	}
	return out
}

// arrayFields names the fields of a positional event.
func arrayFields(t *testing.T, a []any) map[string]any {
	t.Helper()
	names := map[string][]string{
		"BlockStored":      {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
		"BlockRemoved":     {"type", "block_hashes", "medium"},
		"AllBlocksCleared": {"type"},
	}[a[0].(string)]
	if len(a) != len(names) {
		t.Fatalf("%v: %d fields, want %d", a, len(a), len(names))
	}
	f := map[string]any{}
	for i, n := range names {
		f[n] = a[i]
	}
	return f
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func asUint(v any) uint64 {
	switch n := reflect.ValueOf(v); n.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return uint64(n.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return n.Uint()
	}
	panic(fmt.Sprintf("%v (%T) is not an integer", v, v))
}

// TestKVEventsWire: the events of a prefill, a prefill that extends a
// cached prefix, an eviction and a flush, as a subscriber reads them, in
// both encodings.
func TestKVEventsWire(t *testing.T) {
	for _, format := range []KVEventsFormat{KVEventsMap, KVEventsArray} {
		t.Run(string(format), func(t *testing.T) {
			e, base, sub := startPublishing(t, Config{BlockSize: 4, CapacityBlocks: 3, KVEvents: "tcp://127.0.0.1:0", KVEventsFormat: format})

			complete(t, base, seq(1, 9), nil)   // blocks 1-4, 5-8 stored
			complete(t, base, seq(1, 13), nil)  // 9-12 after 5-8
			complete(t, base, seq(100, 9), nil) // two more: the two oldest leaves go
			e.Flush()
			events, seqs := sub.next(t, format, 6)

			for i, s := range seqs {
				if s != uint64(i) {
					t.Fatalf("sequence numbers %v, want 0, 1, 2, ...", seqs)
				}
			}
			want := []string{"BlockStored", "BlockStored", "BlockStored", "BlockRemoved", "BlockRemoved", "AllBlocksCleared"}
			var got []string
			for _, ev := range events {
				got = append(got, ev.Type)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("events %v, want types %v", events, want)
			}
			first, second, other := events[0], events[1], events[2]
			if first.Parent != nil || !reflect.DeepEqual(first.Tokens, seq(1, 8)) || len(first.Hashes) != 2 || first.BlockSize != 4 {
				t.Errorf("first prefill: %v, want two blocks of 4, tokens 1-8, no parent", first)
			}
			if second.Parent == nil || *second.Parent != first.Hashes[1] || !reflect.DeepEqual(second.Tokens, seq(9, 4)) {
				t.Errorf("second prefill: %v, want tokens 9-12 after the block of 5-8 (%d)", second, first.Hashes[1])
			}
			if other.Parent != nil || !reflect.DeepEqual(other.Tokens, seq(100, 8)) {
				t.Errorf("third prefill: %v, want tokens 100-107, no parent", other)
			}
			// The least recently used leaves: 9-12, then 5-8.
			if r := events[3:5]; r[0].Hashes[0] != second.Hashes[0] || r[1].Hashes[0] != first.Hashes[1] {
				t.Errorf("removed %v, %v; want %d then %d", r[0], r[1], second.Hashes[0], first.Hashes[1])
			}
		})
	}
}

// TestKVEventsConfig: the keys are checked, and an engine without them
// publishes nothing.
func TestKVEventsConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{KVEvents: "ipc:///tmp/x"}, "only tcp://host:port"},
		{Config{KVEvents: "tcp://nohost"}, "missing port"},
		{Config{KVEvents: "tcp://127.0.0.1:0", Engine: PersonalityLlamaCpp}, "llamacpp"},
		{Config{KVEventsFormat: "json"}, "map or array"},
		{Config{KVEvents: "tcp://127.0.0.1:0", KVEventsDrop: 1.5}, "kv_events_drop must be within [0, 1]"},
		{Config{KVEventsReplayEndpoint: "tcp://127.0.0.1:0"}, "need kv_events"},
		{Config{KVEvents: "tcp://127.0.0.1:0", KVEventsReplayEndpoint: "127.0.0.1:0"}, "kv_events_replay_endpoint"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.cfg, err, c.want)
		}
	}
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if ep := e.KVEventsEndpoint(); ep != "" {
		t.Errorf("no kv_events: endpoint %q", ep)
	}
}

// TestKVEventsSaltExtraKeys: a salted prompt's first block carries its
// cache salt in extra_keys, as vLLM's map encoding sends it (a one-element
// tuple on the block at token 0, nil on every other block), and its hashes
// differ from those of the same tokens unsalted; the older array form has
// no extra_keys at all.
func TestKVEventsSaltExtraKeys(t *testing.T) {
	for _, format := range []KVEventsFormat{KVEventsMap, KVEventsArray} {
		t.Run(string(format), func(t *testing.T) {
			_, base, sub := startPublishing(t, Config{BlockSize: 4, KVEvents: "tcp://127.0.0.1:0", KVEventsFormat: format})

			salted := map[string]any{"cache_salt": "tenant-a"}
			complete(t, base, seq(1, 9), salted)  // blocks 1-4, 5-8 under the salt
			complete(t, base, seq(1, 13), salted) // 9-12 after them
			complete(t, base, seq(1, 9), nil)     // 1-4, 5-8 again, unsalted
			events, _ := sub.next(t, format, 3)

			first, second, plain := events[0], events[1], events[2]
			if first.Parent != nil || second.Parent == nil || plain.Parent != nil {
				t.Fatalf("events %v: want a first prompt, its extension, and a first prompt", events)
			}
			if reflect.DeepEqual(first.Hashes, plain.Hashes) {
				t.Errorf("the salted and the unsalted blocks of the same tokens have the same hashes %v", first.Hashes)
			}
			want := []any{
				[]any{[]any{"tenant-a"}, nil}, // the salt on the block at token 0 only
				[]any{nil},                    // an extension: none
				[]any{nil, nil},               // unsalted: none
			}
			if format == KVEventsArray {
				want = []any{nil, nil, nil}
			}
			for i, ev := range events {
				if !reflect.DeepEqual(ev.ExtraKeys, want[i]) {
					t.Errorf("event %d (%v): extra_keys %#v, want %#v", i, ev, ev.ExtraKeys, want[i])
				}
			}
		})
	}
}

// TestKVEventsSubscriberCap: past maxSubs subscribers a new connection is
// closed before its handshake, counted, and logged once for the streak
// (the engine's clock standing still); the subscribers served still get
// their events, and the HTTP API answers.
func TestKVEventsSubscriberCap(t *testing.T) {
	e, err := New(Config{BlockSize: 4, KVEvents: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	e.events.maxSubs = 3
	var logged testutil.Buffer
	e.LogTo(log.NewLogfmtLogger(&logged))
	still := time.Unix(1e9, 0)
	e.now = func() time.Time { return still }
	ctx, cancel := context.WithCancel(context.Background())
	base, wait, err := e.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = wait() })
	sub := subscribe(t, e)
	addr := strings.TrimPrefix(e.KVEventsEndpoint(), "tcp://")
	for range 2 { // idle: connected, no handshake
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { raw.Close() })
	}
	testutil.Eventually(t, "three connections served", func() (bool, string) {
		e.events.mu.Lock()
		defer e.events.mu.Unlock()
		return len(e.events.subs) == 3, fmt.Sprint(len(e.events.subs))
	})
	for i := range 5 {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = raw.SetDeadline(time.Now().Add(testutil.Ceiling))
		if _, err := zmq4.Open(raw, null.Security(), zmq4.Sub, zmq4.SocketIdentity("test"), false, nil); err == nil {
			t.Errorf("subscriber %d past the cap: handshake done, want the connection closed", 4+i)
		}
		raw.Close()
	}
	if got := e.Stats().KVEventsSubscribersRefused; got != 5 {
		t.Errorf("%d subscribers refused, want 5", got)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `level=warn msg="KV event subscribers refused`) ||
		!strings.Contains(lines[0], "max=3 refused=1 ") {
		t.Errorf("logged %q, want one warning naming the cap and the first refusal", lines)
	}
	complete(t, base, seq(1, 5), nil)
	if events, _ := sub.next(t, KVEventsMap, 1); events[0].Type != "BlockStored" {
		t.Errorf("the subscriber served: %v, want the block stored", events)
	}
}

// TestKVEventsEarlySubscriber: a batch published while a subscriber's
// handshake is under way (connected, greeting not yet sent) reaches it
// once the handshake is done, before any later batch: an exporter that
// subscribed before an engine's first request sees its first blocks,
// which every later prompt of a conversation chains from.
func TestKVEventsEarlySubscriber(t *testing.T) {
	e, base := servePublishing(t, Config{BlockSize: 4, KVEvents: "tcp://127.0.0.1:0"})
	raw, err := net.Dial("tcp", strings.TrimPrefix(e.KVEventsEndpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	testutil.Eventually(t, "the connection taken", func() (bool, string) {
		e.events.mu.Lock()
		defer e.events.mu.Unlock()
		return len(e.events.subs) == 1, fmt.Sprint(len(e.events.subs))
	})
	complete(t, base, seq(1, 8), nil)
	testutil.Eventually(t, "the batch kept for the subscriber", func() (bool, string) {
		e.events.mu.Lock()
		defer e.events.mu.Unlock()
		for _, sub := range e.events.subs {
			return len(sub.early) == 1, fmt.Sprint(len(sub.early), " kept")
		}
		return false, "no connection"
	})
	zc, err := zmq4.Open(raw, null.Security(), zmq4.Sub, zmq4.SocketIdentity("test"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil {
		t.Fatal(err)
	}
	sub := &testSubscriber{raw: raw, zmtp: zc}
	complete(t, base, seq(100, 4), nil)
	events, seqs := sub.next(t, KVEventsMap, 2)
	if !reflect.DeepEqual(seqs, []uint64{0, 1}) || events[0].Type != "BlockStored" || len(events[0].Hashes) != 2 ||
		events[1].Type != "BlockStored" || len(events[1].Hashes) != 1 {
		t.Errorf("read %v in batches %v, want batch 0 (two blocks stored during the handshake), then batch 1 (one)", events, seqs)
	}
}

// TestKVEventsReplay: with every batch dropped (kv_events_drop: 1) a
// subscriber hears nothing, while the replay socket gives each batch back
// from the sequence number asked, in vLLM's layout since v0.26.0 (a
// delimiter, the topic, the sequence number, the payload), then its end
// marker; and the drops are counted.
func TestKVEventsReplay(t *testing.T) {
	cfg := Config{BlockSize: 4, KVEvents: "tcp://127.0.0.1:0", KVEventsTopic: "kv", KVEventsReplayEndpoint: "tcp://127.0.0.1:0", KVEventsDrop: 1}
	e, base, sub := startPublishing(t, cfg)
	for i := range 3 {
		complete(t, base, seq(100*i+1, 9), nil)
	}
	raw, err := net.Dial("tcp", strings.TrimPrefix(e.KVEventsReplayEndpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	zc, err := zmq4.Open(raw, null.Security(), zmq4.Dealer, zmq4.SocketIdentity("test"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The three requests' blocks are queued before their requests are
	// answered, but published by another goroutine, which puts all that
	// is queued into one batch (one to three batches, as the machine's
	// load has it): ask from the first until all three are kept.
	var seqs []uint64
	testutil.Eventually(t, "three requests' blocks replayed", func() (bool, string) {
		var stored int
		seqs, stored = askReplay(t, raw, zc, 0)
		return stored == 3, fmt.Sprintf("batches %v, %d blocks stored", seqs, stored)
	})
	for i, s := range seqs {
		if s != uint64(i) {
			t.Fatalf("batches %v replayed, want 0, 1, ... in order", seqs)
		}
	}
	last := seqs[len(seqs)-1]
	if got, _ := askReplay(t, raw, zc, last); !reflect.DeepEqual(got, []uint64{last}) {
		t.Errorf("asked from %d, got batches %v: want that one only", last, got)
	}
	if got, _ := askReplay(t, raw, zc, last+1); len(got) != 0 {
		t.Errorf("asked from %d, past the last batch, got %v: want none, only the end marker", last+1, got)
	}
	// Nothing was sent to the subscriber: a batch published now, undropped,
	// comes first, numbered after those dropped.
	e.events.mu.Lock()
	e.events.drop = 0
	e.events.mu.Unlock()
	complete(t, base, seq(1000, 9), nil)
	if _, heard := sub.next(t, KVEventsMap, 1); heard[0] != last+1 {
		t.Errorf("the first batch heard is %d, want %d: the %d before dropped", heard[0], last+1, len(seqs))
	}
	if got := e.KVEventsDropped(); got != int64(len(seqs)) {
		t.Errorf("%d batches counted dropped, want %d", got, len(seqs))
	}
}

// askReplay asks the replay socket zc (on raw) for the batches from
// sequence number from, and reads its answer to the end marker: the
// sequence numbers of the batches, and the BlockStored events they hold
// (any other event fails the test).
func askReplay(t *testing.T, raw net.Conn, zc *zmq4.Conn, from uint64) (seqs []uint64, stored int) {
	t.Helper()
	_ = raw.SetReadDeadline(time.Now().Add(testutil.Ceiling)) // a broken socket only
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, from))); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			t.Fatal(err)
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		if len(msg.Frames) != 4 || len(msg.Frames[0]) != 0 || len(msg.Frames[2]) != 8 {
			t.Fatalf("a reply of %d frames %q: want a delimiter, the topic, a sequence number and a payload", len(msg.Frames), msg.Frames)
		}
		s := binary.BigEndian.Uint64(msg.Frames[2])
		if s == ^uint64(0) {
			if string(msg.Frames[1]) != "" || len(msg.Frames[3]) != 0 {
				t.Fatalf("end marker %q: want an empty topic and payload", msg.Frames)
			}
			return seqs, stored
		}
		if string(msg.Frames[1]) != "kv" {
			t.Fatalf("topic %q, want kv", msg.Frames[1])
		}
		for _, ev := range decodeWireBatch(t, KVEventsMap, msg.Frames[3]) {
			if ev.Type != "BlockStored" {
				t.Fatalf("batch %d holds %v: want BlockStored events only", s, ev)
			}
			stored++
		}
		seqs = append(seqs, s)
	}
}

// streakStep is a refusal at at (after the test's start), or an
// admission, and a substring of the line it must log ("" for none).
type streakStep struct {
	at     time.Duration
	admit  bool
	logged string
}

// TestRefusalStreak: refused connections are logged by the failure-streak
// rule: a line at a streak's start, then at most one every
// refusalLogInterval with the refusals since the last, and one when a
// connection is admitted again, after which a refusal starts a new streak.
func TestRefusalStreak(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	tests := []struct {
		name  string
		steps []streakStep
	}{
		{"one refusal", []streakStep{{0, false, `level=warn msg="KV event subscribers refused: as many are served as the publisher takes" max=64 refused=1 last_remote=10.0.0.1:4`}}},
		{"a burst, one line", []streakStep{{0, false, "refused=1 "}, {time.Second, false, ""}, {29 * time.Second, false, ""}}},
		{"a long streak, a line every interval", []streakStep{{0, false, "refused=1 "}, {10 * time.Second, false, ""},
			{30 * time.Second, false, "refused=2 last_remote=10.0.0.1:4 since=30s"}, {59 * time.Second, false, ""},
			{60 * time.Second, false, "refused=2 last_remote=10.0.0.1:4 since=30s"}}},
		{"admitted ends the streak", []streakStep{{0, false, "refused=1 "}, {time.Second, false, ""},
			{0, true, `level=info msg="KV event subscribers admitted again" refused=2`}, {2 * time.Second, false, "refused=1 last_remote"}}},
		{"admitted outside a streak, nothing", []streakStep{{0, true, ""}, {0, false, "refused=1 "}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logged testutil.Buffer
			r := refusalStreak{logger: log.NewLogfmtLogger(&logged), what: "KV event subscribers", limit: 64}
			remote := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 4}
			for i, s := range tt.steps {
				before := len(logged.String())
				if s.admit {
					r.admitted()
				} else {
					r.refused(t0.Add(s.at), remote)
				}
				line := logged.String()[before:]
				if s.logged == "" && line != "" || s.logged != "" && (!strings.Contains(line, s.logged) || strings.Count(line, "\n") != 1) {
					t.Errorf("step %d: logged %q, want a line with %q", i, line, s.logged)
				}
			}
		})
	}
}
