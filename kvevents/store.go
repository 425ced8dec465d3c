package kvevents

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"
)

// Memory bounds of one stream's block store. A block the engine holds
// takes 156 bytes at 1 Mi held (its record, its place in the list of held
// blocks and its hash's entry, with the maps' room to grow; measured by
// BenchmarkStoreBytesPerBlock), so a stream holds at most DefaultMaxBlocks
// blocks unless configured (156 MiB, far more than an engine's KV cache
// holds: an 8B model on an 80 GB GPU keeps about 50,000 blocks of 16
// tokens), indexes as many engine hashes (a block stored again under
// another hash while held takes one more), remembers when the last
// maxRemoved blocks the engine let go were removed (130 bytes each, 16
// MiB; BenchmarkStoreBytesPerRemoved), and that the last 4 to 8 Mi blocks
// stored were (seenSet, 10 MB).
const (
	// DefaultMaxBlocks is a stream's bound on blocks held, and on engine
	// hashes indexed, unless configured (cache.kv_events_max_blocks).
	DefaultMaxBlocks = 1 << 20
	// MaxMaxBlocks is the largest bound that can be configured: 2.5 GiB.
	MaxMaxBlocks = 1 << 24
	maxAlive     = DefaultMaxBlocks
	maxHashIDs   = maxAlive
	maxRemoved   = 1 << 17
	// MaxSequenceJump is the most batches a stream's sequence numbers may
	// skip and be counted as lost: a longer jump is an engine that started
	// again, or a number that means nothing; either way what the stream
	// held is unknown, and it starts empty.
	MaxSequenceJump = 1 << 20
	// histLen transitions of a block are kept: enough to see it stored,
	// removed and stored again around one request.
	histLen = 4
)

// chainKey names a block by its token ids and those of every block before
// it: the key of the block before, then the block's tokens and its extra
// keys where the events carry them, hashed. Equal keys are equal prefixes
// under equal extra keys (a prompt's cache salt rides on its first block's
// and so reaches every block after it), whatever the engine's hash seed.
type chainKey uint64

// keySeed seeds the chain keys of this process: keys are only compared
// within it.
var keySeed = maphash.MakeSeed()

// rootKey is the parent key of a prompt's first block, per LoRA adapter
// and KV cache group, whose blocks never match another's.
func rootKey(lora string, group int) chainKey {
	var h maphash.Hash
	h.SetSeed(keySeed)
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(group))
	h.Write(b[:])
	h.WriteString(lora)
	return chainKey(h.Sum64())
}

// nextKey is the key of a block of tokens after the block parent, with
// extra keys extra ("" for none, which keys it as before extra_keys).
func nextKey(parent chainKey, tokens []uint32, extra ExtraKeys) chainKey {
	var h maphash.Hash
	h.SetSeed(keySeed)
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(parent))
	h.Write(b[:])
	for _, t := range tokens {
		binary.BigEndian.PutUint32(b[:4], t)
		h.Write(b[:4])
	}
	if extra != "" {
		// After the block's whole tokens, its length first: no run of
		// tokens alone reads the same.
		h.Write(binary.AppendUvarint(b[:0], uint64(len(extra))))
		h.WriteString(string(extra))
	}
	return chainKey(h.Sum64())
}

// hashID folds an engine hash of KV cache group group to the uint64 that
// indexes it. The groups of a hybrid model share a request's block hashes,
// so a hash names a block only within its group: a sliding-window group
// removing a block says nothing of the full-attention group's.
func hashID(group int, h BlockHash) uint64 {
	var id uint64
	if len(h) == 9 && h[0] == 'i' {
		id = binary.BigEndian.Uint64([]byte(h[1:]))
	} else {
		id = maphash.String(keySeed, string(h))
	}
	// Group 0 indexes the hash as it is; another group's is moved by an
	// odd multiple of the golden ratio, which no two groups share.
	return id + uint64(group)*0x9e3779b97f4a7c15
}

// transition is one change of a block: when (Unix nanoseconds, shifted
// left by 2) and what (the low 2 bits).
type transition int64

const (
	// tLost: the stream lost batches while the block was held, and the
	// batches were not replayed: one of them may have removed it.
	tLost    = 0
	tStored  = 1
	tRemoved = 2
	tCleared = 3
)

func newTransition(at time.Time, what int64) transition { return transition(at.UnixNano()<<2 | what) }

func (t transition) at() int64  { return int64(t) >> 2 }
func (t transition) what() int8 { return int8(t & 3) }

// record is a block's last transitions, oldest first.
type record struct {
	hist [histLen]transition
	n    uint8
	// dropped: older transitions were let go to keep the last histLen.
	dropped bool
	// slot is the block's place in Stream.aliveKeys while it is held.
	slot uint32
}

func (r *record) add(t transition) {
	if int(r.n) == histLen {
		copy(r.hist[:], r.hist[1:])
		r.n--
		r.dropped = true
	}
	r.hist[r.n] = t
	r.n++
}

func (r *record) alive() bool { return r.n > 0 && r.hist[r.n-1].what() == tStored }

// State is what a stream knows of a block at a moment.
type State uint8

// The states of a block, as of a request's send time.
const (
	// Unseen: never stored on the stream as far as it saw.
	Unseen State = iota
	// Alive: stored and held at the send time, and not removed by the end
	// of the request.
	Alive
	// Evicted: removed before the send time, or while the request waited.
	Evicted
	// Cleared: emptied with the whole cache (AllBlocksCleared, or the
	// engine restarted).
	Cleared
	// Lost: held when the stream lost batches, and not seen since: the
	// lost batches may have removed it.
	Lost
)

// removedKey is one entry of the queue of removed blocks, oldest first:
// the block and its removal, so that a block stored again since is kept.
type removedKey struct {
	key chainKey
	at  transition
}

// Stream is what one event stream (one engine, or one data-parallel
// rank) told of its blocks. Its methods are safe for concurrent use.
type Stream struct {
	Endpoint string
	// Replay is the engine's replay socket (its replay_endpoint), asked
	// for the batches a gap skipped; "" for none.
	Replay string
	// stall bounds a message's silence once it started (stallTimeout but
	// in tests).
	stall time.Duration

	mu        sync.Mutex
	groups    map[int]groupSpec   // the KV cache groups that stored blocks, at most maxGroups
	extraKeys bool                // a BlockStored carried extra_keys: blocks are keyed by them
	blocks    map[chainKey]record // alive and removed blocks
	// aliveKeys are the blocks held, in no order, so that a clear costs
	// what the engine holds rather than what the stream remembers.
	aliveKeys []chainKey
	// hashes indexes the engine's hash (by group) of each block held;
	// stale those of the blocks held when batches were lost and not seen
	// since, kept to link their children and take their removals, and
	// dropped whole when the index needs room: together at most
	// maxHashIDs.
	hashes  map[uint64]chainKey
	stale   map[uint64]chainKey
	removed []removedKey // ring of maxRemoved, oldest at head
	head    int
	seen    seenSet // every block stored, for those removed and forgotten
	// The bounds: maxAlive, maxHashIDs and maxRemoved but in tests.
	maxAlive, maxHashIDs, maxRemoved int
	// since is when the stream's view became complete: it connected, or
	// lost batches, at since; zero while it is not connected.
	since   time.Time
	lastSeq uint64
	lastAt  time.Time // when batch lastSeq happened
	haveSeq bool
	// The engine's clock, read from the batches' timestamps (clock): the
	// least the exporter's clock was ahead of it when a batch came, and
	// when the latest batch came (the exporter's clock) and happened (the
	// engine's clock plus ahead).
	ahead              time.Duration
	knowsAhead         bool
	lastCame, lastSent time.Time
	// replaying is open while a replay fills a gap: what the stream holds
	// is behind the engine until it closes.
	replaying chan struct{}

	tried     chan struct{} // closed once the first connection attempt ended
	triedOnce sync.Once
}

// maxGroups bounds the KV cache groups a stream tells apart: a hybrid
// model has a few (full attention, sliding window, mamba).
const maxGroups = 64

// groupSpec is what a stream's BlockStored events told of one KV cache
// group.
type groupSpec struct {
	blockSize int
	kind      string // kv_cache_spec_kind; "" before vLLM sent it
	window    int    // kv_cache_spec_sliding_window; 0 for none
}

// holdsPrefixes tells whether the group's blocks are the prefix cache a
// request is served from: full attention keeps every block of a prompt;
// a sliding window, a chunked local attention or a state-space model
// keeps only its last ones, and drops the rest as it goes.
func (g groupSpec) holdsPrefixes() bool {
	if g.window > 0 {
		return false
	}
	switch g.kind {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// NewStream returns the empty store of the stream at endpoint.
func NewStream(endpoint string) *Stream {
	return &Stream{Endpoint: endpoint, groups: map[int]groupSpec{}, blocks: map[chainKey]record{}, hashes: map[uint64]chainKey{},
		seen: newSeenSet(seenGeneration), tried: make(chan struct{}), stall: stallTimeout,
		maxAlive: maxAlive, maxHashIDs: maxHashIDs, maxRemoved: maxRemoved}
}

// Tried is closed once the stream's first connection attempt has ended:
// it connected, or failed.
func (s *Stream) Tried() <-chan struct{} { return s.tried }

func (s *Stream) markTried() { s.triedOnce.Do(func() { close(s.tried) }) }

// Applied tells what applying one batch found wrong.
type Applied struct {
	// Events is how many of the batch's events were applied: all of them
	// unless the context ended first.
	Events int
	// Missed is how many batches the sequence numbers skipped, at most
	// MaxSequenceJump.
	Missed uint64
	// Restarted: the sequence went back, or jumped by more than
	// MaxSequenceJump: a new engine, whose cache starts empty.
	Restarted bool
	// Unlinked counts stored blocks whose parent the stream does not know
	// (stored before it was followed): they cannot be keyed by tokens.
	Unlinked int
	// TooMany counts stored blocks not kept, maxAlive being held, and
	// engine hashes not indexed, maxHashIDs being indexed.
	TooMany int
	// Inconsistent counts BlockStored events whose token ids are not
	// their blocks' size times their count, whose extra keys are not one
	// a block, or whose group is past maxGroups.
	Inconsistent int
}

// Connected marks the stream followed from at on; what came before is
// unknown.
func (s *Stream) Connected(at time.Time) {
	s.mu.Lock()
	s.since = at
	s.mu.Unlock()
}

// Disconnected marks the stream not followed.
func (s *Stream) Disconnected() {
	s.mu.Lock()
	s.since = time.Time{}
	s.mu.Unlock()
}

// Lost marks the stream's view incomplete before at: a batch could not be
// decoded.
func (s *Stream) Lost(at time.Time) {
	s.mu.Lock()
	if !s.since.IsZero() {
		s.since = at
	}
	s.mu.Unlock()
}

// clock is when a batch stamped ts by the engine's clock (seconds since
// the epoch; not a time when 0, NaN or absurd) and taken at at happened,
// by the exporter's clock: the engine's time plus the least the
// exporter's clock has been ahead of it, never after at nor before the
// batch before it. A busy exporter takes batches late, and a block stamped
// when it was taken would read as stored after requests that it served,
// and removed after requests that missed it.
func (s *Stream) clock(at time.Time, ts float64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastCame = at
	t := at
	if d := engineClock(at, ts); d != noOffset {
		if !s.knowsAhead || d < s.ahead {
			s.ahead, s.knowsAhead = d, true
		}
		t = at.Add(s.ahead - d)
	}
	if t.Before(s.lastSent) {
		t = s.lastSent
	}
	s.lastSent = t
	return t
}

// caughtUp tells whether the stream has taken every batch the engine
// published by t, as far as it can know at now: one that happened after
// t came, or nothing came for quiet (the engine published nothing since,
// or the stream takes no timestamps).
func (s *Stream) caughtUp(t, now time.Time, quiet time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastCame.IsZero() || !s.lastSent.Before(t) || now.Sub(s.lastCame) >= quiet
}

// gapBefore tells whether batch seq follows batches the stream has not
// seen, at most maxBatches of them: it returns the first of them and when
// the batch before them was taken. A stream's first batch numbered shortly
// after the engine's start (lateJoinBatches) follows the batches from 0 on,
// sent before the subscription took, timed from when the stream connected.
func (s *Stream) gapBefore(seq uint64, maxBatches uint64) (from uint64, after time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.haveSeq {
		if seq == 0 || seq > lateJoinBatches {
			return 0, time.Time{}, false
		}
		return 0, s.since, true
	}
	if seq <= s.lastSeq+1 || seq-s.lastSeq-1 > maxBatches {
		return 0, time.Time{}, false
	}
	return s.lastSeq + 1, s.lastAt, true
}

// startReplay marks the stream behind its engine until the returned func
// runs: a classification waits for it (settled).
func (s *Stream) startReplay() (done func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.replaying = ch
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.replaying = nil
		s.mu.Unlock()
		close(ch)
	}
}

// settled returns once no replay is filling a gap of the stream, or ctx
// has ended.
func (s *Stream) settled(ctx context.Context) {
	s.mu.Lock()
	ch := s.replaying
	s.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// Apply takes the batch numbered seq, received at at, event by event
// until ctx ends: the lock is taken for one event at a time (a clear, the
// longest, costs what the engine holds), so that a stop, or a request
// being classified, waits for one event at most. Batches skipped before
// it lose sight of every block held: any of them may have removed it.
func (s *Stream) Apply(ctx context.Context, seq uint64, b *Batch, at time.Time) Applied {
	var a Applied
	s.mu.Lock()
	if s.haveSeq {
		switch {
		case seq > s.lastSeq && seq-s.lastSeq-1 <= MaxSequenceJump:
			if a.Missed = seq - s.lastSeq - 1; a.Missed > 0 {
				s.since = at
				s.loseSightLocked(at)
			}
		default:
			a.Restarted = true
			s.clearLocked(at)
			if seq > s.lastSeq {
				// A jump, not a new sequence: batches may have been lost
				// as well.
				s.since = at
			}
		}
	}
	s.lastSeq, s.lastAt, s.haveSeq = seq, at, true
	s.mu.Unlock()
	for i := range b.Events {
		if ctx.Err() != nil {
			break
		}
		s.mu.Lock()
		s.applyLocked(&b.Events[i], at, &a)
		s.mu.Unlock()
		a.Events++
	}
	return a
}

func (s *Stream) applyLocked(ev *Event, at time.Time, a *Applied) {
	if ev.Medium != "" && ev.Medium != "GPU" {
		return // an offload tier: the engine's prefix cache is its GPU's
	}
	switch ev.Kind {
	case BlockStored:
		s.storeLocked(ev, at, a)
	case BlockRemoved:
		t := newTransition(at, tRemoved)
		for _, h := range ev.Hashes {
			id := hashID(ev.Group, h)
			k, ok := s.hashes[id]
			if ok {
				delete(s.hashes, id)
			} else if k, ok = s.stale[id]; ok {
				delete(s.stale, id)
			} else {
				continue // stored before the stream was followed
			}
			s.removeLocked(k, t)
		}
	case AllBlocksCleared:
		s.clearLocked(at)
	}
}

// parentLocked finds the block an engine hash names, a stale entry moving
// back to the index: its block has a child now, so the engine holds it.
func (s *Stream) parentLocked(id uint64) (chainKey, bool) {
	if k, ok := s.hashes[id]; ok {
		return k, true
	}
	k, ok := s.stale[id]
	if ok {
		delete(s.stale, id)
		s.hashes[id] = k
	}
	return k, ok
}

func (s *Stream) storeLocked(ev *Event, at time.Time, a *Applied) {
	bs := ev.BlockSize
	if len(ev.Tokens) != bs*len(ev.Hashes) || (ev.Extra != nil && len(ev.Extra) != len(ev.Hashes)) ||
		ev.Group < 0 || ev.Group >= maxGroups {
		a.Inconsistent++
		return
	}
	g := s.groups[ev.Group]
	g.blockSize = bs
	if ev.SpecKind != "" {
		g.kind, g.window = ev.SpecKind, ev.SlidingWindow
	}
	s.groups[ev.Group] = g
	if ev.Extra != nil {
		s.extraKeys = true
	}
	var k chainKey
	if ev.Parent == "" {
		k = rootKey(ev.LoRA, ev.Group)
	} else {
		var ok bool
		if k, ok = s.parentLocked(hashID(ev.Group, ev.Parent)); !ok {
			a.Unlinked += len(ev.Hashes)
			return
		}
	}
	t := newTransition(at, tStored)
	for i, h := range ev.Hashes {
		var extra ExtraKeys
		if ev.Extra != nil {
			extra = ev.Extra[i]
		}
		k = nextKey(k, ev.Tokens[i*bs:(i+1)*bs], extra)
		// A block removed and stored again keeps its entry in the removed
		// queue, which passes over it when its turn comes.
		r, held := s.blocks[k]
		if !held && s.seen.has(k) {
			// Stored before, and its record since forgotten: what came
			// before this store is unknown, but it was gone just before.
			r.dropped = true
		}
		if r.n > 0 && r.hist[r.n-1].what() == tLost {
			// The engine stores only what it does not hold: a lost batch
			// removed it.
			r.hist[r.n-1] = newTransition(time.Unix(0, r.hist[r.n-1].at()), tRemoved)
		}
		wasAlive := r.alive()
		if !wasAlive {
			if len(s.aliveKeys) >= s.maxAlive {
				a.TooMany += len(ev.Hashes) - i
				return
			}
			r.slot = uint32(len(s.aliveKeys))
			s.aliveKeys = append(s.aliveKeys, k)
		}
		r.add(t)
		s.blocks[k] = r
		s.seen.add(k)
		id := hashID(ev.Group, h)
		delete(s.stale, id)
		if _, ok := s.hashes[id]; !ok && len(s.hashes)+len(s.stale) >= s.maxHashIDs {
			// Room goes first to the blocks seen since the last gap.
			s.stale = nil
			if len(s.hashes) >= s.maxHashIDs {
				// Held under other hashes already: the same tokens stored
				// again under new ones, more than blocks can be held.
				a.TooMany++
				continue
			}
		}
		s.hashes[id] = k
	}
}

// removeLocked marks block k removed by t.
func (s *Stream) removeLocked(k chainKey, t transition) {
	r, ok := s.blocks[k]
	if !ok {
		return
	}
	if !r.alive() {
		if r.n > 0 && r.hist[r.n-1].what() == tLost {
			// Held through the gap after all, until now.
			r.hist[r.n-1] = t
			s.blocks[k] = r
			s.queueRemovedLocked(k, t)
		}
		return
	}
	// Its place in the list of held blocks goes to the last of them.
	last := len(s.aliveKeys) - 1
	if moved := s.aliveKeys[last]; moved != k {
		m := s.blocks[moved]
		m.slot = r.slot
		s.blocks[moved] = m
		s.aliveKeys[r.slot] = moved
	}
	s.aliveKeys = s.aliveKeys[:last]
	s.letGoLocked(k, r, t)
}

// letGoLocked records t, a removal, a clear or a loss of sight, of the
// held block k, whose record is r, and queues it with the removed blocks.
func (s *Stream) letGoLocked(k chainKey, r record, t transition) {
	r.add(t)
	s.blocks[k] = r
	s.queueRemovedLocked(k, t)
}

// queueRemovedLocked queues block k, let go by t, with the removed blocks.
func (s *Stream) queueRemovedLocked(k chainKey, t transition) {
	if len(s.removed) < s.maxRemoved {
		s.removed = append(s.removed, removedKey{k, t})
		return
	}
	// The queue is full: its oldest entry goes, and the block with it
	// unless it was stored (or removed) again since.
	old := s.removed[s.head]
	if r, ok := s.blocks[old.key]; ok && r.hist[r.n-1] == old.at {
		delete(s.blocks, old.key)
	}
	s.removed[s.head] = removedKey{k, t}
	s.head = (s.head + 1) % s.maxRemoved
}

// clearLocked removes every block at at: the cache was emptied. It costs
// the blocks held, not those remembered: a second clear with nothing
// stored since costs nothing.
func (s *Stream) clearLocked(at time.Time) {
	t := newTransition(at, tCleared)
	for _, k := range s.aliveKeys {
		s.letGoLocked(k, s.blocks[k], t)
	}
	s.aliveKeys = s.aliveKeys[:0]
	if len(s.hashes) > 0 {
		// A new map rather than clear(), whose cost is the map's
		// capacity, however few it holds now.
		s.hashes = map[uint64]chainKey{}
	}
	s.stale = nil
}

// loseSightLocked lets go, at at, of every block held: batches were lost,
// and any of them may have removed it. Their hashes are kept, stale, to
// link the children a later batch stores and to take a removal; a block
// stored or removed again is known once more. It costs the blocks held
// and the hashes indexed since the last loss.
func (s *Stream) loseSightLocked(at time.Time) {
	t := newTransition(at, tLost)
	for _, k := range s.aliveKeys {
		s.letGoLocked(k, s.blocks[k], t)
	}
	s.aliveKeys = s.aliveKeys[:0]
	if len(s.hashes) == 0 {
		return
	}
	if len(s.stale) == 0 {
		s.stale = s.hashes
	} else {
		for id, k := range s.hashes {
			s.stale[id] = k
		}
	}
	s.hashes = map[uint64]chainKey{}
}

// Following tells whether the stream has seen every batch since t.
func (s *Stream) Following(t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.since.IsZero() && !s.since.After(t)
}

// keyedByExtraKeys tells whether the stream's blocks are keyed by their
// extra keys too: its BlockStored events carry them (vLLM since
// extra_keys). Before, a salted block is keyed as the same tokens
// unsalted.
func (s *Stream) keyedByExtraKeys() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.extraKeys
}

// BlockSize is the block size of the stream's prefix group
// (PrefixGroup), 0 before it stored a block.
func (s *Stream) BlockSize() int {
	_, bs := s.PrefixGroup()
	return bs
}

// PrefixGroup is the KV cache group a request's blocks are looked up in,
// and its block size (0 before it stored a block): the lowest group whose
// blocks are a prompt's prefix (full attention, or a kind not sent), else
// group 0. Each group keeps the block size its own events tell.
func (s *Stream) PrefixGroup() (group, blockSize int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	group = -1
	for g, spec := range s.groups {
		if spec.holdsPrefixes() && (group < 0 || g < group) {
			group = g
		}
	}
	if group < 0 {
		group = 0
	}
	return group, s.groups[group].blockSize
}

// states returns the state of each block keyed by keys as of sent, a
// removal until until counting as an eviction: the request waited while
// it happened.
func (s *Stream) states(keys []chainKey, sent, until time.Time) []State {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]State, len(keys))
	for i, k := range keys {
		r, ok := s.blocks[k]
		switch {
		case ok:
			out[i] = stateOf(r, sent.UnixNano(), until.UnixNano())
		case s.seen.has(k):
			out[i] = Evicted // removed so long ago that its record went
		default:
			out[i] = Unseen
		}
	}
	return out
}

// stateOf reads a block's history: its last transition at or before sent,
// and whether it was removed after sent and by until.
func stateOf(r record, sent, until int64) State {
	last := -1
	for i := range int(r.n) {
		if r.hist[i].at() <= sent {
			last = i
		}
	}
	if last < 0 && r.dropped {
		// A block that came and went often since the send: the state
		// before its oldest transition kept is taken for the send's.
		// Before a store it was gone; before a removal, held.
		if r.hist[0].what() == tStored {
			return Evicted
		}
		last = -1
	} else if last < 0 {
		return Unseen // or stored only after the request was sent
	}
	if last < 0 {
		return removedBy(r.hist[0], until, Alive)
	}
	switch r.hist[last].what() {
	case tRemoved:
		return Evicted
	case tCleared:
		return Cleared
	case tLost:
		return Lost
	}
	for i := last + 1; i < int(r.n); i++ {
		if st := removedBy(r.hist[i], until, Alive); st != Alive {
			return st
		}
	}
	return Alive
}

// removedBy is the state a transition t made of a held block, if it came
// by until: else held is kept.
func removedBy(t transition, until int64, held State) State {
	if t.at() > until {
		return held
	}
	switch t.what() {
	case tRemoved:
		return Evicted
	case tCleared:
		return Cleared
	case tLost:
		return Lost
	}
	return held
}
