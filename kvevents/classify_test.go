package kvevents

import (
	"context"
	"encoding/binary"
	"math"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// ih is the BlockHash of an integer hash.
func ih(v uint64) BlockHash {
	var b [9]byte
	b[0] = 'i'
	binary.BigEndian.PutUint64(b[1:], v)
	return BlockHash(b[:])
}

// toks is n token ids from from.
func toks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// at is a moment of a test's timeline, in seconds.
func at(s float64) time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(s * float64(time.Second)))
}

// step is one batch of a stream's timeline.
type step struct {
	t      float64
	events []Event
	seq    int // -1: the next number
}

func stored(parent BlockHash, tokens []uint32, hashes ...uint64) Event {
	ev := Event{Kind: BlockStored, Parent: parent, Tokens: tokens, BlockSize: 4, Medium: "GPU"}
	for _, h := range hashes {
		ev.Hashes = append(ev.Hashes, ih(h))
	}
	return ev
}

func removed(hashes ...uint64) Event {
	ev := Event{Kind: BlockRemoved}
	for _, h := range hashes {
		ev.Hashes = append(ev.Hashes, ih(h))
	}
	return ev
}

var cleared = Event{Kind: AllBlocksCleared}

// replay builds a stream connected at 0 from steps.
func replay(t *testing.T, steps ...step) (*Stream, Applied) {
	t.Helper()
	s := NewStream("tcp://test:1")
	s.Connected(at(0))
	var sum Applied
	next := uint64(0)
	for _, st := range steps {
		seq := next
		if st.seq >= 0 {
			seq = uint64(st.seq)
		}
		a := s.Apply(t.Context(), seq, &Batch{Events: st.events}, at(st.t))
		sum.Missed += a.Missed
		sum.Restarted = sum.Restarted || a.Restarted
		sum.Unlinked += a.Unlinked
		sum.TooMany += a.TooMany
		sum.Inconsistent += a.Inconsistent
		next = seq + 1
	}
	return s, sum
}

// A prompt of three blocks of 4 (tokens 1-12) and one more token.
var prompt = toks(1, 13)

// Its blocks stored at 1 s, as a prefill stores them.
var promptStored = step{t: 1, seq: -1, events: []Event{stored("", toks(1, 12), 11, 12, 13)}}

func TestClassify(t *testing.T) {
	cases := []struct {
		name     string
		streams  [][]step
		from, to int
		sent     float64
		until    float64
		want     Tally
	}{
		{"held: unexplained", [][]step{{promptStored}}, 0, 12, 5, 6, Tally{ClassUnexplained: 12}},
		{"removed before the send: evicted", [][]step{{promptStored, {2, []Event{removed(13), removed(12)}, -1}}},
			4, 12, 5, 6, Tally{ClassEvicted: 8}},
		{"removed while waiting: evicted", [][]step{{promptStored, {5.5, []Event{removed(13)}, -1}}},
			8, 12, 5, 6, Tally{ClassEvicted: 4}},
		{"removed after the lookup: unexplained", [][]step{{promptStored, {7, []Event{removed(13)}, -1}}},
			8, 12, 5, 6, Tally{ClassUnexplained: 4}},
		{"never stored", [][]step{{{1, []Event{stored("", toks(50, 4), 50)}, -1}}}, 0, 8, 5, 6, Tally{ClassNeverStored: 8}},
		{"stored after the send only: never stored", [][]step{{{5.2, promptStored.events, -1}}}, 0, 12, 5, 6,
			Tally{ClassNeverStored: 12}},
		{"cleared", [][]step{{promptStored, {3, []Event{cleared}, -1}}}, 0, 12, 5, 6, Tally{ClassCleared: 12}},
		{"engine restarted: cleared", [][]step{{promptStored, {3, nil, 0}}}, 0, 12, 5, 6, Tally{ClassCleared: 12}},
		{"evicted, stored again by the request itself", [][]step{{promptStored, {2, []Event{removed(13)}, -1},
			{5.3, []Event{stored(ih(12), toks(9, 4), 14)}, -1}}}, 8, 12, 5, 6, Tally{ClassEvicted: 4}},
		{"held behind an evicted block: evicted", [][]step{{promptStored, {2, []Event{removed(12)}, -1}}},
			4, 12, 5, 6, Tally{ClassEvicted: 8}},
		{"split inside blocks", [][]step{{promptStored, {2, []Event{removed(12)}, -1}}}, 6, 10, 5, 6,
			Tally{ClassEvicted: 4}},
		{"beyond the last full block: unexplained", [][]step{{promptStored}}, 12, 13, 5, 6, Tally{ClassUnexplained: 1}},
		{"held on one replica of two: never stored here", [][]step{{promptStored}, {}}, 0, 12, 5, 6,
			Tally{ClassNeverStored: 12}},
		{"held on both replicas: unexplained", [][]step{{promptStored}, {promptStored}}, 0, 12, 5, 6,
			Tally{ClassUnexplained: 12}},
		{"evicted on one replica, never on the other: evicted", [][]step{{promptStored, {2, []Event{removed(13)}, -1}}, {}},
			8, 12, 5, 6, Tally{ClassEvicted: 4}},
		{"another adapter's blocks do not match", [][]step{{{1, []Event{func() Event {
			e := stored("", toks(1, 12), 11, 12, 13)
			e.LoRA = "adapter"
			return e
		}()}, -1}}}, 0, 12, 5, 6, Tally{ClassNeverStored: 12}},
		{"the CPU tier is not the cache", [][]step{{{1, []Event{func() Event {
			e := stored("", toks(1, 12), 11, 12, 13)
			e.Medium = "CPU"
			return e
		}()}, -1}}}, 0, 12, 5, 6, Tally{ClassNeverStored: 12}},
		{"nothing missed", [][]step{{promptStored}}, 8, 8, 5, 6, Tally{}},
		{"held when batches were lost: evicted", [][]step{{promptStored, {3, nil, 5}}}, 0, 12, 5, 6,
			Tally{ClassEvicted: 12}},
		{"held when batches were lost, removed after the lookup: held through the gap", [][]step{{promptStored,
			{3, nil, 5}, {7, []Event{removed(13)}, -1}}}, 8, 12, 5, 6, Tally{ClassUnexplained: 4}},
		{"held when batches were lost, stored again after the send: evicted", [][]step{{promptStored,
			{3, nil, 5}, {5.5, []Event{stored(ih(12), toks(9, 4), 13)}, -1}}}, 8, 12, 5, 6, Tally{ClassEvicted: 4}},
		{"another group's removal of the same hash", [][]step{{promptStored, {2, []Event{func() Event {
			e := removed(13)
			e.Group = 1
			return e
		}()}, -1}}}, 8, 12, 5, 6, Tally{ClassUnexplained: 4}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var streams []*Stream
			for _, steps := range c.streams {
				s, _ := replay(t, steps...)
				streams = append(streams, s)
			}
			got, err := Classify(streams, Miss{Tokens: prompt, From: c.from, To: c.to, BlockSize: 4, Sent: at(c.sent), Until: at(c.until)})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("Classify: %v, want %v", got, c.want)
			}
		})
	}
}

// TestClassifyChained: a block stored after its parent (a later turn of a
// conversation) is matched by its tokens through the parent's hash.
func TestClassifyChained(t *testing.T) {
	s, a := replay(t,
		step{1, []Event{stored("", toks(1, 8), 11, 12)}, -1},
		step{2, []Event{stored(ih(12), toks(9, 4), 13)}, -1},
		step{3, []Event{stored(ih(99), toks(20, 4), 20)}, -1}, // a parent never seen
	)
	if a.Unlinked != 1 {
		t.Errorf("%d unlinked blocks, want 1", a.Unlinked)
	}
	got, err := Classify([]*Stream{s}, Miss{Tokens: prompt, From: 0, To: 12, Sent: at(5), Until: at(6)})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Tally{ClassUnexplained: 12}); !reflect.DeepEqual(got, want) {
		t.Errorf("Classify: %v, want %v (every block of the prompt held)", got, want)
	}
}

// TestStreamFollowing: a stream follows from its connection on, and not
// across lost batches, a decode error or a disconnection.
func TestStreamFollowing(t *testing.T) {
	s, a := replay(t, step{1, nil, 0}, step{2, nil, 1}, step{4, nil, 5})
	if a.Missed != 3 {
		t.Errorf("%d batches missed, want 3", a.Missed)
	}
	for _, c := range []struct {
		sent float64
		want bool
	}{{-1, false}, {1, false}, {3.9, false}, {4, true}, {10, true}} {
		if got := s.Following(at(c.sent)); got != c.want {
			t.Errorf("Following(%v s): %v, want %v", c.sent, got, c.want)
		}
	}
	s.Lost(at(6))
	if s.Following(at(5)) || !s.Following(at(6)) {
		t.Error("a lost batch at 6 s: want followed from 6 s only")
	}
	s.Disconnected()
	if s.Following(at(7)) {
		t.Error("disconnected: want not followed")
	}
}

// TestStoreBounds: the removed blocks remembered are bounded, the latest
// kept; one forgotten still reads evicted, from the set of blocks seen.
func TestStoreBounds(t *testing.T) {
	s := NewStream("tcp://test:1")
	s.Connected(at(0))
	n := maxRemoved + 10
	for i := range n {
		b := &Batch{Events: []Event{stored("", toks(4*i, 4), uint64(i+1)), removed(uint64(i + 1))}}
		s.Apply(t.Context(), uint64(i), b, at(1))
	}
	if got := len(s.blocks); got != maxRemoved {
		t.Errorf("%d blocks kept, want %d", got, maxRemoved)
	}
	oldest := Miss{Tokens: toks(0, 5), From: 0, To: 4, BlockSize: 4, Sent: at(2), Until: at(2)}
	latest := oldest
	latest.Tokens = toks(4*(n-1), 5)
	if _, ok := s.blocks[nextKey(rootKey("", 0), toks(0, 4), "")]; ok {
		t.Error("the oldest removal is still held")
	}
	if got, _ := Classify([]*Stream{s}, oldest); got[ClassEvicted] != 4 {
		t.Errorf("the oldest removal, forgotten: %v, want evicted (it was seen stored)", got)
	}
	// Stored again after the send (by the request itself): still evicted
	// as of the send, though its new record starts after it.
	s.Apply(t.Context(), uint64(n), &Batch{Events: []Event{stored("", toks(0, 4), 1)}}, at(3))
	if got, _ := Classify([]*Stream{s}, oldest); got[ClassEvicted] != 4 {
		t.Errorf("the oldest removal, forgotten, then stored after the send: %v, want evicted", got)
	}
	never := oldest
	never.Tokens = toks(1<<30, 5)
	if got, _ := Classify([]*Stream{s}, never); got[ClassNeverStored] != 4 {
		t.Errorf("a block never stored: %v, want never stored", got)
	}
	if got, _ := Classify([]*Stream{s}, latest); got[ClassEvicted] != 4 {
		t.Errorf("the latest removal: %v, want evicted", got)
	}
}

// TestStoreBytesPerBlock measures what a held block costs, the figure the
// bounds in store.go rest on.
func TestStoreBytesPerBlock(t *testing.T) {
	const n = 100_000
	s := NewStream("tcp://test:1")
	batches := make([]Batch, n) // made before measuring: the store keeps none
	for i := range batches {
		ev := stored("", toks(16*i, 16), uint64(i+1))
		ev.BlockSize = 16
		batches[i] = Batch{Events: []Event{ev}}
	}
	s.seen.add(0) // its fixed 10 MB, apart from what a block costs
	runtime.GC()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range batches {
		s.Apply(t.Context(), uint64(i), &batches[i], at(1))
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / n
	t.Logf("%.0f bytes a held block", per)
	if per > 160 {
		t.Errorf("%.0f bytes a held block, more than the 160 the bounds allow for", per)
	}
	if len(s.aliveKeys) != n {
		t.Fatalf("%d blocks held, want %d", len(s.aliveKeys), n)
	}
	runtime.KeepAlive(s)
	runtime.KeepAlive(batches)
}

// TestSeenSet: a block is remembered for at least a generation of stores,
// forgotten after two, and the false positives stay under 2 %.
func TestSeenSet(t *testing.T) {
	const gen = 1 << 14
	s := newSeenSet(gen)
	key := func(i int) chainKey { return nextKey(rootKey("", 0), []uint32{uint32(i)}, "") }
	s.add(key(-1))
	for i := range gen - 1 {
		s.add(key(i))
	}
	if !s.has(key(-1)) {
		t.Fatal("forgotten within its generation")
	}
	for i := range gen {
		s.add(key(gen + i)) // the next generation
	}
	if !s.has(key(-1)) {
		t.Fatal("forgotten in the generation after its own")
	}
	for i := range gen {
		s.add(key(2*gen + i))
	}
	fp := 0
	const probes = 100_000
	for i := range probes {
		if s.has(key(-2 - i)) { // never added
			fp++
		}
	}
	rate := float64(fp) / probes
	t.Logf("%.2f %% false positives with both filters full", 100*rate)
	if rate > 0.02 {
		t.Errorf("%.2f %% false positives, want under 2 %%", 100*rate)
	}
	if s.has(key(-1)) && s.has(key(0)) && s.has(key(1)) {
		t.Error("two generations later, the first keys are still there")
	}
}

// saltedStored is stored with extra_keys as vLLM sends them for a text
// prompt under salt ("" for none): the salt on the first block when parent
// is "", nothing on the others.
func saltedStored(salt string, parent BlockHash, tokens []uint32, hashes ...uint64) Event {
	ev := stored(parent, tokens, hashes...)
	ev.Extra = make([]ExtraKeys, len(hashes))
	if parent == "" {
		ev.Extra[0] = saltExtraKeys(salt)
	}
	return ev
}

// TestClassifySalt: on a stream whose events carry extra_keys, a block is
// known by its salt as well as its tokens: another salt's block (or an
// unsalted one) with the same tokens is another block, and a request is
// looked up under its own salt. On a stream without them (vLLM before
// extra_keys) a salted request matches the same tokens under any salt, as
// before.
func TestClassifySalt(t *testing.T) {
	const a, b = "salt-a", "salt-b"
	cases := []struct {
		name  string
		steps []step
		salt  string
		want  Tally
	}{
		{"held under the request's salt: unexplained", []step{{1, []Event{saltedStored(a, "", toks(1, 12), 11, 12, 13)}, -1}},
			a, Tally{ClassUnexplained: 12}},
		{"held under another salt only: never stored", []step{{1, []Event{saltedStored(b, "", toks(1, 12), 21, 22, 23)}, -1}},
			a, Tally{ClassNeverStored: 12}},
		{"held unsalted only: never stored", []step{{1, []Event{saltedStored("", "", toks(1, 12), 31, 32, 33)}, -1}},
			a, Tally{ClassNeverStored: 12}},
		{"held salted only, an unsalted request: never stored", []step{{1, []Event{saltedStored(a, "", toks(1, 12), 11, 12, 13)}, -1}},
			"", Tally{ClassNeverStored: 12}},
		{"evicted, then the same tokens stored under another salt: evicted", []step{
			{1, []Event{saltedStored(a, "", toks(1, 12), 11, 12, 13)}, -1},
			{2, []Event{removed(13), removed(12), removed(11)}, -1},
			{3, []Event{saltedStored(b, "", toks(1, 12), 21, 22, 23)}, -1}},
			a, Tally{ClassEvicted: 12}},
		{"an extension keeps its parent's salt", []step{
			{1, []Event{saltedStored(a, "", toks(1, 8), 11, 12)}, -1},
			{2, []Event{saltedStored(a, ih(12), toks(9, 4), 13)}, -1},
			{3, []Event{saltedStored(b, "", toks(1, 8), 21, 22)}, -1},
			{4, []Event{removed(22)}, -1}},
			a, Tally{ClassUnexplained: 12}},
		{"an extension of another salt's blocks is not the request's", []step{
			{1, []Event{saltedStored(b, "", toks(1, 8), 21, 22)}, -1},
			{2, []Event{saltedStored(b, ih(22), toks(9, 4), 23)}, -1}},
			a, Tally{ClassNeverStored: 12}},
		{"events without extra_keys: the same tokens match", []step{
			{1, []Event{stored("", toks(1, 12), 11, 12, 13)}, -1}},
			a, Tally{ClassUnexplained: 12}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, applied := replay(t, c.steps...)
			if applied != (Applied{}) {
				t.Fatalf("applying the events: %+v", applied)
			}
			got, err := Classify([]*Stream{s}, Miss{Tokens: prompt, From: 0, To: 12, BlockSize: 4, Sent: at(5), Until: at(6), Salt: c.salt})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("Classify: %v, want %v", got, c.want)
			}
		})
	}
}

// TestStoreExtraKeysNotOneABlock: a BlockStored whose extra keys are not
// one a block is not taken.
func TestStoreExtraKeysNotOneABlock(t *testing.T) {
	ev := saltedStored("salt-a", "", toks(1, 8), 11, 12)
	ev.Extra = ev.Extra[:1]
	s, applied := replay(t, step{1, []Event{ev}, -1})
	if applied.Inconsistent != 1 || len(s.blocks) != 0 {
		t.Errorf("%+v, %d blocks kept; want one inconsistent event and none kept", applied, len(s.blocks))
	}
}

// TestStoreHashIndexBound: the same block stored again and again under new
// engine hashes while it is held indexes at most maxHashIDs of them; the
// rest are counted as overflow, and one block is held.
func TestStoreHashIndexBound(t *testing.T) {
	s := NewStream("tcp://test:1")
	s.maxAlive, s.maxHashIDs = 100, 100
	const n = 1000
	overflow := 0
	for i := range n {
		overflow += s.Apply(t.Context(), uint64(i), &Batch{Events: []Event{stored("", toks(1, 4), uint64(i+1))}}, at(1)).TooMany
	}
	if len(s.hashes) != s.maxHashIDs || overflow != n-s.maxHashIDs || len(s.aliveKeys) != 1 {
		t.Errorf("%d hashes indexed, %d counted as overflow, %d blocks held; want %d, %d, 1",
			len(s.hashes), overflow, len(s.aliveKeys), s.maxHashIDs, n-s.maxHashIDs)
	}
}

// countdownCtx is a context whose Err is nil for its first calls, then
// Canceled. Each call checks that the stream's lock is free: Apply asks
// between events, and holds the lock for one event at most.
type countdownCtx struct {
	context.Context
	t      *testing.T
	s      *Stream
	left   int
	locked int // calls that found the lock held
}

func (c *countdownCtx) Err() error {
	if c.s.mu.TryLock() {
		c.s.mu.Unlock()
	} else {
		c.locked++
	}
	if c.left == 0 {
		return context.Canceled
	}
	c.left--
	return nil
}

// TestApplyStopsMidBatch: a hostile batch (20,000 clears between stores,
// over thousands of held blocks) stops at the first event after its
// context ends, and the lock is free between events, so that a stop waits
// for one event, not for the batch.
func TestApplyStopsMidBatch(t *testing.T) {
	s := NewStream("tcp://test:1")
	var fill []Event
	for i := range 5000 {
		fill = append(fill, stored("", toks(4*i, 4), uint64(i+1)))
	}
	s.Apply(t.Context(), 0, &Batch{Events: fill}, at(1))
	var hostile []Event
	for i := range 20_000 {
		hostile = append(hostile, cleared, stored("", toks(4*i, 4), uint64(i+1)))
	}
	ctx := &countdownCtx{Context: t.Context(), t: t, s: s, left: 1000}
	a := s.Apply(ctx, 1, &Batch{Events: hostile}, at(2))
	if a.Events != 1000 || ctx.locked != 0 {
		t.Errorf("%d of %d events applied, the lock held at %d of the checks between them; want 1000, none",
			a.Events, len(hostile), ctx.locked)
	}
}

// TestApplySequence: the batches a stream's sequence numbers skip are
// counted as lost up to MaxSequenceJump; a longer jump, as a step back, is
// an engine that started again: what the stream held is let go.
func TestApplySequence(t *testing.T) {
	cases := []struct {
		name      string
		next      uint64 // after batch 10
		missed    uint64
		restarted bool
	}{
		{"the next", 11, 0, false},
		{"a gap", 15, 4, false},
		{"the longest gap", 11 + MaxSequenceJump, MaxSequenceJump, false},
		{"a jump longer than that", 12 + MaxSequenceJump, 0, true},
		{"a jump of 2^62", 1 << 62, 0, true},
		{"the last number", math.MaxUint64, 0, true},
		{"the same again", 10, 0, true},
		{"back to 0", 0, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewStream("tcp://test:1")
			s.Connected(at(0))
			s.Apply(t.Context(), 10, &Batch{Events: []Event{stored("", toks(1, 4), 1)}}, at(1))
			a := s.Apply(t.Context(), c.next, &Batch{}, at(2))
			if a.Missed != c.missed || a.Restarted != c.restarted {
				t.Errorf("missed %d, restarted %v; want %d, %v", a.Missed, a.Restarted, c.missed, c.restarted)
			}
			// Lost batches may have removed it, as a new engine has.
			want := !c.restarted && c.missed == 0
			if held := len(s.aliveKeys) == 1; held != want {
				t.Errorf("the block held: %v, want %v", held, want)
			}
		})
	}
}

// BenchmarkStoreBytesPerBlock measures what a held block costs at the
// bound, maxAlive held blocks of 16 tokens each under its own hash, its
// record, its place among the held blocks and its hash's entry together,
// the fixed set of blocks seen (10 MB) apart: the figure of the store's
// row in docs/reliability.md.
func BenchmarkStoreBytesPerBlock(b *testing.B) {
	const n = maxAlive
	events := make([]Event, n) // made before measuring: the store keeps none
	tokens := toks(0, 16*n)
	for i := range events {
		events[i] = Event{Kind: BlockStored, Hashes: []BlockHash{ih(uint64(i + 1))}, Tokens: tokens[16*i : 16*(i+1)], BlockSize: 16}
	}
	batch := &Batch{Events: events}
	var per float64
	for b.Loop() {
		s := NewStream("tcp://test:1")
		s.seen.add(0)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s.Apply(b.Context(), 0, batch, at(1))
		runtime.GC()
		runtime.ReadMemStats(&after)
		if len(s.aliveKeys) != n {
			b.Fatalf("%d blocks held, want %d", len(s.aliveKeys), n)
		}
		per = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(per, "bytes/block")
}

// BenchmarkStoreClears: one batch of 20,000 AllBlocksCleared over 131,072
// blocks remembered (removed) and 1,024 held.
func BenchmarkStoreClears(b *testing.B) {
	var fill []Event
	for i := range 1 << 17 {
		fill = append(fill, stored("", toks(4*i, 4), uint64(i+1)), removed(uint64(i+1)))
	}
	for i := range 1 << 10 {
		fill = append(fill, stored("", toks(4*i, 4), uint64(i+1)))
	}
	clears := make([]Event, 20_000)
	for i := range clears {
		clears[i] = cleared
	}
	for b.Loop() {
		b.StopTimer()
		s := NewStream("tcp://test:1")
		s.Apply(b.Context(), 0, &Batch{Events: fill}, at(1))
		b.StartTimer()
		s.Apply(b.Context(), 1, &Batch{Events: clears}, at(2))
	}
}

// BenchmarkStoreBytesPerRemoved measures what a block removed and
// remembered costs at the bound, maxRemoved of them: its record and its
// place in the queue of removals.
func BenchmarkStoreBytesPerRemoved(b *testing.B) {
	const n = maxRemoved
	events := make([]Event, 0, 2*n)
	tokens := toks(0, 16*n)
	for i := range n {
		h := []BlockHash{ih(uint64(i + 1))}
		events = append(events, Event{Kind: BlockStored, Hashes: h, Tokens: tokens[16*i : 16*(i+1)], BlockSize: 16},
			Event{Kind: BlockRemoved, Hashes: h})
	}
	batch := &Batch{Events: events}
	var per float64
	for b.Loop() {
		s := NewStream("tcp://test:1")
		s.seen.add(0)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s.Apply(b.Context(), 0, batch, at(1))
		runtime.GC()
		runtime.ReadMemStats(&after)
		if len(s.removed) != n || len(s.aliveKeys) != 0 {
			b.Fatalf("%d removals remembered, %d blocks held; want %d, 0", len(s.removed), len(s.aliveKeys), n)
		}
		per = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(per, "bytes/block")
}

// TestGapLosesSight: a block held when batches were lost is no longer
// held (it reads evicted), a later batch's blocks still link to it, and
// the blocks stored since are held.
func TestGapLosesSight(t *testing.T) {
	s, a := replay(t, promptStored, step{3, []Event{stored(ih(13), toks(13, 4), 14)}, 5})
	if a.Missed != 4 || a.Unlinked != 0 {
		t.Fatalf("%+v: want 4 batches missed and the block after the gap linked to its parent", a)
	}
	long := toks(1, 17)
	got, err := Classify([]*Stream{s}, Miss{Tokens: long, From: 0, To: 16, BlockSize: 4, Sent: at(5), Until: at(6)})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Tally{ClassEvicted: 16}); !reflect.DeepEqual(got, want) {
		t.Errorf("Classify: %v, want %v: the first three blocks lost sight of, the fourth behind them", got, want)
	}
	got, _ = Classify([]*Stream{s}, Miss{Tokens: long, From: 12, To: 16, BlockSize: 4, Sent: at(5), Until: at(6)})
	if want := (Tally{ClassUnexplained: 4}); !reflect.DeepEqual(got, want) {
		t.Errorf("Classify of the block stored after the gap: %v, want %v", got, want)
	}
	if len(s.aliveKeys) != 1 {
		t.Errorf("%d blocks held, want the one stored after the gap", len(s.aliveKeys))
	}
}

// TestGapsDoNotFillTheStore: 1,100 gaps, each after 1,000 blocks whose
// removals the lost batches carried, leave the store as roomy as it was:
// no block lives on after a gap, and the hashes of those lost sight of
// give way to new ones.
func TestGapsDoNotFillTheStore(t *testing.T) {
	const perGap, gaps = 1000, 1100
	s := NewStream("tcp://test:1")
	if testutil.RaceEnabled {
		// The same proportions, a tenth of the work.
		s.maxAlive, s.maxHashIDs = maxAlive/10, maxHashIDs/10
	}
	n := gaps
	if testutil.RaceEnabled {
		n = gaps / 10
	}
	s.Connected(at(0))
	seq, id, overflow := uint64(0), 0, 0
	events := make([]Event, perGap)
	for g := range n + 1 {
		for i := range events {
			id++
			events[i] = Event{Kind: BlockStored, Hashes: []BlockHash{ih(uint64(id))}, Tokens: []uint32{uint32(id)}, BlockSize: 1}
		}
		overflow += s.Apply(t.Context(), seq, &Batch{Events: events}, at(float64(g))).TooMany
		seq += 2 // the next batch, which removed them, is lost
	}
	if overflow != 0 || len(s.aliveKeys) != perGap {
		t.Errorf("%d blocks not kept, %d held; want none, and the %d stored since the last gap", overflow, len(s.aliveKeys), perGap)
	}
	if idx := len(s.hashes) + len(s.stale); idx > s.maxHashIDs {
		t.Errorf("%d hashes indexed, more than %d", idx, s.maxHashIDs)
	}
}

// TestClassifyGroups: a hybrid model's groups keep their own block sizes,
// and a request is looked up in its full-attention group, however the
// sliding-window group's events come between.
func TestClassifyGroups(t *testing.T) {
	full := stored("", toks(1, 12), 11, 12, 13)
	full.SpecKind = "full_attention"
	window := Event{Kind: BlockStored, Hashes: []BlockHash{ih(11)}, Tokens: toks(1, 8), BlockSize: 8, Medium: "GPU",
		Group: 1, SpecKind: "sliding_window", SlidingWindow: 8}
	windowGone := removed(11)
	windowGone.Group = 1
	s, _ := replay(t, step{1, []Event{full, window, windowGone}, -1})
	if g, bs := s.PrefixGroup(); g != 0 || bs != 4 {
		t.Errorf("prefix group %d of block size %d, want 0 of 4", g, bs)
	}
	got, err := Classify([]*Stream{s}, Miss{Tokens: prompt, From: 0, To: 12, BlockSize: 16, Sent: at(5), Until: at(6)})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Tally{ClassUnexplained: 12}); !reflect.DeepEqual(got, want) {
		t.Errorf("Classify: %v, want %v: every block held in group 0", got, want)
	}
	// Group 1 alone, full attention after a sliding window group 0.
	first := window
	first.Group, first.Hashes, first.BlockSize, first.Tokens = 0, []BlockHash{ih(21)}, 4, toks(1, 4)
	second := full
	second.Group = 1
	s, _ = replay(t, step{1, []Event{first, second}, -1})
	if g, bs := s.PrefixGroup(); g != 1 || bs != 4 {
		t.Errorf("prefix group %d of block size %d, want 1 of 4", g, bs)
	}
	got, _ = Classify([]*Stream{s}, Miss{Tokens: prompt, From: 0, To: 12, Sent: at(5), Until: at(6)})
	if want := (Tally{ClassUnexplained: 12}); !reflect.DeepEqual(got, want) {
		t.Errorf("Classify with full attention in group 1: %v, want %v", got, want)
	}
}
