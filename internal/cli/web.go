package cli

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"html/template"
	stdlog "log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/internal/webshare"
)

// webDeps is what the HTTP endpoints need from the daemon.
type webDeps struct {
	gatherer      prometheus.Gatherer
	telemetryPath string
	ready         func() bool
	reload        func(ctx context.Context) error
	landing       func() landingData
}

// landingRefresh is how often the landing page reloads itself.
const landingRefresh = 10 * time.Second

// landingData is what the landing page shows.
type landingData struct {
	Version       string
	TelemetryPath string
	ConfigFile    string
	ReloadOK      bool
	LastReload    time.Time // last successful (re)load
	ReloadError   string    // why the last reload failed; never holds a secret
	Rows          []landingRow
	Targets       []landingTarget
	UpdatedAt     time.Time
	Refresh       time.Duration

	// Reconcile compares each target's engine counters with its responses.
	Reconcile []collector.ReconcileStatus
}

// landingRow is one (workload, target): the collector's live summary and
// the counters it does not keep itself.
type landingRow struct {
	collector.Status
	InFlight, Dropped, Passes float64
	// TargetCapacityTokens is the capacity of the target's model in
	// tokens, to set the effective capacity beside; 0 when unbounded or
	// unknown.
	TargetCapacityTokens float64
}

type landingTarget struct {
	Name, Model, API, Dialect string
	// The cache the target's theoretical model stands for.
	BlockSize, CapacityBlocks int
	CapacityKnown             bool
	CacheNote                 string
}

func newMux(d webDeps) *http.ServeMux {
	mux := http.NewServeMux()
	// Concurrent scrapes that negotiate alike share one encoded response.
	mux.Handle("GET "+d.telemetryPath, webshare.Responses(promhttp.HandlerFor(d.gatherer, promhttp.HandlerOpts{
		EnableOpenMetrics:   true, // exemplars and native histograms over protobuf/OpenMetrics
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: metricsInFlight,
	})))
	mux.HandleFunc("GET /-/healthy", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("Healthy\n"))
	})
	mux.HandleFunc("GET /-/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !d.ready() {
			http.Error(w, "Not ready", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("Ready\n"))
	})
	mux.HandleFunc("/-/reload", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "This endpoint requires a POST request.", http.StatusMethodNotAllowed)
			return
		}
		if err := d.reload(r.Context()); err != nil {
			http.Error(w, "failed to reload config:\n"+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Write([]byte("Reloaded\n"))
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		data := d.landing()
		data.Version = version.Info()
		data.TelemetryPath = d.telemetryPath
		if data.UpdatedAt.IsZero() {
			data.UpdatedAt = time.Now()
		}
		data.Refresh = landingRefresh
		// Render first, so that a template error is a clean 500.
		var buf bytes.Buffer
		if err := landingTemplate.Execute(&buf, data); err != nil {
			http.Error(w, "rendering the page failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(buf.Bytes())
	})
	return mux
}

// Colours of the health and efficiency states.
var (
	healthClass = map[collector.Health]string{
		collector.HealthOK:          "ok",
		collector.HealthRecovering:  "rec",
		collector.HealthDegraded:    "warn",
		collector.HealthFailing:     "bad",
		collector.HealthNotReported: "none",
	}
	efficiencyClass = map[collector.EfficiencyState]string{
		collector.EfficiencyOK:          "ok",
		collector.EfficiencyLow:         "warn",
		collector.EfficiencyAbove:       "warn",
		collector.EfficiencyNotReported: "none",
		collector.EfficiencyNoSharing:   "none",
		collector.EfficiencyNoSuccess:   "none",
	}
	reconcileClass = map[collector.ReconcileState]string{
		collector.ReconcileCompared:        "ok",
		collector.ReconcileNoEngineCounter: "none",
		collector.ReconcileNoQueryCounter:  "none",
		collector.ReconcileNothingCounted:  "none",
		collector.ReconcileNotReported:     "none",
		collector.ReconcileSharedEngine:    "none",
		collector.ReconcileTooFewHits:      "none",

		// A page that is not the target's engine: a finding, not a lack.
		collector.ReconcileEngineUndercounted: "warn",
	}
	effectiveClass = map[collector.EffectiveCapacityState]string{
		collector.EffectiveMeasured:       "ok",
		collector.EffectiveAboveModel:     "warn",
		collector.EffectiveNothingToShare: "none",
		collector.EffectiveNotReported:    "none",
	}
)

//go:embed landing.html
var landingHTML string

// landingTemplate escapes every value (html/template), so names and error
// texts from a config file or a server cannot inject markup.
var landingTemplate = template.Must(template.New("landing").Funcs(template.FuncMap{
	"ms":         formatMillis,
	"lagms":      func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + " ms" },
	"seconds":    func(d time.Duration) int { return int(d.Round(time.Second).Seconds()) },
	"pct":        formatPercent,
	"count":      func(f float64) string { return strconv.FormatFloat(f, 'f', 0, 64) },
	"health":     func(h collector.Health) string { return healthClass[h] },
	"efficiency": func(e collector.EfficiencyState) string { return efficiencyClass[e] },
	"effective":  func(e collector.EffectiveCapacityState) string { return effectiveClass[e] },
	"words":      func(e collector.EffectiveCapacityState) string { return strings.ReplaceAll(string(e), "_", " ") },
	"tokens":     formatTokens,
	"mul":        func(a, b int) float64 { return float64(a) * float64(b) },
	"ratio":      func(a, b float64) string { return strconv.FormatFloat(a/b, 'f', 2, 64) },
	"utc": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
	"reconciled": func(st collector.ReconcileStatus) string {
		if st.Disagree {
			return "warn"
		}
		return reconcileClass[st.State]
	},
	"spaced": func(s collector.ReconcileState) string { return strings.ReplaceAll(string(s), "_", " ") },
}).Parse(landingHTML))

// formatMillis is a TTFT in milliseconds, always: mixed units misread.
func formatMillis(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + " ms"
}

// formatTokens is a count of tokens in three significant figures or more,
// with k, M or G for thousands, millions and billions.
func formatTokens(f float64) string {
	for _, u := range []struct {
		unit  string
		scale float64
	}{{"G", 1e9}, {"M", 1e6}, {"k", 1e3}} {
		if f >= u.scale {
			v := f / u.scale
			digits := 2
			switch {
			case v >= 100:
				digits = 0
			case v >= 10:
				digits = 1
			}
			return strconv.FormatFloat(v, 'f', digits, 64) + u.unit
		}
	}
	return strconv.FormatFloat(f, 'f', 0, 64)
}

func formatPercent(f float64) string {
	return strconv.FormatFloat(f*100, 'f', 1, 64) + "%"
}

// Web server limits. A connection that sends nothing is closed after
// webReadHeaderTimeout; a keep-alive one idle for webIdleTimeout. The write
// timeout leaves room for a POST /-/reload of a big trace.
const (
	webReadHeaderTimeout = 30 * time.Second
	webReadTimeout       = time.Minute
	webWriteTimeout      = 2 * time.Minute
	webIdleTimeout       = 90 * time.Second
	// metricsInFlight caps concurrent /metrics requests; more answer 503
	// at once rather than share the CPU with the replay.
	metricsInFlight = 10
)

// maxWebConns is how many connections the web server keeps open: a
// quarter of the file descriptor limit, so that idle clients cannot take
// the descriptors the replay needs for its own connections.
func maxWebConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 256
	}
	return int(min(max(rl.Cur/4, 16), 4096))
}

// connLimiter tracks the web server's connections through
// http.Server.ConnState and, past its limit, closes the one idle the
// longest (an idle keep-alive one, or one that never sent a request).
// It does not block accepting: a fresh scrape always gets in.
type connLimiter struct {
	max   int
	mu    sync.Mutex
	conns map[net.Conn]*trackedConn
}

type trackedConn struct {
	state http.ConnState
	since time.Time
}

func newConnLimiter(limit int) *connLimiter {
	return &connLimiter{max: limit, conns: map[net.Conn]*trackedConn{}}
}

// connState is the http.Server.ConnState hook.
func (l *connLimiter) connState(c net.Conn, state http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateClosed, http.StateHijacked:
		delete(l.conns, c)
		return
	case http.StateNew:
		l.conns[c] = &trackedConn{state: state, since: time.Now()}
		for len(l.conns) > l.max {
			if !l.closeIdlestLocked(c) {
				break // all busy: they end within the timeouts
			}
		}
		return
	}
	if tc := l.conns[c]; tc != nil {
		tc.state, tc.since = state, time.Now()
	}
}

// closeIdlestLocked closes the connection idle the longest, other than
// keep, and forgets it (its StateClosed comes later).
func (l *connLimiter) closeIdlestLocked(keep net.Conn) bool {
	var victim net.Conn
	var since time.Time
	for c, tc := range l.conns {
		if c == keep || (tc.state != http.StateIdle && tc.state != http.StateNew) {
			continue
		}
		if victim == nil || tc.since.Before(since) {
			victim, since = c, tc.since
		}
	}
	if victim == nil {
		return false
	}
	delete(l.conns, victim)
	victim.Close()
	return true
}

// newWebServer is the daemon's HTTP server around handler, its
// connections bounded by limiter.
func newWebServer(handler http.Handler, limiter *connLimiter, errorLog *stdlog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: webReadHeaderTimeout,
		ReadTimeout:       webReadTimeout,
		WriteTimeout:      webWriteTimeout,
		IdleTimeout:       webIdleTimeout,
		ConnState:         limiter.connState,
		ErrorLog:          errorLog,
	}
}

// verdict is the landing page's one-line summary: what needs attention
// first, or that nothing does.
type verdict struct {
	Class, Text string
}

// verdictNames is how many pairs a verdict names per state.
const verdictNames = 4

// Verdict sums up the page in a line: pairs by health, worst first, a
// disagreeing engine and a failed reload.
func (d landingData) Verdict() verdict {
	if len(d.Rows) == 0 {
		return verdict{"none", "No request has finished yet."}
	}
	byHealth := map[collector.Health][]string{}
	for _, r := range d.Rows {
		byHealth[r.Health] = append(byHealth[r.Health], r.Workload+"/"+r.Target)
	}
	var parts []string
	class := ""
	for _, h := range []struct {
		health collector.Health
		class  string
	}{{collector.HealthFailing, "bad"}, {collector.HealthDegraded, "warn"}, {collector.HealthRecovering, "rec"}, {collector.HealthNotReported, "none"}} {
		names := byHealth[h.health]
		if len(names) == 0 {
			continue
		}
		if class == "" {
			class = h.class
		}
		shown := strings.Join(names[:min(len(names), verdictNames)], ", ")
		if len(names) > verdictNames {
			shown += fmt.Sprintf(" and %d more", len(names)-verdictNames)
		}
		parts = append(parts, fmt.Sprintf("%s: %s", h.health, shown))
	}
	for _, r := range d.Reconcile {
		if r.Disagree {
			parts = append(parts, "engine's metrics disagree: "+r.Target)
			if class == "" || class == "rec" || class == "none" {
				class = "warn"
			}
		}
	}
	if !d.ReloadOK && d.ReloadError != "" {
		parts = append(parts, "the last reload failed")
		class = "bad"
	}
	if len(parts) == 0 {
		return verdict{"ok", fmt.Sprintf("All %d workload/target pairs are healthy.", len(d.Rows))}
	}
	healthy := len(byHealth[collector.HealthOK])
	return verdict{class, fmt.Sprintf("%d of %d workload/target pairs healthy. %s.", healthy, len(d.Rows), strings.Join(parts, "; "))}
}
