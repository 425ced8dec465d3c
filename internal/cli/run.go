package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/alecthomas/kingpin/v2"
	"github.com/alecthomas/units"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/webshare"
	"github.com/kvload-exporter/kvload-exporter/lifecycle"
	"github.com/kvload-exporter/kvload-exporter/openai"
)

type runFlags struct {
	configFile    string
	configCheck   bool
	telemetryPath string
	drainTimeout  time.Duration
	shard         string
	shardCount    int
	memoryLimit   units.Base2Bytes // -1: the cgroup's limit, if any
	log           logFlags
	web           *web.FlagConfig
}

// runCommand is the daemon, also run when no command is given.
func runCommand(app *kingpin.Application) command {
	f := &runFlags{memoryLimit: -1}
	cl := app.Command("run", "Replay the configured workloads and serve their metrics (the default command).").Default()
	cl.Flag("config.file", "Configuration file.").Default("kvload.yml").StringVar(&f.configFile)
	cl.Flag("config.check", "Check the configuration file and the traces it names, print every problem, and exit (0 if fine, 2 if not, as a start with it would).").BoolVar(&f.configCheck)
	cl.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&f.telemetryPath)
	cl.Flag("shutdown.drain-timeout", "On shutdown or when a reload removes a workload, how long requests in flight may take to finish.").Default("30s").DurationVar(&f.drainTimeout)
	cl.Flag("shard", "Replay only this replica's share of every workload, overriding the workloads' shard: INDEX/COUNT (such as 0/3), or auto to take INDEX from the hostname's trailing ordinal (a StatefulSet pod kvload-2 is 2) with --shard.count.").PlaceHolder("INDEX/COUNT").StringVar(&f.shard)
	cl.Flag("shard.count", "With --shard=auto: the number of replicas sharing the workloads.").IntVar(&f.shardCount)
	cl.Flag("memory.limit", "Refuse a configuration whose memory estimate at its bounds (printed by --config.check) exceeds this many bytes, such as 512MiB; 0 is none. Default: the cgroup's memory limit, if any.").PlaceHolder("BYTES").BytesVar(&f.memoryLimit)
	cl.Flag("log.level", "Only log messages with the given severity or above: debug, info, warn, error.").Default("info").EnumVar(&f.log.level, "debug", "info", "warn", "error")
	cl.Flag("log.format", "Output format of log messages: logfmt, json.").Default("logfmt").EnumVar(&f.log.format, "logfmt", "json")
	f.web = kingpinflag.AddFlags(cl, ":9812")
	return command{clause: cl, run: func(ctx context.Context, s streams) error { return runDaemon(ctx, f, s) }}
}

// newRegistry is the daemon's registry: the Go and process collectors,
// build info, and the contract's metrics.
func newRegistry() (*prometheus.Registry, *collector.Collector) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector("kvload_exporter"),
	)
	return reg, collector.New(reg)
}

// shardOf is this replica's shard from --shard and --shard.count, nil
// when the workloads keep their own.
func shardOf(f *runFlags, logger log.Logger) (*config.Shard, error) {
	hostname, _ := os.Hostname()
	shard, err := parseShardFlag(f.shard, f.shardCount, hostname)
	if err == nil && shard != nil {
		level.Info(logger).Log("msg", "every workload replays one shard", "shard", fmt.Sprintf("%d/%d", shard.Index, shard.Count))
	}
	return shard, err
}

// prepareWeb checks the web configuration and opens the listen
// addresses.
func prepareWeb(flags *web.FlagConfig) ([]net.Listener, error) {
	if wc := flags.WebConfigFile; wc != nil && *wc != "" {
		if err := web.Validate(*wc); err != nil {
			return nil, fmt.Errorf("web configuration %s: %w", *wc, err)
		}
	}
	listeners, err := listen(flags)
	if err != nil {
		return nil, fmt.Errorf("web server: %w", err)
	}
	return listeners, nil
}

// daemonWebServer is the daemon's web server: metrics (one gathering at
// a time under a scrape storm), health, reload and the landing page. Its
// own errors (failed TLS handshakes, plain HTTP on a TLS port) go to the
// daemon's log, in its format, rather than to the standard logger.
func daemonWebServer(d *lifecycle.Daemon, reg *prometheus.Registry, coll *collector.Collector, telemetryPath string, logger *slog.Logger) *http.Server {
	mux := newMux(webDeps{
		gatherer:      webshare.Gatherer(reg),
		telemetryPath: telemetryPath,
		ready:         d.Ready,
		reload:        d.Reload,
		landing:       func() landingData { return landingOf(d.Status(), coll, reg) },
	})
	return newWebServer(mux, newConnLimiter(maxWebConns()), slog.NewLogLogger(logger.Handler(), slog.LevelError))
}

// serve runs the web server on listeners, or on those the toolkit opens
// itself (systemd sockets, vsock) when there are none, until it fails or
// is shut down.
func serve(server *http.Server, listeners []net.Listener, flags *web.FlagConfig, logger *slog.Logger) error {
	if listeners == nil {
		return web.ListenAndServe(server, flags, logger)
	}
	return web.ServeMultiple(listeners, server, flags, logger)
}

// exitOnSecondSignal ends the process without draining when a signal
// comes before the daemon is done.
func exitOnSecondSignal(again <-chan os.Signal, done <-chan struct{}, logger log.Logger) {
	select {
	case <-again:
		level.Warn(logger).Log("msg", "second signal: exiting without draining")
		os.Exit(exitFailure)
	case <-done:
	}
}

// reloadOnSIGHUP asks the daemon's owner goroutine for a reload at every
// SIGHUP, as the file watcher and POST /-/reload do, until the daemon
// ends.
func reloadOnSIGHUP(ctx context.Context, d *lifecycle.Daemon, hup <-chan os.Signal, logger log.Logger) {
	for {
		select {
		case <-d.Done():
			return
		case <-hup:
			level.Info(logger).Log("msg", "SIGHUP: reloading")
			if err := d.Reload(ctx); errors.Is(err, lifecycle.ErrShuttingDown) || errors.Is(err, context.Canceled) {
				level.Info(logger).Log("msg", "SIGHUP ignored: shutting down")
			}
		}
	}
}

func runDaemon(ctx context.Context, f *runFlags, s streams) error {
	logger, baseLogger, minLevel, err := newLogger(f.log, s.stderr)
	if err != nil {
		return badInput(err)
	}
	limit := memoryLimit(f.memoryLimit)
	if f.configCheck {
		return checkConfig(f.configFile, limit, s)
	}
	if err := checkMemory(f.configFile, limit, logger); err != nil {
		return err
	}
	shard, err := shardOf(f, logger)
	if err != nil {
		return badInput(err)
	}
	// SIGHUP is caught from here on: before, it would end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	reg, coll := newRegistry()

	// Everything that can fail at start fails before the first request
	// leaves: the web configuration, then the listen addresses.
	listeners, err := prepareWeb(f.web)
	if err != nil {
		return badInput(err)
	}
	defer func() {
		for _, l := range listeners {
			l.Close() // already closed by the server when it served
		}
	}()

	level.Info(logger).Log("msg", "starting kvload-exporter", "config", f.configFile)
	// runCtx ends the daemon: a signal, or the web server failing.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	d := lifecycle.New(lifecycle.Options{
		Logger:       logger,
		ConfigFile:   f.configFile,
		DrainTimeout: f.drainTimeout,
		Collector:    coll,
		Shard:        shard,
		Watch:        true,
		MemoryLimit:  limit,
	})

	var wg sync.WaitGroup
	defer wg.Wait()

	// The web server answers before the first configuration is applied,
	// which waits for the targets' reads: /-/healthy at once, /-/ready
	// once applied.
	webLogger := newSlogBridge(baseLogger, minLevel)
	server := daemonWebServer(d, reg, coll, f.telemetryPath, webLogger)
	webErr := make(chan error, 1)
	wg.Go(func() {
		webErr <- serve(server, listeners, f.web, webLogger)
		stopRun() // the web server failing ends the daemon
	})
	if err := d.Start(runCtx); err != nil {
		return startFailed(err, server, webErr, logger)
	}
	level.Info(logger).Log("msg", readyMessage)
	wg.Go(func() { reloadOnSIGHUP(runCtx, d, hup, logger) })

	var failed error
	select {
	case <-ctx.Done():
		level.Info(logger).Log("msg", "shutting down: draining requests in flight", "timeout", f.drainTimeout)
	case err := <-webErr:
		failed = fmt.Errorf("web server: %w", err)
	}
	stopRun() // the daemon drains; the metrics stay up meanwhile

	// A second signal ends the process at once.
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	wg.Go(func() { exitOnSecondSignal(again, d.Done(), logger) })

	<-d.Done()
	logDrained(logger, reg)
	if failed != nil {
		return failed
	}
	stopWeb(server, logger)
	level.Info(logger).Log("msg", "stopped")
	return nil
}

// readyMessage is logged once the first configuration is applied, when
// /-/ready starts answering 200.
const readyMessage = "ready: the first configuration is applied"

// ReadyMessage is readyMessage for the tests that wait for it in the log.
const ReadyMessage = readyMessage

// startFailed ends a start whose first configuration was not applied:
// the web server stops, and the error is the web server's failure, none
// for a shutdown asked for meanwhile, or the configuration's (bad input).
func startFailed(err error, server *http.Server, webErr <-chan error, logger log.Logger) error {
	var failed error
	select {
	case werr := <-webErr:
		failed = fmt.Errorf("web server: %w", werr)
	default:
		stopWeb(server, logger)
	}
	switch {
	case failed != nil:
		return failed
	case errors.Is(err, lifecycle.ErrShuttingDown):
		level.Info(logger).Log("msg", "stopped before the configuration was applied")
		return nil
	}
	return badInput(err)
}

// stopWeb shuts the web server down, letting answers under way finish for
// a few seconds.
func stopWeb(server *http.Server, logger log.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := server.Shutdown(ctx); err != nil {
		level.Warn(logger).Log("msg", "web server shutdown", "err", err)
	}
}

// listen binds every --web.listen-address. It returns no listener when the
// toolkit must listen itself: systemd socket activation, vsock addresses.
func listen(flags *web.FlagConfig) ([]net.Listener, error) {
	if flags.WebSystemdSocket != nil && *flags.WebSystemdSocket {
		return nil, nil
	}
	addrs := *flags.WebListenAddresses
	for _, a := range addrs {
		if strings.HasPrefix(a, "vsock://") {
			return nil, nil
		}
	}
	var ls []net.Listener
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			if errors.Is(err, syscall.EADDRINUSE) {
				err = fmt.Errorf("%w: another process listens on %s; give another address with --web.listen-address, such as --web.listen-address=:9813 (make run PORT=9813)", err, a)
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// landingOf is the landing page's data from the daemon's status, the
// collector's live summaries and the counters they lack, read back from
// the registry.
func landingOf(st lifecycle.Status, coll *collector.Collector, g prometheus.Gatherer) landingData {
	targets := make([]landingTarget, len(st.Targets))
	capacity := map[string]float64{}
	for i, t := range st.Targets {
		targets[i] = landingTarget(t)
		if t.CapacityKnown && t.CapacityBlocks > 0 {
			capacity[t.Name] = float64(t.CapacityBlocks) * float64(t.BlockSize)
		}
	}
	rows := coll.Status()
	updated := time.Now()
	inFlight, dropped, passes := landingCounters(g)
	out := make([]landingRow, len(rows))
	for i, r := range rows {
		k := [2]string{r.Workload, r.Target}
		out[i] = landingRow{Status: r, InFlight: inFlight[k], Dropped: dropped[k], Passes: passes[r.Workload], TargetCapacityTokens: capacity[r.Target]}
	}
	return landingData{
		ConfigFile:  st.ConfigFile,
		ReloadOK:    st.ReloadOK,
		LastReload:  st.LastReload,
		ReloadError: st.ReloadError,
		Rows:        out,
		Targets:     targets,
		Reconcile:   coll.Reconcile().Status(),
		UpdatedAt:   updated,
	}
}

// landingCounters reads requests in flight and dropped per (workload,
// target), and passes per workload, from the registry; a gathering error
// leaves what could not be read at zero, as the page is best effort.
func landingCounters(g prometheus.Gatherer) (inFlight, dropped map[[2]string]float64, passes map[string]float64) {
	inFlight, dropped, passes = map[[2]string]float64{}, map[[2]string]float64{}, map[string]float64{}
	mfs, _ := g.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var w, t string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "workload":
					w = l.GetValue()
				case "target":
					t = l.GetValue()
				}
			}
			switch mf.GetName() {
			case "kvload_requests_in_flight":
				inFlight[[2]string{w, t}] += m.GetGauge().GetValue()
			case "kvload_requests_dropped_total":
				dropped[[2]string{w, t}] += m.GetCounter().GetValue()
			case "kvload_trace_loops_total":
				passes[w] += m.GetCounter().GetValue()
			}
		}
	}
	return inFlight, dropped, passes
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
	for _, o := range openai.Outcomes {
		kv = append(kv, "requests_"+string(o), byOutcome[string(o)])
	}
	kv = append(kv, "requests_in_flight", inFlight)
	level.Info(logger).Log(kv...)
}

// checkConfig is --config.check: every problem of the file and of the traces
// it names, then exit 0, or 2 (bad input) as a start would.
func checkConfig(path string, limit int64, s streams) error {
	notes, err := lifecycle.Check(path)
	if err != nil {
		fmt.Fprintln(s.stdout, err)
		return withExitCode(errors.New("configuration check failed"), exitBadInput)
	}
	for _, n := range notes {
		fmt.Fprintf(s.stdout, "warning: %s\n", n)
	}
	cfg, fp, err := config.EstimateFile(path, config.DefaultMemoryCosts)
	if err == nil {
		fmt.Fprint(s.stdout, fp)
		err = cfg.CheckMemory(fp, limit)
	}
	if err != nil {
		fmt.Fprintln(s.stdout, err)
		return withExitCode(errors.New("configuration check failed"), exitBadInput)
	}
	fmt.Fprintf(s.stdout, "%s: configuration is valid\n", path)
	return nil
}

// memoryLimit is --memory.limit in bytes, 0 for none: as given, else the
// cgroup's limit, if any. Unless the operator set GOMEMLIMIT, the Go
// runtime's soft limit is set from the cgroup's limit too.
func memoryLimit(flag units.Base2Bytes) int64 {
	_, _ = memlimit.SetGoMemLimitWithOpts(memlimit.WithProvider(memlimit.FromCgroup))
	if flag >= 0 {
		return int64(flag)
	}
	if cg, err := memlimit.FromCgroup(); err == nil && cg > 0 && cg < math.MaxInt64 {
		return int64(cg)
	}
	return 0
}

// checkMemory refuses, at start, a configuration whose memory estimate
// exceeds limit; --config.check prints the estimate. Problems of the
// file itself are left for the start to report, as it does.
func checkMemory(path string, limit int64, logger log.Logger) error {
	if limit <= 0 {
		return nil
	}
	cfg, fp, err := config.EstimateFile(path, config.DefaultMemoryCosts)
	if err != nil {
		return nil
	}
	if err := cfg.CheckMemory(fp, limit); err != nil {
		return badInput(err)
	}
	level.Info(logger).Log("msg", "memory estimate within the limit", "estimate", config.FormatBytes(fp.Total()), "limit", config.FormatBytes(limit))
	return nil
}
