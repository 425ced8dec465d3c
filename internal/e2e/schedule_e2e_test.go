package e2e

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// e2eCountingEngine is an emulated engine behind a handler that sees every
// generation request arrive and end: when each arrived, and the most that
// were out at once. A request ends as its [DONE] is written, before the
// client can read it, so a client that sends its next request only after
// reading the last one's [DONE] can never be counted twice at once.
type e2eCountingEngine struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []time.Time
	inflight int
	peak     int
}

func newE2ECountingEngine(t *testing.T, cfg emulate.Config) *e2eCountingEngine {
	t.Helper()
	eng, err := emulate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &e2eCountingEngine{}
	h := eng.Handler()
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/completions") {
			h.ServeHTTP(w, r)
			return
		}
		c.mu.Lock()
		c.arrivals = append(c.arrivals, time.Now())
		c.inflight++
		c.peak = max(c.peak, c.inflight)
		c.mu.Unlock()
		var once sync.Once
		end := func() {
			once.Do(func() {
				c.mu.Lock()
				c.inflight--
				c.mu.Unlock()
			})
		}
		defer end()
		h.ServeHTTP(&e2eDoneWriter{ResponseWriter: w, done: end}, r)
	}))
	t.Cleanup(c.Close)
	return c
}

// e2eDoneWriter calls done just before it writes a stream's [DONE].
type e2eDoneWriter struct {
	http.ResponseWriter
	done func()
}

func (w *e2eDoneWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("[DONE]")) {
		w.done()
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController flush through.
func (w *e2eDoneWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestE2ESchedules replays a trace of 2,000 rows without timestamps, once
// at a constant rate, once at a Poisson rate and once with 8 closed-loop
// users, each against an emulated engine of its own. Every row reaches
// its engine and none is dropped; the generated arrivals keep the rate
// asked within 2 % over the 2,000 requests, and so do the engines'
// arrivals past the lags the exporter reported (a slow machine delays
// the requests, and the exporter must say by how much); the users
// never have more than 8 requests out; the schedule lag of every request
// is exported.
func TestE2ESchedules(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	const rows, rate = 2000, 200.0
	dir := t.TempDir()
	var tr strings.Builder
	for i := range rows {
		fmt.Fprintf(&tr, `{"input_length": 20, "output_length": 2, "hash_ids": [%d, %d]}`+"\n", 2*i+1, 2*i+2)
	}
	tracePath := filepath.Join(dir, "untimed.jsonl")
	if err := os.WriteFile(tracePath, []byte(tr.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	engines := map[string]*e2eCountingEngine{}
	var cfg strings.Builder
	cfg.WriteString("targets:\n")
	for _, name := range []string{"constant", "poisson", "users"} {
		engines[name] = newE2ECountingEngine(t, emulate.Config{BlockSize: 16, Overhead: time.Millisecond, InterToken: 2 * time.Millisecond})
		fmt.Fprintf(&cfg, "  - {name: %s, url: %q, model: %q, dialect: vllm}\n", name, engines[name].URL, emulate.DefaultModel)
	}
	schedules := map[string]string{
		"constant": fmt.Sprintf("{rate: %v, arrivals: constant}", rate),
		"poisson":  fmt.Sprintf("{rate: %v, arrivals: poisson}", rate),
		"users":    "{users: 8}",
	}
	cfg.WriteString("workloads:\n")
	for name, s := range schedules {
		fmt.Fprintf(&cfg, "  - {name: %s, trace: untimed.jsonl, targets: [%s], block_size: 16, seed: 11, loop: once, on_saturation: queue, schedule: %s}\n", name, name, s)
	}
	if err := os.WriteFile(filepath.Join(dir, "kvload.yml"), []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	d := e2eStart(t, filepath.Join(dir, "kvload.yml"))
	var m testutil.Families
	for name := range schedules {
		m = e2eWaitPass(t, d, name, rows, name)
	}

	// The arrivals the rates generated: the same pacer over the same rows,
	// and the span from the first to the last.
	recs, err := trace.ReadFile(tracePath, trace.ReadOptions{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	scheduled := map[string]time.Duration{}
	for _, arrivals := range []replay.Arrivals{replay.ArrivalsConstant, replay.ArrivalsPoisson} {
		p, err := replay.NewPacer(recs, replay.PacerOptions{Loop: replay.LoopOnce, Schedule: replay.Schedule{Rate: rate, Arrivals: arrivals, Seed: 11}})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		var first, last time.Duration
		for it, ok := p.Next(); ok; it, ok = p.Next() {
			if n == 0 {
				first = it.Due
			}
			n, last = n+1, it.Due
		}
		scheduled[string(arrivals)] = last - first
		// n requests over the pass: the last arrival plus the gap after it.
		got := float64(n) / p.Period().Seconds()
		t.Logf("%s: %d arrivals, the last at %v, in a pass of %v: %.3f/s", arrivals, n, last, p.Period(), got)
		if n != rows || math.Abs(got-rate)/rate > 0.02 {
			t.Errorf("%s: %d arrivals at %.3f/s, want %d at %v/s within 2%%", arrivals, n, got, rows, rate)
		}
	}

	for name, eng := range engines {
		tt := e2eTotalsOf(m, name, name)
		eng.mu.Lock()
		received, peak, arrivals := len(eng.arrivals), eng.peak, eng.arrivals
		eng.mu.Unlock()
		if tt.Success != rows || tt.Dropped != 0 || received != rows || tt.ScheduleLagSamples != rows {
			t.Errorf("%s: %v succeeded, %v dropped, %d reached the engine, %v schedule lag samples; want %d, 0, %d, %d",
				name, tt.Success, tt.Dropped, received, tt.ScheduleLagSamples, rows, rows, rows)
			continue
		}
		span := arrivals[len(arrivals)-1].Sub(arrivals[0])
		lag := e2eLagSum(m, name) / float64(rows)
		t.Logf("%s: %d requests reached the engine over %v (%.1f/s), at most %d at once; mean schedule lag %.2g s",
			name, received, span.Round(time.Millisecond), float64(rows-1)/span.Seconds(), peak, lag)
		if name == "users" && (peak > 8 || peak < 2) {
			t.Errorf("users: at most %d requests out at once, want 8 at most, and more than one (users side by side)", peak)
		}
		// The rate the engine saw, against the one asked: the span of its
		// arrivals against the schedule's, once the lag the exporter
		// reported is taken out. The first and the last request each went
		// out as late as its schedule lag, which is at most the bound of
		// the highest bucket holding one, so the spans differ by that
		// much at most; a slow machine puts its delay there, where the
		// exporter shows it, and the rest must be within 2 %.
		if want, ok := scheduled[name]; ok {
			maxLag := e2eMaxLag(m, name)
			if off := (math.Abs(span.Seconds()-want.Seconds()) - maxLag) / want.Seconds(); off > 0.02 {
				t.Errorf("%s: the engine's requests span %v, the schedule's %v, the exporter's lags at most %.3g s: the rate achieved is %.1f%% off past them, want within 2%%",
					name, span.Round(time.Millisecond), want.Round(time.Millisecond), maxLag, 100*off)
			}
		}
	}
}

// e2eLagSum is the sum of workload's schedule lags, in seconds.
func e2eLagSum(m testutil.Families, workload string) float64 {
	sum := 0.0
	for _, s := range m["kvload_schedule_lag_seconds"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "workload" && l.GetValue() == workload {
				sum += s.GetHistogram().GetSampleSum()
			}
		}
	}
	return sum
}

// e2eMaxLag bounds the schedule lag of every request of workload: the
// upper bound of the lowest bucket holding them all (+Inf past the last).
func e2eMaxLag(m testutil.Families, workload string) float64 {
	bound := 0.0
	for _, s := range m["kvload_schedule_lag_seconds"].GetMetric() {
		mine := false
		for _, l := range s.GetLabel() {
			mine = mine || l.GetName() == "workload" && l.GetValue() == workload
		}
		h := s.GetHistogram()
		if !mine || h.GetSampleCount() == 0 {
			continue
		}
		highest := math.Inf(1)
		for _, b := range h.GetBucket() {
			if b.GetCumulativeCount() == h.GetSampleCount() {
				highest = b.GetUpperBound()
				break
			}
		}
		bound = max(bound, highest)
	}
	return bound
}
