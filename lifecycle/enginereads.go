package lifecycle

import (
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
)

// engineReads is what one target's reads of its engine counters are for:
// the credit of observed: server_metrics, the comparison of
// cache.reconcile, or both.
type engineReads struct {
	credit    bool // observed: server_metrics
	reconcile bool // cache.reconcile resolved on
	// explicit: cache.reconcile is true, not auto: a page that does not
	// answer is worth a warning.
	explicit bool
}

// engineReadsOf says what t's engine counters are read for.
func engineReadsOf(t *config.Target) engineReads {
	return engineReads{
		credit:    t.Cache.Observed == engine.ObservedServerMetrics,
		reconcile: t.Reconciles(),
		explicit:  t.Cache.Reconcile == config.ReconcileOn,
	}
}

// wanted tells whether the counters are read at all.
func (r engineReads) wanted() bool { return r.credit || r.reconcile }

// engineReadSink hands each read of a target's engine counters to the
// cache-truth step (credit) and to the collector's comparison, as the
// target asks. Its scraper's goroutine is its only caller.
type engineReadSink struct {
	target string
	reads  engineReads
	credit engine.CountSink // the cache-truth step
	comp   comparison       // the collector
	logger log.Logger
	// failing: the last read failed (logged once, for a comparison alone).
	failing bool
}

// comparison is the collector's side of cache.reconcile.
type comparison interface {
	AddEngineRead(target string, d engine.ServerCounts)
	EngineReadFailed(target string, reason engine.ServerMetricsErrorReason)
}

var _ engine.CountSink = (*engineReadSink)(nil)

// AddServerCounts implements engine.CountSink.
func (s *engineReadSink) AddServerCounts(target string, d engine.ServerCounts) {
	if s.reads.credit {
		s.credit.AddServerCounts(target, d)
	}
	if s.reads.reconcile {
		s.comp.AddEngineRead(target, d)
	}
	if s.failing && !s.reads.credit {
		level.Info(s.logger).Log("msg", "cache reconciliation: the engine's counters read again", "target", s.target)
	}
	s.failing = false
}

// ServerMetricsError implements engine.CountSink.
func (s *engineReadSink) ServerMetricsError(target string, reason engine.ServerMetricsErrorReason) {
	if s.reads.credit {
		s.credit.ServerMetricsError(target, reason)
	}
	if s.reads.reconcile {
		s.comp.EngineReadFailed(target, reason)
	}
}

// failed logs a failed read. With observed: server_metrics every one is
// a warning, as the hits go uncounted. A comparison alone logs the first
// failure of a run of them, a warning where cache.reconcile is true and
// information where it is auto (an engine whose page is absent behind a
// router is no one's emergency), and the others at debug level.
func (s *engineReadSink) failed(err error) {
	switch {
	case s.reads.credit:
		level.Warn(s.logger).Log("msg", "server metrics scrape failed", "target", s.target, "err", err)
	case s.failing:
		level.Debug(s.logger).Log("msg", "cache reconciliation: the engine's counters not read", "target", s.target, "err", err)
	case s.reads.explicit:
		level.Warn(s.logger).Log("msg", "cache reconciliation: the engine's counters not read; the responses count as before, and the comparison waits for a good read", "target", s.target, "err", err)
	default:
		level.Info(s.logger).Log("msg", "cache reconciliation: the engine's counters not read; the responses count as before (cache.reconcile: false turns the reads off)", "target", s.target, "err", err)
	}
	s.failing = true
}
