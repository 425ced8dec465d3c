package lifecycle

import (
	"sync"
	"time"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// gatedObserver forwards to the cache-truth step in front of the collector,
// then hands each result down its chain of side jobs, until closed. A unit
// that a reload changed or removed has its series deleted at once; the
// requests it still has in flight finish, but must not recreate those
// series. close waits for a call under way, so that none lands after the
// series are deleted.
type gatedObserver struct {
	obs    replay.Observer  // the cache-truth step
	chain  []resultObserver // after it, in order
	mu     sync.RWMutex
	closed bool
}

// resultObserver is a side job run on each finished request after the
// cache-truth step, which has filled its Counted.
type resultObserver interface {
	observe(r *replay.Result)
}

var (
	_ resultObserver = missedHits{}
	_ resultObserver = (*layoutWatch)(nil)
	_ resultObserver = (*templateOverhead)(nil)
	_ resultObserver = (*failureLog)(nil)
)

// missedHits offers a unit's results to its target's missed-hit
// classification, under the unit's cache salt ("" for none).
type missedHits struct {
	offer *missOffer
	salt  string
}

func (m missedHits) observe(r *replay.Result) { m.offer.offer(r, m.salt) }

// resultHook is a function as a side job.
type resultHook func(*replay.Result)

func (h resultHook) observe(r *replay.Result) { h(r) }

func (g *gatedObserver) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// open takes the gate for one call; done releases it.
func (g *gatedObserver) open() bool {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return false
	}
	return true
}

func (g *gatedObserver) done() { g.mu.RUnlock() }

func (g *gatedObserver) Sent(w, t string, scheduled, sent time.Time) {
	if g.open() {
		defer g.done()
		g.obs.Sent(w, t, scheduled, sent)
	}
}

func (g *gatedObserver) Finished(r *replay.Result) {
	if g.open() {
		defer g.done()
		g.obs.Finished(r)
		for _, o := range g.chain {
			o.observe(r)
		}
	}
}

// targetAnswered tells whether a request's outcome says that its target
// answered it, successfully or not.
func targetAnswered(o openai.Outcome) bool {
	switch o {
	case openai.OutcomeSuccess, openai.OutcomeHTTPError, openai.OutcomeStreamError:
		return true
	}
	return false
}

func (g *gatedObserver) Dropped(w, t string, reason replay.DropReason, scheduled time.Time) {
	if g.open() {
		defer g.done()
		g.obs.Dropped(w, t, reason, scheduled)
	}
}

func (g *gatedObserver) PassCompleted(w, t string, pass int) {
	if g.open() {
		defer g.done()
		g.obs.PassCompleted(w, t, pass)
	}
}
