package lifecycle

import (
	"context"
	"sync"
	"time"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/rowrequest"
	"github.com/kvload-exporter/kvload-exporter/servedcache"
	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// part reconciles one kind of the daemon's resources (units, emulated
// engines, layout watches, KV event streams, scrapers) with each
// configuration the daemon applies. The owner goroutine alone calls it.
type part interface {
	// apply stops what next no longer wants, or wants otherwise, and
	// starts what it wants and lacks, to run under unitCtx. ctx is the
	// shutdown's: once it is done nothing more starts and its error is
	// returned.
	apply(ctx, unitCtx context.Context, next *nextConfig) error
	// stop stops what next no longer wants, everything when next is nil
	// (the shutdown), and returns once it has ended. It cancels before it
	// waits, and holds no lock the landing page or a request takes.
	stop(next *nextConfig)
}

var (
	_ part = (*emulatorSet)(nil)
	_ part = (*layoutSet)(nil)
	_ part = (*kvSet)(nil)
	_ part = (*scraperSet)(nil)
	_ part = (*unitSet)(nil)
)

// common is what the daemon and its parts share: where they log and
// count, and the wait group of every goroutine they start.
type common struct {
	logger log.Logger
	coll   *collector.Collector
	// truth decides how results and server counts count, in front of coll.
	truth        *servedcache.Truth
	drainTimeout time.Duration
	// tracer is the running configuration's tracing, which every client
	// reads at each request and a reload replaces (tracing.go).
	tracer *tracing.Current
	wg     sync.WaitGroup // every unit, emulator, watch and scraper goroutine, and drains
}

// nextConfig is a configuration built and not yet applied: everything a
// start allocates from the configuration alone is in it, sized and
// checked, so that a configuration that cannot be built is refused before
// anything running is touched.
type nextConfig struct {
	data      []byte // the file
	cfg       *config.Config
	workloads map[string]*workloadData // by workload name
	traces    *traceCache
	// engines are the emulated engines of targets that have none running,
	// or one of another configuration, built and not serving yet.
	engines map[string]*emulate.Engine
	// builders are the request builders of the units to start.
	builders map[unitKey]*rowrequest.Builder
	// tracer is next's tracing where it differs from the running one's,
	// built last; nil keeps the running one.
	tracer *tracing.Tracer
}

// target is cfg's target name, nil when there is no cfg or it has none.
func (n *nextConfig) target(name string) *config.Target {
	if n == nil {
		return nil
	}
	t, _ := n.cfg.Target(name)
	return t
}
