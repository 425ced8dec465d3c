package replay

import "github.com/kvload-exporter/kvload-exporter/idealcache"

// WarmUpWorld is idealcache.WarmUpWorld: what the server holds of the rows
// a model only assumed sent (idealcache.WarmUp tells how it is decided).
type WarmUpWorld = idealcache.WarmUpWorld

// Warm-up worlds, as idealcache names them.
const (
	WarmUpUndecided = idealcache.WarmUpUndecided
	WarmUpWarm      = idealcache.WarmUpWarm
	WarmUpCold      = idealcache.WarmUpCold
	WarmUpPartial   = idealcache.WarmUpPartial
)

// WarmUpDecision is idealcache.WarmUpDecision: a change of what a model
// holds of its warm-up, and the evidence it rests on.
type WarmUpDecision = idealcache.WarmUpDecision

// LearnWarmUp makes the model decide, from the cached tokens of the
// answers given to AcceptObserved, whether the rows it only assumed sent
// reached the server; onChange, when set, hears each change of the
// decision (normally one), from the goroutine that asked, without the
// model's lock. Only with loop repeat: there every pass resends the same
// prompts, so a model that starts mid-run assumes the whole pass before,
// and nearly every hit of the pass it starts in rests on it. With loop
// fresh only the current pass's rows before the start are assumed (about
// 5 % of a pass's tokens on the conversation trace), and they stay
// unknown; loop once assumes nothing. Call it before the first request.
func (m *CacheModel) LearnWarmUp(onChange func(WarmUpDecision)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.warm.Learn = m.loop == LoopRepeat
	m.onWarmUp = onChange
}

// StartEmpty tells the model that the server holds nothing the fleet sent
// before its start, as is known when every request carries a cache salt
// that no earlier request carried: it skips the warm-up, so that no
// answer rests on rows only assumed sent, and every one is known from the
// first request, for every loop mode. Call it before the first request.
func (m *CacheModel) StartEmpty() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur = m.start
}

// WarmUpWorld is what the model holds of its warm-up now.
func (m *CacheModel) WarmUpWorld() WarmUpWorld {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.warm.World()
}
