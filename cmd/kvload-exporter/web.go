package main

import (
	"context"
	"html/template"
	stdlog "log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"

	"github.com/kvload-exporter/kvload-exporter/collector"
)

// webDeps is what the HTTP endpoints need from the daemon.
type webDeps struct {
	gatherer      prometheus.Gatherer
	telemetryPath string
	ready         func() bool
	reload        func(ctx context.Context) error
	landing       func() landingData
}

// landingData is what the landing page shows.
type landingData struct {
	Version       string
	TelemetryPath string
	ConfigFile    string
	ReloadOK      bool
	LastReload    time.Time // last successful (re)load
	ReloadError   string    // why the last reload failed; never holds a secret
	Rows          []collector.Status
	Targets       []landingTarget
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
	mux.Handle("GET "+d.telemetryPath, promhttp.HandlerFor(d.gatherer, promhttp.HandlerOpts{
		EnableOpenMetrics:   true, // exemplars and native histograms over protobuf/OpenMetrics
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: metricsInFlight,
	}))
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
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := landingTemplate.Execute(w, data); err != nil {
			http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		}
	})
	return mux
}

// landingTemplate escapes every value (html/template), so names and error
// texts from a config file cannot inject markup.
var landingTemplate = template.Must(template.New("landing").Funcs(template.FuncMap{
	"ms":   func(d time.Duration) string { return formatMillis(d) },
	"secs": func(d time.Duration) string { return d.Round(time.Second).String() },
	"pct":  func(f float64) string { return formatPercent(f) },
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.UTC().Format(time.RFC3339)
	},
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="10">
<title>kvload-exporter</title>
<style>
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.8em; text-align: right; }
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) { text-align: left; }
.bad { color: #b00; } .ok { color: #070; }
</style>
</head>
<body>
<h1>kvload-exporter</h1>
<p>Replays LLM request traces against inference servers and measures latency and prefix-cache hits.
<a href="{{.TelemetryPath}}">Metrics</a> · <a href="/-/healthy">Health</a> · <a href="/-/ready">Ready</a></p>
<h2>Workloads</h2>
{{if .Rows}}<table>
<tr><th>Workload</th><th>Target</th><th>Requests/s</th><th>Errors</th><th>TTFT p50</th><th>TTFT p99</th><th>Observed hit rate</th><th>Theoretical hit rate</th><th>Cache efficiency</th><th>Window</th></tr>
{{range .Rows}}<tr><td>{{.Workload}}</td><td>{{.Target}}</td><td>{{printf "%.2f" .RequestsPerSec}}</td><td>{{pct .ErrorRatio}}</td><td>{{ms .TTFTP50}}</td><td>{{ms .TTFTP99}}</td>{{if .Reported}}<td>{{pct .ObservedHitRate}}</td>{{else}}<td title="the server reports no cached-token count">not reported</td>{{end}}<td>{{pct .TheoreticalRate}}</td><td>{{if .Reported}}{{printf "%.2f" .Efficiency}}{{else}}–{{end}}</td><td>{{secs .Window}}</td></tr>
{{end}}</table>{{else}}<p>No request has finished yet.</p>{{end}}
<h2>Targets</h2>
<table><tr><th>Target</th><th>Model</th><th>API</th><th>Dialect</th><th>KV block size</th><th>KV capacity (blocks)</th><th>Capacity from</th></tr>
{{range .Targets}}<tr><td>{{.Name}}</td><td>{{.Model}}</td><td>{{.API}}</td><td>{{.Dialect}}</td><td>{{.BlockSize}}</td><td>{{if eq .CapacityBlocks 0}}unbounded{{else}}{{.CapacityBlocks}}{{end}}</td><td{{if not .CapacityKnown}} class="bad"{{end}}>{{.CacheNote}}</td></tr>
{{end}}</table>
<h2>Configuration</h2>
<p>File: <code>{{.ConfigFile}}</code>. Last reload:
{{if .ReloadOK}}<span class="ok">successful</span>{{else}}<span class="bad">failed</span>{{end}};
last success {{ago .LastReload}}.</p>
{{if .ReloadError}}<pre class="bad">{{.ReloadError}}</pre>{{end}}
<p><small>{{.Version}}</small></p>
</body>
</html>
`))

func formatMillis(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return d.Round(100 * time.Microsecond).String()
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

func newConnLimiter(max int) *connLimiter {
	return &connLimiter{max: max, conns: map[net.Conn]*trackedConn{}}
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
