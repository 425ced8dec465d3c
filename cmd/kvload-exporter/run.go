package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// reloadDebounce is how long the config directory must be quiet before a
// change is applied: editors and ConfigMap updates write several times.
const reloadDebounce = 500 * time.Millisecond

type runFlags struct {
	configFile    string
	configCheck   bool
	telemetryPath string
	drainTimeout  time.Duration
	shard         string
	shardCount    int
	log           logFlags
	web           *web.FlagConfig
}

// runCommand is the daemon, also run when no command is given.
func runCommand(app *kingpin.Application) command {
	f := &runFlags{}
	cl := app.Command("run", "Replay the configured workloads and serve their metrics (the default command).").Default()
	cl.Flag("config.file", "Configuration file.").Default("kvload.yml").StringVar(&f.configFile)
	cl.Flag("config.check", "Check the configuration file and the traces it names, print every problem, and exit (0 if fine, 1 if not).").BoolVar(&f.configCheck)
	cl.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&f.telemetryPath)
	cl.Flag("shutdown.drain-timeout", "On shutdown or when a reload removes a workload, how long requests in flight may take to finish.").Default("30s").DurationVar(&f.drainTimeout)
	cl.Flag("shard", "Replay only this replica's share of every workload, overriding the workloads' shard: INDEX/COUNT (such as 0/3), or auto to take INDEX from the hostname's trailing ordinal (a StatefulSet pod kvload-2 is 2) with --shard.count.").PlaceHolder("INDEX/COUNT").StringVar(&f.shard)
	cl.Flag("shard.count", "With --shard=auto: the number of replicas sharing the workloads.").IntVar(&f.shardCount)
	cl.Flag("log.level", "Only log messages with the given severity or above: debug, info, warn, error.").Default("info").EnumVar(&f.log.level, "debug", "info", "warn", "error")
	cl.Flag("log.format", "Output format of log messages: logfmt, json.").Default("logfmt").EnumVar(&f.log.format, "logfmt", "json")
	f.web = kingpinflag.AddFlags(cl, ":9812")
	return command{clause: cl, run: func(ctx context.Context, s streams) error { return runDaemon(ctx, f, s) }}
}

// reloadRequest is a POST /-/reload waiting for the reload goroutine.
type reloadRequest struct{ reply chan error }

func runDaemon(ctx context.Context, f *runFlags, s streams) error {
	logger, minLevel, err := newLogger(f.log, s.stderr)
	if err != nil {
		return badInput(err)
	}
	if f.configCheck {
		return checkConfig(f.configFile, s)
	}
	hostname, _ := os.Hostname()
	shard, err := parseShardFlag(f.shard, f.shardCount, hostname)
	if err != nil {
		return badInput(err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector("kvload_exporter"),
	)
	coll := collector.New(reg)

	// The daemon's own context outlives the signal: requests in flight must
	// be able to finish during the drain.
	daemonCtx, stopDaemon := context.WithCancel(context.Background())
	defer stopDaemon()
	d := newDaemon(daemonCtx, logger, f.configFile, f.drainTimeout, coll)
	d.shard = shard
	if shard != nil {
		level.Info(logger).Log("msg", "every workload replays one shard", "shard", fmt.Sprintf("%d/%d", shard.Index, shard.Count))
	}
	level.Info(logger).Log("msg", "starting kvload-exporter", "config", f.configFile)
	if err := d.reload(true); err != nil {
		d.shutdown()
		return badInput(err)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	loopCtx, stopLoop := context.WithCancel(daemonCtx)
	defer stopLoop()

	fileChanged := make(chan struct{}, 1)
	watcher, err := config.NewWatcher(f.configFile)
	if err != nil {
		level.Warn(logger).Log("msg", "configuration file changes will not be seen; SIGHUP and /-/reload still work", "err", err)
	} else {
		wg.Add(1)
		go func() {
			defer wg.Done()
			watcher.Run(loopCtx, reloadDebounce, func() {
				select {
				case fileChanged <- struct{}{}:
				default: // a reload is already pending
				}
			})
		}()
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	httpReload := make(chan reloadRequest)

	// The one goroutine that reloads: file changes, SIGHUP and POST
	// /-/reload are applied one after another, never concurrently.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-loopCtx.Done():
				return
			case <-fileChanged:
				d.reload(false)
			case <-hup:
				level.Info(logger).Log("msg", "SIGHUP: reloading")
				d.reload(true)
			case req := <-httpReload:
				req.reply <- d.reload(true)
			}
		}
	}()

	mux := newMux(webDeps{
		gatherer:      reg,
		telemetryPath: f.telemetryPath,
		ready:         d.ready.Load,
		reload: func(rctx context.Context) error {
			req := reloadRequest{reply: make(chan error, 1)}
			select {
			case httpReload <- req:
			case <-loopCtx.Done():
				return errors.New("shutting down")
			case <-rctx.Done():
				return rctx.Err()
			}
			return <-req.reply
		},
		landing: d.landing,
	})
	webLogger := newSlogBridge(logger, minLevel)
	server := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 30 * time.Second,
		// The server's own errors (failed TLS handshakes, plain HTTP on a
		// TLS port) belong in the daemon's log, in its format, rather than
		// on the standard logger.
		ErrorLog: slog.NewLogLogger(webLogger.Handler(), slog.LevelError),
	}
	webErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		webErr <- web.ListenAndServe(server, f.web, webLogger)
	}()
	d.ready.Store(true)

	select {
	case <-ctx.Done():
		level.Info(logger).Log("msg", "shutting down: draining requests in flight", "timeout", f.drainTimeout)
	case err := <-webErr:
		stopLoop()
		d.shutdown()
		return fmt.Errorf("web server: %w", err)
	}

	// A second signal ends the process at once.
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-again:
			level.Warn(logger).Log("msg", "second signal: exiting without draining")
			os.Exit(exitFailure)
		case <-daemonCtx.Done():
		}
	}()

	stopLoop()
	d.shutdown() // not ready, stop dispatch, drain; the metrics stay up meanwhile
	logDrained(logger, reg)
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := server.Shutdown(shutCtx); err != nil {
		level.Warn(logger).Log("msg", "web server shutdown", "err", err)
	}
	stopDaemon()
	level.Info(logger).Log("msg", "stopped")
	return nil
}

// logDrained logs the request totals once the drain is over: requests that
// finished (or were cut) at its very end are counted after the last scrape
// Prometheus could take, and the log is the only place that shows them.
func logDrained(logger log.Logger, g prometheus.Gatherer) {
	mfs, err := g.Gather()
	if err != nil {
		level.Warn(logger).Log("msg", "drained; gathering the final request totals failed", "err", err)
	}
	byOutcome := map[string]float64{}
	var inFlight float64
	for _, mf := range mfs {
		switch mf.GetName() {
		case "kvload_requests_total":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" {
						byOutcome[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
		case "kvload_requests_in_flight":
			for _, m := range mf.GetMetric() {
				inFlight += m.GetGauge().GetValue()
			}
		}
	}
	kv := []any{"msg", "drained"}
	for _, o := range replay.Outcomes {
		kv = append(kv, "requests_"+string(o), byOutcome[string(o)])
	}
	kv = append(kv, "requests_in_flight", inFlight)
	level.Info(logger).Log(kv...)
}

// checkConfig is --config.check: every problem of the file and of the traces
// it names, then exit 0 or 1.
func checkConfig(path string, s streams) error {
	data, err := os.ReadFile(path)
	if err == nil {
		_, _, err = loadConfig(path, data)
	}
	if err != nil {
		fmt.Fprintln(s.stdout, err)
		return withExitCode(errors.New("configuration check failed"), exitFailure)
	}
	fmt.Fprintf(s.stdout, "%s: configuration is valid\n", path)
	return nil
}
