package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// reloadDebounce is how long the config directory must be quiet before a
// change is applied: editors and ConfigMap updates write several times.
const reloadDebounce = 500 * time.Millisecond

// ErrShuttingDown answers a reload asked for once the shutdown has begun:
// nothing is applied.
var ErrShuttingDown = errors.New("shutting down")

// Options configure a Daemon.
type Options struct {
	Logger     log.Logger // nil: no log
	ConfigFile string
	// DrainTimeout bounds how long requests in flight may finish when a
	// unit stops (reload or shutdown).
	DrainTimeout time.Duration
	Collector    *collector.Collector
	// Shard, when set (--shard), replaces every workload's own shard.
	Shard *config.Shard
	// Watch reloads when the configuration file changes.
	Watch bool
	// MemoryLimit refuses, at every reload as at the start, a
	// configuration whose memory estimate at its bounds exceeds it, in
	// bytes (--memory.limit); 0 is none.
	MemoryLimit int64

	beforeApply func(ctx context.Context)  // tests only
	buildStep   func(*config.Config) error // tests only: a build that fails
	discovery   discoverySchedule          // tests only: the zero value is the default
	// dispatchClock paces the replay (tests only): nil is the system clock.
	dispatchClock replay.DispatchClock
	// watchTimer measures the quiet a file change waits for (tests
	// only): nil is the runtime's timer.
	watchTimer replay.DispatchTimer
	// ResultObserved, when set, hears each result after every other side
	// job has: the profile command's summary reads every request, and a
	// test then knows what the daemon has learnt.
	ResultObserved func(*replay.Result)
	// ReplayFinished, when set, is called once a unit of a loop: once
	// workload has sent its single pass and every answer is in (not when
	// a reload or the shutdown stops it).
	ReplayFinished func(workload, target string)
}

// reloadRequest is a reload waiting for the owner goroutine.
type reloadRequest struct {
	force bool
	reply chan error // buffered: the owner never waits for the asker
}

// Start applies the configuration file and starts the owner goroutine,
// which applies reloads until ctx is done and then drains: not ready, no
// more dispatch, requests in flight finish within the drain timeout, then
// the scrapers and emulated engines stop. Done is closed when all is over.
// An error means nothing runs (and Done is closed); it wraps
// ErrShuttingDown when ctx ended during the first load.
func (d *Daemon) Start(ctx context.Context) error {
	// Units outlive ctx: their requests in flight finish during the drain.
	unitCtx, cancelUnits := context.WithCancel(context.WithoutCancel(ctx))

	// Watching starts before the first load, so that an edit made during
	// it is not lost.
	var fileChanged chan struct{}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	if d.watch {
		w, err := config.NewWatcher(d.configFile)
		if err != nil {
			level.Warn(d.logger).Log("msg", "configuration file changes will not be seen; SIGHUP and /-/reload still work", "err", err)
			close(watchDone)
		} else {
			fileChanged = make(chan struct{}, 1)
			go func() {
				defer close(watchDone)
				notify := func() {
					select {
					case fileChanged <- struct{}{}:
					default: // a reload is already pending
					}
				}
				w.Run(watchCtx, reloadDebounce, d.watchTimer, notify)
			}()
		}
	} else {
		close(watchDone)
	}

	// Missed hits are classified until the shutdown (which stops it).
	if d.explainer != nil {
		ectx, stop := context.WithCancel(context.WithoutCancel(ctx))
		d.explainStop, d.explainDone = stop, make(chan struct{})
		go func() {
			defer close(d.explainDone)
			d.explainer.Run(ectx)
		}()
	}

	// The shutdown halts dispatch the moment ctx ends, even while the
	// owner goroutine is still loading or reloading a configuration.
	go func() {
		select {
		case <-ctx.Done():
			d.halt()
		case <-d.done:
		}
	}()

	if err := d.reload(ctx, unitCtx, true); err != nil {
		stopWatch()
		<-watchDone
		d.shutdown()
		cancelUnits()
		close(d.done)
		return err
	}
	// A shutdown begun just now stays not ready.
	d.units.unlessHalted(func() { d.ready.Store(true) })
	go func() {
		defer close(d.done)
		defer cancelUnits()
		d.own(ctx, unitCtx, fileChanged)
		stopWatch()
		<-watchDone
	}()
	return nil
}

// own is the owner goroutine's loop: every change to the running set is
// made here, in the order asked.
func (d *Daemon) own(ctx, unitCtx context.Context, fileChanged <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			d.shutdown()
			return
		case <-fileChanged:
			// The watcher has no caller to tell: reload logs and counts
			// a rejected file itself.
			_ = d.reload(ctx, unitCtx, false)
		case req := <-d.reqs:
			req.reply <- d.reload(ctx, unitCtx, req.force)
		case r := <-d.layouts.readings:
			d.layouts.take(r)
		}
	}
}

// Reload asks the owner goroutine to read and apply the configuration file
// and waits for the outcome. After the shutdown began it returns
// ErrShuttingDown and changes nothing.
func (d *Daemon) Reload(ctx context.Context) error { return d.request(ctx, true) }

// request is a reload; force false skips a file whose bytes are known.
func (d *Daemon) request(ctx context.Context, force bool) error {
	select {
	case <-d.stopping:
		return ErrShuttingDown
	default:
	}
	req := reloadRequest{force: force, reply: make(chan error, 1)}
	select {
	case d.reqs <- req:
	case <-d.stopping:
		return ErrShuttingDown
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ready tells whether the configuration is applied and no shutdown began.
func (d *Daemon) Ready() bool { return d.ready.Load() }

// Done is closed once the daemon has drained and stopped everything.
func (d *Daemon) Done() <-chan struct{} { return d.done }
