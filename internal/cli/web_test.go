package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

func testMux(ready bool, reloadErr error) *http.ServeMux {
	reg := prometheus.NewRegistry()
	c := collector.New(reg)
	c.SetTarget("t<script>", "m", "chat", "vllm")
	return newMux(webDeps{
		gatherer:      reg,
		telemetryPath: "/metrics",
		ready:         func() bool { return ready },
		reload:        func(context.Context) error { return reloadErr },
		landing: func() landingData {
			return landingData{
				ConfigFile:  "kvload.yml",
				ReloadError: `workloads[0].name: "<b>x</b>" may hold only letters`,
				LastReload:  time.Unix(0, 0),
				Targets:     []landingTarget{{Name: "<img src=x>", Model: "m", API: "chat", Dialect: "vllm", BlockSize: 16, CapacityBlocks: 20000, CapacityKnown: true}},
				Rows: []landingRow{{Status: collector.Status{Workload: "<w>", Target: "t", RequestsPerSec: 2, TTFTP50: 3 * time.Millisecond,
					Health: collector.HealthFailing, HealthReason: "<i>r</i>", LastError: `http_error (HTTP 500): <script>alert(1)</script>`,
					EffectiveCapacityState: collector.EffectiveMeasured, EffectiveCapacityTokens: 304_000, EffectiveCapacityWindow: 5 * time.Minute},
					TargetCapacityTokens: 320_000}},
			}
		},
	})
}

func TestWebEndpoints(t *testing.T) {
	tests := []struct {
		name       string
		mux        *http.ServeMux
		method     string
		path       string
		wantStatus int
		wantBody   string
	}{
		{"healthy", testMux(false, nil), "GET", "/-/healthy", 200, "Healthy"},
		{"not ready", testMux(false, nil), "GET", "/-/ready", 503, "Not ready"},
		{"ready", testMux(true, nil), "GET", "/-/ready", 200, "Ready"},
		{"reload needs POST", testMux(true, nil), "GET", "/-/reload", 405, "POST"},
		{"reload ok", testMux(true, nil), "POST", "/-/reload", 200, "Reloaded"},
		{"reload fails with problems", testMux(true, errors.New("kvload.yml: workloads[1].targets[0]: unknown target \"vlm-a\"")), "POST", "/-/reload", 500, `unknown target "vlm-a"`},
		{"metrics", testMux(true, nil), "GET", "/metrics", 200, "kvload_target_info"},
		{"landing", testMux(true, nil), "GET", "/", 200, "3.0 ms"},
		{"landing: effective capacity beside the model's", testMux(true, nil), "GET", "/", 200, "304k tokens<span class=\"reason\">0.95 × the model's 320k</span>"},
		{"landing: the model's capacity in tokens", testMux(true, nil), "GET", "/", 200, "20000<span class=\"reason\">320k tokens</span>"},
		{"landing: the verdict first, escaped", testMux(true, nil), "GET", "/", 200, `<p id="verdict" class="verdict bad">0 of 1 workload/target pairs healthy. failing: &lt;w&gt;/t; the last reload failed.</p>`},
		{"landing: the cache table has a heading", testMux(true, nil), "GET", "/", 200, "<h2>Cache</h2>\n<table id=\"cache\">"},
		{"unknown path", testMux(true, nil), "GET", "/nope", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tt.mux.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != tt.wantStatus {
				t.Errorf("status %d, want %d (%s)", rec.Code, tt.wantStatus, body)
			}
			if !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("body lacks %q:\n%s", tt.wantBody, body)
			}
		})
	}
}

func TestLandingEscapes(t *testing.T) {
	rec := httptest.NewRecorder()
	testMux(true, nil).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	body := rec.Body.String()
	for _, raw := range []string{"<script>", "<img src=x>", "<b>x</b>", "<w>", "<i>r</i>"} {
		if strings.Contains(body, raw) {
			t.Errorf("landing page holds unescaped %q", raw)
		}
	}
	if !strings.Contains(body, "&lt;img src=x&gt;") {
		t.Errorf("escaped target name missing:\n%s", body)
	}
}

// blockingGatherer holds every Gather until release is closed, counting
// how many run at once.
type blockingGatherer struct {
	release chan struct{}
	mu      sync.Mutex
	now     int
	peak    int
}

func (g *blockingGatherer) Gather() ([]*dto.MetricFamily, error) {
	g.mu.Lock()
	g.now++
	g.peak = max(g.peak, g.now)
	g.mu.Unlock()
	<-g.release
	g.mu.Lock()
	g.now--
	g.mu.Unlock()
	return nil, nil
}

func (g *blockingGatherer) running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.now
}

// TestMetricsScrapeStorm: 100 concurrent scrapes that negotiate alike share
// one gathering and one encoding, and all get it; 100 that each negotiate
// differently (a distinct Accept header) are capped at 10 run at once,
// the others answered 503 at once. Either way a scrape storm takes at most
// that many goroutines' worth of CPU from the replay.
func TestMetricsScrapeStorm(t *testing.T) {
	t.Parallel()
	// The documented cap (README, docs/reliability.md); it was 40.
	const scrapers, metricsInFlight = 100, 10
	for _, tc := range []struct {
		name     string
		distinct bool
		running  int // gathers running while held
		refused  int // answered 503 meanwhile
	}{
		{"alike", false, 1, 0},
		{"each different", true, metricsInFlight, scrapers - metricsInFlight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := &blockingGatherer{release: make(chan struct{})}
			srv := httptest.NewServer(newMux(webDeps{
				gatherer:      g,
				telemetryPath: "/metrics",
				ready:         func() bool { return true },
				reload:        func(context.Context) error { return nil },
				landing:       func() landingData { return landingData{} },
			}))
			t.Cleanup(srv.Close)
			// The held gathers end before the server's Close waits for
			// them, also when a wait below fails the test.
			release := sync.OnceFunc(func() { close(g.release) })
			t.Cleanup(release)

			codes := make(chan int, scrapers)
			for i := range scrapers {
				go func() {
					req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
					if tc.distinct {
						req.Header.Set("Accept", fmt.Sprintf("text/plain; scraper=%d", i))
					}
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						codes <- 0
						return
					}
					resp.Body.Close()
					codes <- resp.StatusCode
				}()
			}
			count := map[int]int{}
			for range tc.refused {
				count[testutil.WaitShowing(t, "an answer while the gathers are held", codes, heldAnswers{count, g})]++
			}
			if count[http.StatusServiceUnavailable] != tc.refused {
				t.Errorf("while scrapes were held: %v, want %d × 503", count, tc.refused)
			}
			// The held scrapes are in their gathers or waiting on one.
			testutil.Eventually(t, "the gathers started", func() (bool, string) {
				n := g.running()
				return n == tc.running, fmt.Sprintf("%d gathers running, want %d", n, tc.running)
			})
			release()
			for range scrapers - tc.refused {
				count[testutil.Wait(t, "the answer of a released scrape", codes)]++
			}
			if count[http.StatusOK] != scrapers-tc.refused || g.peak != tc.running {
				t.Errorf("answers %v, at most %d gathers at once; want %d × 200, at most %d at once", count, g.peak, scrapers-tc.refused, tc.running)
			}
		})
	}
}

// heldAnswers shows the answers so far and the gathers running, when a
// wait for an answer fails.
type heldAnswers struct {
	count map[int]int
	g     *blockingGatherer
}

func (h heldAnswers) String() string {
	return fmt.Sprintf("only %v answered while %d gathers run", h.count, h.g.running())
}

// closeRecorder is a connection that records whether it was closed.
type closeRecorder struct {
	net.Conn
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// TestConnLimiter: past its limit, the limiter closes the connection idle
// the longest (idle keep-alive or never used), never an active one nor the
// one just accepted.
func TestConnLimiter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		states []http.ConnState // of the connections already open, oldest first
		closed int              // index closed when one more arrives; -1 none
	}{
		{"under the limit", []http.ConnState{http.StateIdle}, -1},
		{"oldest idle closed", []http.ConnState{http.StateActive, http.StateIdle, http.StateIdle}, 1},
		{"never-used counts as idle", []http.ConnState{http.StateNew, http.StateIdle, http.StateActive}, 0},
		{"all active: none closed", []http.ConnState{http.StateActive, http.StateActive, http.StateActive}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := newConnLimiter(3)
			conns := make([]*closeRecorder, len(tt.states))
			for i, s := range tt.states {
				conns[i] = &closeRecorder{}
				l.connState(conns[i], http.StateNew)
				if s != http.StateNew {
					l.connState(conns[i], s)
				}
				// Distinct, ordered times without sleeping.
				l.conns[conns[i]].since = time.Unix(int64(i), 0)
			}
			fresh := &closeRecorder{}
			l.connState(fresh, http.StateNew)
			if fresh.closed {
				t.Error("the new connection was closed")
			}
			for i, c := range conns {
				if c.closed != (i == tt.closed) {
					t.Errorf("connection %d (%v) closed: %v", i, tt.states[i], c.closed)
				}
			}
		})
	}
}

// TestStateClasses: every health and efficiency state has its colour.
func TestStateClasses(t *testing.T) {
	for _, s := range collector.Healths {
		if healthClass[s] == "" {
			t.Errorf("health %q has no colour class", s)
		}
	}
	for _, s := range []collector.EfficiencyState{collector.EfficiencyOK, collector.EfficiencyLow, collector.EfficiencyAbove, collector.EfficiencyNotReported,
		collector.EfficiencyNoSharing, collector.EfficiencyNoSuccess} {
		if efficiencyClass[s] == "" {
			t.Errorf("efficiency state %q has no colour class", s)
		}
	}
	for _, s := range collector.EffectiveCapacityStates {
		if effectiveClass[s] == "" {
			t.Errorf("effective capacity state %q has no colour class", s)
		}
	}
}

func TestFormatTokens(t *testing.T) {
	for _, tt := range []struct {
		tokens float64
		want   string
	}{
		{0, "0"}, {999.4, "999"}, {1000, "1.00k"}, {31_960, "32.0k"}, {319_600, "320k"},
		{8_388_608, "8.39M"}, {33_554_432, "33.6M"}, {1.2e9, "1.20G"},
	} {
		if got := formatTokens(tt.tokens); got != tt.want {
			t.Errorf("formatTokens(%v) = %q, want %q", tt.tokens, got, tt.want)
		}
	}
}

// TestWebServerTimeouts: the daemon's web server closes a connection that
// sends nothing, half a request head, or half a body, and a kept-alive one
// left idle, each once its timeout has passed, so that such clients cannot
// hold file descriptors. The server is the daemon's (newWebServer) with
// only the timeout under test shortened; the others keep the daemon's
// values, which TestWebServerTimeoutValues checks.
//
// The client writes everything it will ever send before the server
// accepts: the server's clock starts with those bytes already in its
// socket, so no timeout can race the client's writes, whatever the load.
// A request that is whole therefore always has its head read, and the test
// judges only what the load cannot change: the connection is closed, no
// sooner than the timeout, answered or not.
func TestWebServerTimeouts(t *testing.T) {
	t.Parallel()
	const short = 100 * time.Millisecond
	tests := []struct {
		name    string
		send    string // written before the server accepts; the client then only reads
		shorten func(*http.Server)
		// answered: a response comes before the close (the idle case, and
		// the body cut by the read timeout).
		answered bool
	}{
		{"sends nothing", "", func(s *http.Server) { s.ReadHeaderTimeout = short }, false},
		{"half a request head", "GET /metrics HTTP/1.1\r\nHost: x\r\n", func(s *http.Server) { s.ReadHeaderTimeout = short }, false},
		{"head, then half the body", "POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc", func(s *http.Server) { s.ReadTimeout = short }, true},
		{"idle after one request", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", func(s *http.Server) { s.IdleTimeout = short }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, err := io.Copy(io.Discard, r.Body); err != nil {
					http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
					return
				}
				io.WriteString(w, "ok\n")
			})
			srv := newWebServer(handler, newConnLimiter(100), nil)
			tt.shorten(srv)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			// Last, after Serve's end: for a test that fails before it starts.
			t.Cleanup(func() { ln.Close() })

			// The kernel completes the handshake and queues the bytes
			// while nothing accepts yet.
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if tt.send != "" {
				if _, err := io.WriteString(conn, tt.send); err != nil {
					t.Fatal(err)
				}
			}
			type read struct {
				got []byte
				err error
			}
			closed := make(chan read, 1)
			// Ends when the server closes the connection, or when the
			// deferred Close does after a failed wait.
			go func() {
				got, err := io.ReadAll(conn)
				closed <- read{got, err}
			}()

			begun := time.Now()
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			t.Cleanup(func() {
				srv.Close()
				if err := <-served; !errors.Is(err, http.ErrServerClosed) {
					t.Errorf("Serve: %v", err)
				}
			})

			r := testutil.Wait(t, "the server closes the connection", closed)
			took := time.Since(begun)
			// A close with unread data in the server's socket may come as a
			// reset rather than EOF: closed all the same.
			if r.err != nil && !strings.Contains(r.err.Error(), "connection reset") {
				t.Fatalf("read: %v", r.err)
			}
			// The server's deadline starts when it accepts, after begun:
			// an earlier close is not the timeout's.
			if took < short {
				t.Errorf("closed after %v, before its timeout of %v (read %q)", took, short, r.got)
			}
			if answered := strings.HasPrefix(string(r.got), "HTTP/1.1 "); answered != tt.answered {
				t.Errorf("answered before the close: %v, want %v (read %q)", answered, tt.answered, r.got)
			}
		})
	}
}

// TestWebServerTimeoutValues: the daemon's web server has every timeout
// set, at the values docs/reliability.md gives.
func TestWebServerTimeoutValues(t *testing.T) {
	t.Parallel()
	srv := newWebServer(http.NotFoundHandler(), newConnLimiter(1), nil)
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"ReadHeaderTimeout", srv.ReadHeaderTimeout, 30 * time.Second},
		{"ReadTimeout", srv.ReadTimeout, time.Minute},
		{"WriteTimeout", srv.WriteTimeout, 2 * time.Minute},
		{"IdleTimeout", srv.IdleTimeout, 90 * time.Second},
	} {
		if c.got != c.want {
			t.Errorf("%s %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestLandingReconcile: the landing page's cache reconciliation table, one
// row per compared target: a disagreement is marked as the engine's
// metrics disagreeing, a state without ratios shows dashes and its reason,
// and without reconciled targets there is no table.
func TestLandingReconcile(t *testing.T) {
	render := func(rows []collector.ReconcileStatus) string {
		mux := newMux(webDeps{gatherer: prometheus.NewRegistry(), telemetryPath: "/metrics", ready: func() bool { return true },
			reload:  func(context.Context) error { return nil },
			landing: func() landingData { return landingData{Reconcile: rows} }})
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		return rec.Body.String()
	}
	body := render([]collector.ReconcileStatus{
		{Target: "double", State: collector.ReconcileCompared, Disagree: true, Reason: "the engine's metrics disagree <b>", Window: 5 * time.Minute,
			CanaryShare: 1, ShareKnown: true, EngineHitRate: 0.4, UsageHitRate: 0.2, TheoreticalRate: 0.2, EngineOverUsage: 2,
			UsageOverModel: 1, EngineOverModel: 2, ModelKnown: true},
		{Target: "shared", State: collector.ReconcileSharedEngine, Reason: "this exporter sent 50.0%", Window: time.Minute, CanaryShare: 0.5, ShareKnown: true},
	})
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?s)<tr data-target="double">.*?<span class="state warn">engine's metrics disagree</span><span class="reason">the engine&#39;s metrics disagree &lt;b&gt;</span>` +
			`.*?<td>100.0%</td>\s*<td>40.0%</td><td>20.0%</td><td>20.0%</td>\s*<td>2.00</td><td>1.00</td><td>2.00</td>\s*<td>300 s</td>`),
		regexp.MustCompile(`(?s)<tr data-target="shared">.*?<span class="state none">shared engine</span><span class="reason">this exporter sent 50.0%</span>` +
			`.*?<td>50.0%</td>\s*<td>–</td><td>–</td><td>–</td><td>–</td><td>–</td><td>–</td>\s*<td>60 s</td>`),
	} {
		if !want.MatchString(body) {
			t.Errorf("the page does not match %s:\n%s", want, body)
		}
	}
	if body := render(nil); strings.Contains(body, "Cache reconciliation") {
		t.Errorf("a table without reconciled targets:\n%s", body)
	}
}

// TestLandingVerdict: the page's first line names what needs attention,
// worst first, or says that nothing does.
func TestLandingVerdict(t *testing.T) {
	row := func(w, tg string, h collector.Health) landingRow {
		return landingRow{Status: collector.Status{Workload: w, Target: tg, Health: h}}
	}
	tests := []struct {
		name  string
		data  landingData
		class string
		text  string
	}{
		{"nothing finished", landingData{ReloadOK: true}, "none", "No request has finished yet."},
		{"all healthy", landingData{ReloadOK: true, Rows: []landingRow{row("a", "x", collector.HealthOK), row("a", "y", collector.HealthOK)}}, "ok",
			"All 2 workload/target pairs are healthy."},
		{"worst first", landingData{ReloadOK: true, Rows: []landingRow{row("a", "x", collector.HealthRecovering), row("a", "y", collector.HealthDegraded),
			row("a", "z", collector.HealthOK)}}, "warn", "1 of 3 workload/target pairs healthy. degraded: a/y; recovering: a/x."},
		{"only recovering", landingData{ReloadOK: true, Rows: []landingRow{row("a", "x", collector.HealthRecovering)}}, "rec",
			"0 of 1 workload/target pairs healthy. recovering: a/x."},
		{"names bounded", landingData{ReloadOK: true, Rows: []landingRow{row("a", "1", collector.HealthFailing), row("a", "2", collector.HealthFailing),
			row("a", "3", collector.HealthFailing), row("a", "4", collector.HealthFailing), row("a", "5", collector.HealthFailing), row("a", "6", collector.HealthFailing)}}, "bad",
			"failing: a/1, a/2, a/3, a/4 and 2 more."},
		{"a disagreeing engine", landingData{ReloadOK: true, Rows: []landingRow{row("a", "x", collector.HealthOK)},
			Reconcile: []collector.ReconcileStatus{{Target: "x", Disagree: true}}}, "warn", "1 of 1 workload/target pairs healthy. engine's metrics disagree: x."},
		{"a failed reload", landingData{ReloadError: "bad", Rows: []landingRow{row("a", "x", collector.HealthOK)}}, "bad", "the last reload failed."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.data.Verdict()
			if v.Class != tt.class || !strings.HasSuffix(v.Text, tt.text) {
				t.Errorf("verdict %q %q, want %q ending %q", v.Class, v.Text, tt.class, tt.text)
			}
		})
	}
}
