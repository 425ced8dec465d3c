package replay

import (
	"sync"
	"sync/atomic"

	"github.com/kvload-exporter/kvload-exporter/idealcache"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// CacheParams describe the server cache an ideal model stands for.
type CacheParams = idealcache.Params

// Params is the cache the model stands for, as it uses it (block sizes of
// at least 1). They never change: a cache of another size is another
// model (Workload.SetCache).
func (m *CacheModel) Params() CacheParams { return m.cache.Params() }

// CacheModel is the ideal prefix cache of one (workload, target): the
// prompt tokens the server could have served from cache for each request,
// had it kept every block the whole fleet sent it (CapacityBlocks 0), or
// the most recently used CapacityBlocks blocks.
//
// It is a function of the schedule, not of this process's history: it walks
// the fleet's rows of every pass in order (FleetSchedule), all shards
// included, starting one pass before this replica's first row, so a replica
// started or restarted mid-run holds what a replica that never stopped
// would hold. What rests on those assumed rows is reported as unknown
// until the server's answers say whether they reached it
// (idealcache.WarmUp). The
// requests of this replica that the server never accepted (Reject) take
// their blocks back out, unless a later row used them since; other
// replicas' failures cannot be known and are not modelled.
//
// For one request, k is the number of its leading trace blocks in the
// cache; with engine.GranularityBlock the theoretical cached tokens are
// floor(min(k·TraceBlock, inputLength−1) / ServerBlock) · ServerBlock, with
// GranularityToken min(k·TraceBlock, inputLength−1): the rules of
// idealcache.Rounding, which the offline capacity curve shares.
type CacheModel struct {
	sched *FleetSchedule
	rows  *trace.Table
	loop  LoopMode

	mu    sync.Mutex
	cache *idealcache.Cache
	start modelPos                          // the first row this replica sends; rows before it are assumed sent
	cur   modelPos                          // next row of the fleet schedule to simulate
	ahead map[modelPos]idealcache.Admission // own rows simulated but not yet asked about
	ids   []int64                           // scratch for a row's hash ids
	keys  []uint64                          // scratch for their chain keys
	warm  idealcache.WarmUp                 // whether the rows assumed sent reached the server
	// onWarmUp hears each change of the warm-up's decision (LearnWarmUp).
	onWarmUp func(WarmUpDecision)

	profile *idealcache.Profile // the same visits, at every capacity

	closed atomic.Bool // see Close
}

// modelPos is a row of a pass by its place in the fleet schedule.
type modelPos struct{ pass, pos int }

func (a modelPos) before(b modelPos) bool {
	return a.pass < b.pass || (a.pass == b.pass && a.pos < b.pos)
}

// NewCacheModel returns a model of the cache params describe for the rows
// pacer schedules, in the fleet order of pacer's shard, starting where the
// pacer stands (seek it first): the rows of the fleet before that point,
// from the start of the pass before, are assumed sent (the warm-up).
func NewCacheModel(pacer *Pacer, params CacheParams) *CacheModel {
	m := &CacheModel{
		sched: pacer.FleetSchedule(),
		rows:  pacer.Rows(),
		loop:  pacer.Loop(),
		cache: idealcache.NewCache(params),
		ahead: map[modelPos]idealcache.Admission{},
	}
	m.profile = idealcache.NewProfile(m.cache)
	pass, row := pacer.FirstRow()
	m.start = modelPos{pass: pass, pos: int(m.sched.rank[row])}
	m.cur = modelPos{pass: pass}
	// Warm up on the pass before, as a replica that never stopped would
	// have. (With loop fresh the pass before has a namespace of its own,
	// which no row this replica sends can hit, but whose blocks crowd out
	// others in every cache of bounded size the profile follows.)
	if m.loop != LoopOnce && pass > 0 {
		m.cur.pass--
	}
	m.shortenWarmUp()
	return m
}

// shortenWarmUp starts the warm-up at the latest row that gives the same
// model. A bounded LRU cache always holds the most recently used blocks
// that fit, so once the blocks used since some row overflow the capacity,
// what came before that row cannot be in the cache at the start; the
// profile's stack likewise forgets what lies beyond its ceiling. On a trace
// of millions of rows this turns a warm-up of minutes of CPU, for every
// target, into one of a few thousand rows. An unbounded cache needs the
// whole warm-up, except with loop fresh the pass before, which only the
// profile needs, up to its ceiling. (The one thing it does not reproduce
// is a block's weight when the block was first seen in another position,
// as a partial last block, before that row: its weight is set when it
// enters the model.) idealcache.Lookback tells when the rows walked back
// fill the cache and the profile.
func (m *CacheModel) shortenWarmUp() {
	floor := m.cur // the earliest row an unbounded cache needs
	if m.loop == LoopFresh {
		floor = modelPos{pass: m.start.pass}
	}
	unbounded := m.cache.Params().CapacityBlocks == 0
	if !m.cur.before(m.start) || (unbounded && floor == m.cur) {
		return
	}
	lookback := idealcache.NewLookback(m.profile)
	for at := m.start; m.cur.before(at); {
		at.pos--
		if at.pos < 0 {
			at = modelPos{pass: at.pass - 1, pos: m.sched.Len() - 1}
		}
		row := int(m.sched.order[at.pos])
		m.ids, _ = m.rows.AppendHashIDs(m.ids[:0], row)
		m.keys = idealcache.AppendChainKeys(m.keys[:0], m.ids)
		lookback.Row(m.sched.ns(at.pass), m.keys, m.rows.ISL(row))
		cacheDone := lookback.CacheFull()
		if unbounded {
			cacheDone = !floor.before(at)
		}
		profileDone := lookback.ProfileFull()
		switch {
		case cacheDone && profileDone:
			m.cur = at
			return
		case profileDone && unbounded:
			m.cur = floor
			return
		}
	}
}

// Accept returns the theoretical cached tokens of it, a request of this
// replica that the server accepted (it streamed, or failed only later).
// known is false when the model cannot tell: the hit rests on a block that
// only the warm-up assumed sent and it is not yet decided whether those
// rows reached the server (a restart next to a warm engine and a cold
// start of both look the same until the server's answers tell them apart:
// see AcceptObserved), or the row is from a pass the model has already
// forgotten.
func (m *CacheModel) Accept(it PacerItem) (tokens int, known bool) {
	tokens, known, _ = m.accept(it, 0, false)
	return tokens, known
}

// AcceptObserved is Accept for a request whose response said how many of
// its prompt tokens the server served from its cache: with LearnWarmUp,
// that answer is evidence of whether the rows assumed sent reached the
// server.
func (m *CacheModel) AcceptObserved(it PacerItem, cached int) (tokens int, known bool) {
	tokens, known, _ = m.accept(it, cached, true)
	return tokens, known
}

// Reject records that the server never processed it (a connection error, an
// error status before any chunk, a row dropped or never built): its blocks do
// not warm the model.
func (m *CacheModel) Reject(it PacerItem) {
	if m.closed.Load() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.observe(it, false)
}

// Close makes the model give up: a simulation under way stops within a few
// rows, and every later question is answered unknown. The warm-up of a
// model of unbounded capacity on a big trace takes seconds, in the request
// goroutine that asks first: a stopping workload closes its model, so that
// the warm-up does not hold up its end.
func (m *CacheModel) Close() { m.closed.Store(true) }

// accept answers for it, which the server accepted; seen says whether the
// server reported cached, its cached tokens, to weigh as evidence. The
// profile is known only where the answer is and its own hits rest on no
// block that only rows assumed sent touched.
func (m *CacheModel) accept(it PacerItem, cached int, seen bool) (int, bool, CapacityProfile) {
	if m.closed.Load() {
		return 0, false, CapacityProfile{}
	}
	m.mu.Lock()
	a, ok := m.observe(it, true)
	if !ok {
		m.mu.Unlock()
		return 0, false, CapacityProfile{}
	}
	var changed *WarmUpDecision
	if seen {
		changed = m.warm.Weigh(a, cached)
	}
	tokens, known := m.warm.Answer(a)
	onChange := m.onWarmUp
	m.mu.Unlock()
	if changed != nil && onChange != nil {
		onChange(*changed)
	}
	profile := a.Profile
	profile.Known = profile.Known && known
	return tokens, known, profile
}

// observe simulates it, accepted or not, and returns what that did; ok is
// false when the model cannot say (a forgotten pass, a closed model).
// m.mu is held.
func (m *CacheModel) observe(it PacerItem, accepted bool) (a idealcache.Admission, ok bool) {
	target := modelPos{it.Pass, int(m.sched.rank[it.Index])}
	if target.before(m.cur) {
		a, ok := m.ahead[target]
		if !ok {
			return idealcache.Admission{}, false
		}
		delete(m.ahead, target)
		if !accepted {
			m.profile.Unadmit(a) // before the cache takes the blocks out
			m.cache.Unadmit(a)
		}
		return a, true
	}
	if !m.advance(target) {
		return idealcache.Admission{}, false
	}
	a = m.simulate(target, accepted)
	m.step()
	return a, true
}

// advance simulates every row of the fleet schedule before target, keeping
// what it did for this replica's rows, which are asked about later. It
// returns false when the model was closed on the way.
func (m *CacheModel) advance(target modelPos) bool {
	if target.pass > m.cur.pass+1 {
		// A long stall: the passes in between cannot matter more than
		// the one just before target.
		m.cur = modelPos{pass: target.pass - 1}
		clear(m.ahead)
	}
	for n := 0; m.cur.before(target); n++ {
		if n%1024 == 1023 && m.closed.Load() {
			return false
		}
		a := m.simulate(m.cur, true)
		// Rows before start are never asked about (the replay begins at
		// start): keeping them would hold a record for every row of the
		// warm-up, millions on a big trace.
		if !m.cur.before(m.start) && m.sched.owns(m.sched.order[m.cur.pos]) {
			m.ahead[m.cur] = a
		}
		m.step()
	}
	return true
}

// step moves the cursor on by one row; at a new pass it forgets what was
// kept of passes that no request can still ask about.
func (m *CacheModel) step() {
	m.cur.pos++
	if m.cur.pos < m.sched.Len() {
		return
	}
	m.cur = modelPos{pass: m.cur.pass + 1}
	for k := range m.ahead {
		if k.pass < m.cur.pass-1 {
			delete(m.ahead, k)
		}
	}
}

func (m *CacheModel) simulate(at modelPos, insert bool) idealcache.Admission {
	row := int(m.sched.order[at.pos])
	m.ids, _ = m.rows.AppendHashIDs(m.ids[:0], row)
	m.keys = idealcache.AppendChainKeys(m.keys[:0], m.ids)
	ns, isl, warm := m.sched.ns(at.pass), m.rows.ISL(row), at.before(m.start)
	// Only this replica's rows from its start are asked about.
	want := !warm && m.sched.owns(m.sched.order[at.pos])
	profile := m.profile.Visit(ns, m.keys, isl, insert, warm, want) // before the cache touches the blocks
	a := m.cache.Visit(ns, m.keys, isl, insert, warm)
	a.Profile = profile
	return a
}
