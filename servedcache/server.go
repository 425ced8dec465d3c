package servedcache

import (
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// serverShare is prompt tokens of successful requests: all of them, and
// those whose theoretical cached tokens are known (the only ones that count
// on the efficiency's sides).
type serverShare struct{ all, known float64 }

// serverRead is one read of an engine that counts its prompt tokens: its
// cached and prompt tokens since the read before, this replica's prompt
// tokens finished in that time, and the cached tokens credited to them.
type serverRead struct{ cached, prompt, mine, credited float64 }

// serverShareReads is the window over which a replica's share of an
// engine's prompt tokens is taken: 24 reads, 2 minutes at the scrape
// interval, long enough for the requests in flight at its edges to matter
// little.
const serverShareReads = 24

// credit is what one workload is credited of a read.
type credit struct {
	workload               string
	cached, reportedCached float64
}

// addPending adds a successful request of a server_metrics target to its
// workload's share of the next read; t.mu is held.
func (st *targetState) addPending(r *replay.Result) {
	prompt := float64(promptOf(r))
	sh := serverShare{all: prompt}
	if r.TheoreticalKnown {
		sh.known = prompt
	}
	if st.pending == nil {
		st.pending = map[string]serverShare{}
	}
	p := st.pending[r.Workload]
	st.pending[r.Workload] = serverShare{p.all + sh.all, p.known + sh.known}
}

// ServerMetricsError implements engine.CountSink: it forwards.
func (t *Truth) ServerMetricsError(target string, reason engine.ServerMetricsErrorReason) {
	t.next.ServerMetricsError(target, reason)
}

// AddServerCached is AddServerCounts for an engine that counts its cached
// tokens but not its prompt tokens.
func (t *Truth) AddServerCached(target string, delta float64) {
	t.AddServerCounts(target, engine.ServerCounts{Cached: delta})
}

// AddServerCounts implements engine.CountSink. It credits this replica's
// part of the increase of a target's own cached-token counter to the
// workloads that finished requests since the last call, in proportion to
// their prompt tokens.
//
// When the engine also counts its prompt tokens, this replica's part is
// its share of them over the last serverShareReads reads: over that
// window it is credited the engine's cached tokens times its prompt
// tokens over the engine's (at most all of them). The engine counts a
// prompt when it prefills it and this replica when the response ends, so
// the credit of one read can fall short, and the next reads make it up.
// Other replicas and other clients of the engine take the rest, assuming
// their prompts hit as often as this replica's in the window.
//
// Without such a counter the share cannot be known: every hit counted
// while this replica had requests in flight or finished is taken as its
// own (two replicas on one engine then each count the hits of both;
// docs/cache-model.md); hits while it had nothing in flight and finished
// nothing came from other traffic.
//
// Either way, when no request finished since the last read but some are
// still in flight, the hits are theirs: the shares of the last interval
// that had any take them. The efficiency's observed side
// (kvload_cache_reported_cached_prompt_tokens_total) takes only the part
// of requests whose theoretical cached tokens are known, as its other
// side does.
func (t *Truth) AddServerCounts(target string, d engine.ServerCounts) {
	for _, c := range t.credits(target, d) {
		t.next.AddServerCredit(c.workload, target, c.cached, c.reportedCached)
	}
}

// credits is what each workload is credited of the read d of target.
func (t *Truth) credits(target string, d engine.ServerCounts) []credit {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.targets[target]
	if st == nil {
		return nil
	}
	shares := st.pending
	st.pending = nil
	delta := d.Cached
	if d.PromptKnown {
		delta = st.windowed(shares, d)
	}
	switch {
	case len(shares) > 0:
		st.lastShares = shares
	case (st.inFlight > 0 || d.PromptKnown) && len(st.lastShares) > 0:
		shares = st.lastShares
	case st.inFlight > 0 || d.PromptKnown:
		// Nothing to credit yet: keep the hits for the first shares.
		st.carried += max(delta, 0)
		return nil
	}
	if len(shares) > 0 {
		delta += st.carried
		st.carried = 0
	}
	var total float64
	for _, p := range shares {
		total += p.all
	}
	if delta <= 0 || total == 0 {
		return nil
	}
	out := make([]credit, 0, len(shares))
	for w, p := range shares {
		c := credit{workload: w, cached: delta * p.all / total}
		if p.known > 0 {
			c.reportedCached = delta * p.known / total
		}
		out = append(out, c)
	}
	return out
}

// windowed adds the read d, with this replica's shares finished since the
// read before, to the window, and returns what is to be credited of it:
// this replica's share of the window's cached tokens, less what the window
// was credited already. An engine that began again (restarted) starts a
// new window: the hits of its past life were credited as far as they
// could be, and a share that grows after it must not earn more of them.
func (st *targetState) windowed(shares map[string]serverShare, d engine.ServerCounts) float64 {
	r := serverRead{cached: max(d.Cached, 0), prompt: max(d.Prompt, 0)}
	for _, p := range shares {
		r.mine += p.all
	}
	if d.Restarted || d.SeriesBegan {
		st.window = st.window[:0]
	}
	st.window = append(st.window, r)
	if n := len(st.window); n > serverShareReads {
		st.window = append(st.window[:0], st.window[n-serverShareReads:]...)
	}
	var w serverRead
	for _, r := range st.window {
		w.cached, w.prompt, w.mine, w.credited = w.cached+r.cached, w.prompt+r.prompt, w.mine+r.mine, w.credited+r.credited
	}
	want := 0.0
	switch {
	case w.prompt > 0:
		want = w.cached * min(w.mine/w.prompt, 1)
	case w.mine > 0:
		want = w.cached
	}
	delta := max(want-w.credited, 0)
	st.window[len(st.window)-1].credited = delta
	return delta
}
