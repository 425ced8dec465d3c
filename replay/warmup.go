package replay

// A model started mid-run warms up on the rows of the fleet's schedule
// before its start, assumed sent. Whether they really reached the server
// is a fact about the server, not the schedule: an exporter restarted next
// to an engine that kept running finds them there, one started next to a
// fresh engine does not. Until that is known, a request whose modelled hit
// rests on an assumed block is unknown, and with loop repeat on a large
// cache that is nearly every request of the pass the model starts in.
//
// The server's own answers tell the two apart. For such a request the
// model has two theoretical values: warm (the assumed blocks are there)
// and cold (only blocks really sent since the start count). Where they
// differ by enough, the cached tokens the server reported sit near one of
// them. Enough such requests with a clear majority by tokens decide for
// the whole model: warm counts every assumed block as sent, cold leaves
// them all out, and later answers are known; so are those of requests
// simulated before the decision, which kept both values.
//
// The blocks keep their mark after the decision, so that later answers go
// on weighing it: a server that holds only part of what was assumed (the
// exporter before this one dropped rows, or ran for part of a pass) gives
// mixed answers, and the decision is taken back when they leave no clear
// majority. While the mark stands, the cache answers exactly as one whose
// assumed blocks were made certain (warm) or taken out (cold): blocks
// only assumed are touched by no real row, so they sit behind every other
// block in LRU order and a bounded cache evicts them first.

const (
	// warmUpMinGap: a request is evidence only where its warm and cold
	// values differ by at least this many tokens. The server's answer
	// is compared with bands of a quarter of the gap, which then hold
	// the few tokens every prompt shares on some engines (llama.cpp's
	// BOS and chat header: the preamble, at most 64 tokens, see package
	// servedcache) and the block rounding of a chat template's header.
	warmUpMinGap = 256
	// warmUpMinRequests: requests that pointed one way or the other
	// before anything is decided.
	warmUpMinRequests = 8
	// warmUpMajority: the least share, of the tokens at stake (warm
	// minus cold) in every request that pointed somewhere, of those
	// pointing to the world decided.
	warmUpMajority = 0.9
)

// WarmUpWorld is what the server holds of the rows a model only assumed
// sent.
type WarmUpWorld int

// Warm-up worlds.
const (
	// WarmUpUndecided: not known (yet, or the answers are mixed); hits
	// resting on those rows are unknown.
	WarmUpUndecided WarmUpWorld = iota
	// WarmUpWarm: the rows reached the server (another exporter, or this
	// one before a restart, sent them): they count as sent.
	WarmUpWarm
	// WarmUpCold: they did not (a fresh or restarted engine): only what
	// was really sent since the start counts.
	WarmUpCold
)

func (w WarmUpWorld) String() string {
	switch w {
	case WarmUpWarm:
		return "warm"
	case WarmUpCold:
		return "cold"
	}
	return "undecided"
}

// WarmUpDecision is a change of what a model holds of its warm-up, and the
// evidence it rests on.
type WarmUpDecision struct {
	World WarmUpWorld
	// Warm and Cold are how many answers pointed to each world,
	// WarmShare the warm ones' share of the tokens at stake.
	Warm, Cold int
	WarmShare  float64
	// Abstained is how many answers were evidence but sat between the
	// two values, near neither.
	Abstained int
}

// warmUp is a model's evidence of what the server holds of its warm-up.
type warmUp struct {
	learn    bool
	onChange func(WarmUpDecision)
	world    WarmUpWorld

	warm, cold             int // requests pointing to each world
	warmTokens, coldTokens int // the tokens at stake in them
	abstained              int
}

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
	m.warm.learn = m.loop == LoopRepeat
	m.warm.onChange = onChange
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
	return m.warm.world
}

// answer is the theoretical cached tokens of a simulated request, and
// whether they are known.
func (w *warmUp) answer(a admitted) (int, bool) {
	switch {
	case a.tokens == a.cold, w.world == WarmUpWarm:
		return a.tokens, true
	case w.world == WarmUpCold:
		return a.cold, true
	}
	return a.tokens, false
}

// weigh takes the server's cached tokens for a, a simulated request, as
// evidence, and returns the decision when this answer changed it.
func (w *warmUp) weigh(a admitted, cached int) *WarmUpDecision {
	gap := a.tokens - a.cold
	if !w.learn || gap < warmUpMinGap {
		return nil
	}
	switch above := cached - a.cold; {
	case above <= gap/4:
		w.cold++
		w.coldTokens += gap
	case above >= gap-gap/4:
		w.warm++
		w.warmTokens += gap
	default:
		w.abstained++
		return nil
	}
	world := w.decide()
	if world == w.world {
		return nil
	}
	w.world = world
	return &WarmUpDecision{World: world, Warm: w.warm, Cold: w.cold,
		WarmShare: float64(w.warmTokens) / float64(w.warmTokens+w.coldTokens), Abstained: w.abstained}
}

// decide is the world the evidence so far points to.
func (w *warmUp) decide() WarmUpWorld {
	total := float64(w.warmTokens + w.coldTokens)
	switch {
	case w.warm+w.cold < warmUpMinRequests:
		return WarmUpUndecided
	case float64(w.warmTokens) >= warmUpMajority*total:
		return WarmUpWarm
	case float64(w.coldTokens) >= warmUpMajority*total:
		return WarmUpCold
	}
	return WarmUpUndecided
}
