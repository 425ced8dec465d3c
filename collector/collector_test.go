package collector

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/servedcache"
)

var update = flag.Bool("update", false, "rewrite golden files")

// scripted feeds a fixed sequence of events with known numbers, through
// the cache-truth step as the daemon does.
func scripted(c *Collector) {
	t0 := time.Unix(1_700_000_000, 0)
	tr := servedcache.New(c)
	c.SetTarget("vllm-a", "Qwen/Qwen3-0.6B", "chat", "vllm")
	tr.SetTarget("vllm-a", "vllm", "usage")
	c.Start("canary", "vllm-a")
	c.ReloadDone(true, t0)

	ok := func(sched, ttft, last time.Duration, out, prompt, cached, trace, theo int) *replay.Result {
		sent := t0.Add(sched + 2*time.Millisecond)
		// All of the hit from a cache of 4,096 tokens on.
		profile := replay.CapacityProfile{Known: true}
		if theo > 0 {
			profile.Steps = []replay.CapacityStep{{Capacity: 4096, Tokens: theo}}
		}
		return &replay.Result{
			Response: openai.Response{Sent: sent, FirstToken: sent.Add(ttft), LastToken: sent.Add(last), Outcome: openai.OutcomeSuccess, HTTPStatus: 200, OutputTokens: out, OutputFromUsage: true, PromptTokens: prompt, PromptKnown: true, CachedTokens: cached, CachedKnown: true},
			Workload: "canary", Target: "vllm-a",
			Scheduled:        t0.Add(sched),
			TraceInputLength: trace, TheoreticalCachedTokens: theo, TheoreticalKnown: true,
			TheoreticalByCapacity: profile,
		}
	}
	results := []*replay.Result{
		ok(0, 40*time.Millisecond, 540*time.Millisecond, 11, 1312, 0, 1300, 0),
		ok(time.Second, 20*time.Millisecond, 220*time.Millisecond, 5, 1112, 1024, 1100, 1024),
		{
			Response: openai.Response{Sent: t0.Add(2*time.Second + time.Millisecond), Outcome: openai.OutcomeHTTPError, HTTPStatus: 500}, Workload: "canary", Target: "vllm-a", Scheduled: t0.Add(2 * time.Second), TraceInputLength: 900},
	}
	for _, r := range results {
		tr.Sent(r.Workload, r.Target, r.Scheduled, r.Sent)
	}
	for _, r := range results {
		tr.Finished(r)
	}
	c.Dropped("canary", "vllm-a", replay.DropMaxInFlight, t0)
	c.PassCompleted("canary", "vllm-a", 0)
	c.PassCompleted("canary", "other", 0) // the same pass from a second target is not counted again
}

func TestGoldenMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	now := time.Unix(1_700_000_000, 0)
	c.now = func() time.Time { return now }
	scripted(c)
	now = now.Add(time.Minute)

	golden := filepath.Join("testdata", "scripted.prom")
	if *update {
		out, err := gatherText(reg)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./collector -update)", err)
	}
	defer f.Close()
	if err := promtestutil.GatherAndCompare(reg, f); err != nil {
		t.Error(err)
	}
	problems, err := promtestutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestForgetRemovesSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	scripted(c)
	c.Start("canary", "vllm-b")
	c.Forget("canary", "vllm-a")
	c.ForgetTarget("vllm-a")
	out, err := gatherText(reg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), `target="vllm-a"`) {
		t.Errorf("series of the forgotten target remain:\n%s", out)
	}
	if !strings.Contains(string(out), `target="vllm-b"`) {
		t.Errorf("series of the kept target are gone")
	}
}

func TestReloadFailureKeepsTimestamp(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	at := time.Unix(1000, 0)
	c.ReloadDone(true, at)
	c.ReloadDone(false, at.Add(time.Hour))
	if got := promtestutil.ToFloat64(c.reloadOK); got != 0 {
		t.Errorf("reload gauge = %v, want 0", got)
	}
	if got := promtestutil.ToFloat64(c.reloadTime); got != 1000 {
		t.Errorf("last success = %v, want 1000", got)
	}
}

// gatherText renders reg in the text exposition format.
func gatherText(reg prometheus.Gatherer) ([]byte, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, err
		}
	}
	return b.Bytes(), nil
}

func TestStatus(t *testing.T) {
	c := New(prometheus.NewRegistry())
	now := time.Unix(5000, 0)
	c.now = func() time.Time { return now }
	scripted(c) // two successes, one failure, all "now"
	now = now.Add(10 * time.Second)
	st := c.Status()
	if len(st) != 1 {
		t.Fatalf("got %d rows", len(st))
	}
	s := st[0]
	if s.Window != 10*time.Second || s.RequestsPerSec != 0.3 {
		t.Errorf("window %v rate %v, want 10s and 0.3/s", s.Window, s.RequestsPerSec)
	}
	if s.TTFTP50 != 20*time.Millisecond || s.TTFTP99 != 40*time.Millisecond {
		t.Errorf("TTFT p50 %v p99 %v", s.TTFTP50, s.TTFTP99)
	}
	if want := 1024.0 / 2424; s.ObservedHitRate != want {
		t.Errorf("observed %v, want %v", s.ObservedHitRate, want)
	}
	if want := 1024.0 / 2400; s.TheoreticalRate != want {
		t.Errorf("theoretical %v, want %v", s.TheoreticalRate, want)
	}
	if s.ErrorRatio != 1.0/3 {
		t.Errorf("error ratio %v", s.ErrorRatio)
	}
	now = now.Add(2 * time.Minute)
	if st := c.Status(); st[0].RequestsPerSec != 0 {
		t.Errorf("old samples still counted: %+v", st[0])
	}
}

// TestUnknownIsNotZero: a response without a cached-token count counts on
// neither side of the efficiency ratio, is counted as unreported, and the
// user hears of it once per target.
func TestUnknownIsNotZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	tr := servedcache.New(c)
	var told []string
	tr.NotifyUnreported = func(target string, dialect engine.Dialect) { told = append(told, target+"/"+string(dialect)) }
	c.SetTarget("a", "m", "chat", "vllm")
	tr.SetTarget("a", "vllm", "usage")
	c.Start("w", "a")
	res := func(known bool) *replay.Result {
		t0 := time.Unix(1_700_000_000, 0)
		return &replay.Result{
			Response: openai.Response{Sent: t0, FirstToken: t0.Add(time.Millisecond), LastToken: t0.Add(time.Second), Outcome: openai.OutcomeSuccess, PromptTokens: 1000, PromptKnown: true, CachedTokens: 512, CachedKnown: known}, Workload: "w", Target: "a",
			TraceInputLength: 1000, TheoreticalCachedTokens: 512, TheoreticalKnown: true}
	}
	for _, known := range []bool{false, false, true} {
		r := res(known)
		tr.Sent("w", "a", r.Sent, r.Sent)
		tr.Finished(r)
	}
	for name, want := range map[string]float64{
		"kvload_cache_unreported_requests_total":                       2,
		"kvload_cache_reported_prompt_tokens_total":                    1000,
		"kvload_cache_reported_trace_prompt_tokens_total":              1000,
		"kvload_cache_reported_theoretical_cached_prompt_tokens_total": 512,
		"kvload_cached_prompt_tokens_total":                            512,
		"kvload_cache_reported_cached_prompt_tokens_total":             512,
		"kvload_prompt_tokens_total":                                   3000,
		"kvload_theoretical_cached_prompt_tokens_total":                1536,
	} {
		if got := testutil.Gather(t, reg).Sum(name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if len(told) != 1 || told[0] != "a/vllm" {
		t.Errorf("notified %v, want once for a/vllm", told)
	}
	if st := c.Status(); len(st) != 1 || !st[0].Reported || st[0].Efficiency != 1 {
		t.Errorf("status %+v, want reported with efficiency 1", st)
	}
}

// TestServerCachedCarried: hits a scrape sees while requests are in flight
// but none finished since the last scrape are kept for those requests'
// workload, not dropped; hits with nothing in flight are other traffic.
func TestServerCachedCarried(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	tr := servedcache.New(c)
	c.SetTarget("s", "m", "chat", "vllm")
	tr.SetTarget("s", "vllm", "server_metrics")
	c.Start("w", "s")
	t0 := time.Unix(1_700_000_000, 0)
	done := func() {
		tr.Finished(&replay.Result{Workload: "w", Target: "s", TraceInputLength: 100, TheoreticalKnown: true, Response: openai.Response{Sent: t0, Outcome: openai.OutcomeSuccess}})
	}
	tr.AddServerCached("s", 50) // nothing sent: other traffic
	tr.Sent("w", "s", t0, t0)
	tr.Sent("w", "s", t0, t0)
	tr.AddServerCached("s", 30) // in flight, nothing finished yet: carried
	done()
	tr.AddServerCached("s", 20) // credited with the carried 30
	tr.AddServerCached("s", 10) // one still in flight: the last shares take it
	done()
	tr.AddServerCached("s", 5)
	tr.AddServerCached("s", 7) // nothing in flight, nothing finished: other traffic
	if got := testutil.Gather(t, reg).Sum("kvload_cached_prompt_tokens_total"); got != 65 {
		t.Errorf("cached tokens %v, want 65 (30+20+10+5)", got)
	}
}

// TestPassesFromAnchor: pass numbers count from the schedule's anchor, so
// the first pass seen is large; each later one adds one.
func TestPassesFromAnchor(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	for _, p := range []int{1_000_000, 1_000_000, 1_000_001, 1_000_000, 1_000_003} {
		c.PassCompleted("w", "a", p)
	}
	if got := testutil.Gather(t, reg).Sum("kvload_trace_loops_total"); got != 3 {
		t.Errorf("passes %v, want 3", got)
	}
	c.ForgetWorkload("w")
	c.PassCompleted("w", "a", 1_000_004) // removed, then added back
	if got := testutil.Gather(t, reg).Sum("kvload_trace_loops_total"); got != 1 {
		t.Errorf("passes after re-adding %v, want 1", got)
	}
}

func TestClassOf(t *testing.T) {
	tests := []struct {
		theo, isl int
		want      CacheClass
	}{
		{0, 1000, CacheClassNone}, {99, 1000, CacheClassNone}, {100, 1000, CacheClassPartial},
		{699, 1000, CacheClassPartial}, {700, 1000, CacheClassMost}, {999, 1000, CacheClassMost}, {0, 0, CacheClassNone},
	}
	for _, tt := range tests {
		if got := ClassOf(tt.theo, tt.isl); got != tt.want {
			t.Errorf("ClassOf(%d, %d) = %s, want %s", tt.theo, tt.isl, got, tt.want)
		}
	}
}

// TestScheduleLagSubMillisecond: sub-millisecond lags land in their own
// classic buckets, so a dispatcher sending 300 µs late is told from one
// sending 900 µs late.
func TestScheduleLagSubMillisecond(t *testing.T) {
	for _, tc := range []struct {
		lag  time.Duration
		want string // the smallest le bound that counts it
	}{
		{50 * time.Microsecond, "0.0001"},
		{100 * time.Microsecond, "0.0001"},
		{200 * time.Microsecond, "0.00025"},
		{300 * time.Microsecond, "0.0005"},
		{600 * time.Microsecond, "0.00075"},
		{900 * time.Microsecond, "0.001"},
		{2 * time.Millisecond, "0.0025"},
		{90 * time.Second, "120"},
	} {
		t.Run(tc.lag.String(), func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			c := New(reg)
			t0 := time.Unix(1_700_000_000, 0)
			c.Sent("w", "t", t0, t0.Add(tc.lag))
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, mf := range mfs {
				if mf.GetName() != "kvload_schedule_lag_seconds" {
					continue
				}
				for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
					if b.GetCumulativeCount() == 1 {
						got = strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
						break
					}
				}
			}
			if got != tc.want {
				t.Errorf("lag %v counted first in le=%q, want le=%q", tc.lag, got, tc.want)
			}
		})
	}
}

// TestServerMetricsAttribution checks that a scrape's increase is shared by
// the workloads in proportion to the prompt tokens they sent, that usage
// cached tokens are ignored for such a target, and that hits while nothing
// was sent are not counted.
func TestServerMetricsAttribution(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	tr := servedcache.New(c)
	c.SetTarget("srv", "m", "chat", "vllm")
	tr.SetTarget("srv", "vllm", "server_metrics")
	var value atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:prefix_cache_hits_total %d\n", value.Load())
	}))
	defer srv.Close()
	s := &engine.ServerScraper{Target: "srv", URL: srv.URL, Dialect: "vllm", Client: srv.Client(), Interval: time.Hour}

	value.Store(5000)
	if err := s.ScrapeOnce(context.Background(), tr); err != nil { // baseline
		t.Fatal(err)
	}
	for _, r := range []struct {
		w     string
		trace int
	}{{"a", 3000}, {"b", 1000}} {
		tr.Finished(&replay.Result{
			Response: openai.Response{Outcome: openai.OutcomeSuccess, CachedTokens: 999, CachedKnown: true}, Workload: r.w, Target: "srv",
			TraceInputLength: r.trace})
	}
	value.Store(5800)
	if err := s.ScrapeOnce(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	value.Store(9000) // other traffic: nothing of ours was sent
	if err := s.ScrapeOnce(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	if got := promtestutil.ToFloat64(c.cachedTokens.WithLabelValues("a", "srv")); got != 600 {
		t.Errorf("workload a: %v cached tokens, want 600", got)
	}
	if got := promtestutil.ToFloat64(c.cachedTokens.WithLabelValues("b", "srv")); got != 200 {
		t.Errorf("workload b: %v cached tokens, want 200", got)
	}
}

// TestServerMetricsShare: with observed: server_metrics, a replica takes
// only its part of the engine's cached tokens (its share of the prompt
// tokens the engine counted, where the engine counts them), and the
// efficiency's observed side only the part of requests whose theoretical
// tokens are known.
func TestServerMetricsShare(t *testing.T) {
	type finish struct {
		w         string
		prompt    int
		theoKnown bool
	}
	type step struct {
		finished []finish
		counts   engine.ServerCounts
	}
	known := func(w string, p int) finish { return finish{w: w, prompt: p, theoKnown: true} }
	tests := []struct {
		name  string
		steps []step
		// per workload: kvload_cached_prompt_tokens_total and
		// kvload_cache_reported_cached_prompt_tokens_total
		wantCached, wantReported map[string]float64
	}{
		{"the engine's only client takes every hit", []step{
			{[]finish{known("a", 3000), known("b", 1000)}, engine.ServerCounts{Cached: 800, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 600, "b": 200}, map[string]float64{"a": 600, "b": 200}},
		{"one of two replicas sharded against one engine takes half", []step{
			{[]finish{known("a", 2000)}, engine.ServerCounts{Cached: 1000, Prompt: 4000, PromptKnown: true}},
			{[]finish{known("a", 2000)}, engine.ServerCounts{Cached: 1200, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 1100}, map[string]float64{"a": 1100}},
		{"requests of unknown theoretical tokens stay off the efficiency", []step{
			{[]finish{known("a", 1000), {w: "a", prompt: 3000}}, engine.ServerCounts{Cached: 2000, Prompt: 4000, PromptKnown: true}},
		}, map[string]float64{"a": 2000}, map[string]float64{"a": 500}},
		{"a request the engine counted before it finished is credited later", []step{
			{[]finish{known("a", 1000)}, engine.ServerCounts{Cached: 900, Prompt: 2000, PromptKnown: true}},
			{[]finish{known("a", 1000)}, engine.ServerCounts{PromptKnown: true}},
		}, map[string]float64{"a": 900}, map[string]float64{"a": 900}},
		// Within the window, the replica's share of the prompt tokens is
		// its share of the hits, whoever hit more.
		{"other traffic in the window shares the hits by prompt tokens", []step{
			{[]finish{known("a", 1000)}, engine.ServerCounts{Cached: 500, Prompt: 1000, PromptKnown: true}},
			{nil, engine.ServerCounts{Cached: 700, Prompt: 1000, PromptKnown: true}},
		}, map[string]float64{"a": 600}, map[string]float64{"a": 600}},
		// The credit of the first read falls short (half the engine's
		// prompt tokens are this replica's yet). Then the engine restarts
		// with its cache off: its hits are gone, and a share that grows
		// after the restart must not be credited any of the old ones.
		{"an engine restarted (a series went back) takes no more of its past hits", []step{
			{[]finish{known("a", 1000)}, engine.ServerCounts{Cached: 500, Prompt: 2000, PromptKnown: true}},
			{[]finish{known("a", 2000)}, engine.ServerCounts{Prompt: 500, PromptKnown: true, SeriesBegan: true}},
			{[]finish{known("a", 500)}, engine.ServerCounts{Prompt: 500, PromptKnown: true}},
		}, map[string]float64{"a": 250}, map[string]float64{"a": 250}},
		{"an engine restarted (a new start time) takes no more of its past hits", []step{
			{[]finish{known("a", 1000)}, engine.ServerCounts{Cached: 500, Prompt: 2000, PromptKnown: true}},
			{[]finish{known("a", 2000)}, engine.ServerCounts{Prompt: 500, PromptKnown: true, Restarted: true}},
		}, map[string]float64{"a": 250}, map[string]float64{"a": 250}},
		// Without a prompt counter the share cannot be known: the replica
		// takes every hit of the interval (the documented limitation), but
		// still leaves unknown theoretical tokens off the efficiency.
		{"without a prompt counter, every hit of the interval", []step{
			{[]finish{known("a", 1000), {w: "a", prompt: 1000}}, engine.ServerCounts{Cached: 1000}},
		}, map[string]float64{"a": 1000}, map[string]float64{"a": 500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(prometheus.NewRegistry())
			tr := servedcache.New(c)
			c.SetTarget("srv", "m", "chat", "vllm")
			tr.SetTarget("srv", "vllm", "server_metrics")
			for _, st := range tt.steps {
				for _, f := range st.finished {
					tr.Sent(f.w, "srv", time.Time{}, time.Time{})
					tr.Finished(&replay.Result{
						Response: openai.Response{Outcome: openai.OutcomeSuccess, PromptTokens: f.prompt, PromptKnown: true}, Workload: f.w, Target: "srv",
						TraceInputLength: f.prompt - 10, TheoreticalKnown: f.theoKnown})
				}
				tr.AddServerCounts("srv", st.counts)
			}
			for w, want := range tt.wantCached {
				if got := promtestutil.ToFloat64(c.cachedTokens.WithLabelValues(w, "srv")); math.Abs(got-want) > 1e-9 {
					t.Errorf("workload %s: cached tokens %v, want %v", w, got, want)
				}
			}
			for w, want := range tt.wantReported {
				if got := promtestutil.ToFloat64(c.reportedCached.WithLabelValues(w, "srv")); math.Abs(got-want) > 1e-9 {
					t.Errorf("workload %s: reported cached tokens %v, want %v", w, got, want)
				}
			}
		})
	}
}

// trtllmPage is a TensorRT-LLM /metrics page with the cached-token
// counter of each rank in counts (rank i's value at index i; a negative
// value leaves the rank out), each series written times times.
func trtllmPage(counts []float64, times int) string {
	var b strings.Builder
	b.WriteString("# TYPE trtllm_prompt_cached_tokens_total counter\n")
	for rank, v := range counts {
		for range times {
			if v >= 0 {
				fmt.Fprintf(&b, "trtllm_prompt_cached_tokens_total{model=\"m\",rank=\"%d\"} %g\n", rank, v)
			}
		}
	}
	return b.String()
}

// hitPage is one page after the baseline (two ranks at 1e6): each rank's
// count rises by a quarter of the request's prompt; shown leaves a rank
// out where false, reset starts its count again, dup writes every series
// twice.
type hitPage struct {
	shown, reset [2]bool
	dup          bool
}

// TestServerMetricsObservedHitRate drives a TensorRT-LLM target through
// pages that drop a series, reset one, or repeat one, while the engine
// serves exactly half of every prompt from its cache: the observed hit
// rate must read 0.5 (a missing series read as a restart of the whole
// counter takes it to 133; a duplicated one, summed, to 0.891).
func TestServerMetricsObservedHitRate(t *testing.T) {
	const prompt = 1000 // per request, half of it hits
	tests := []struct {
		name           string
		pages          []hitPage
		wantDuplicates float64
	}{
		{name: "a series missing from one page", pages: []hitPage{{shown: [2]bool{true, true}}, {shown: [2]bool{true, false}}, {shown: [2]bool{true, true}}, {shown: [2]bool{true, true}}}},
		{name: "one rank's counter begins again", pages: []hitPage{{shown: [2]bool{true, true}}, {shown: [2]bool{true, true}, reset: [2]bool{false, true}}, {shown: [2]bool{true, true}}}},
		{name: "a page with every series twice", pages: []hitPage{{shown: [2]bool{true, true}}, {shown: [2]bool{true, true}, dup: true}, {shown: [2]bool{true, true}}}, wantDuplicates: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(prometheus.NewRegistry())
			tr := servedcache.New(c)
			c.SetTarget("srv", "m", "chat", "trtllm")
			tr.SetTarget("srv", "trtllm", "server_metrics")
			var mu sync.Mutex
			page := trtllmPage([]float64{1e6, 1e6}, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprint(w, page)
			}))
			defer srv.Close()
			s := &engine.ServerScraper{Target: "srv", URL: srv.URL, Dialect: "trtllm", Client: srv.Client(), Interval: time.Hour}
			if err := s.Prime(context.Background()); err != nil {
				t.Fatal(err)
			}
			counts := []float64{1e6, 1e6}
			for i, p := range tt.pages {
				tr.Sent("w", "srv", time.Time{}, time.Time{})
				tr.Finished(&replay.Result{Response: openai.Response{Outcome: openai.OutcomeSuccess, PromptTokens: prompt, PromptKnown: true},
					Workload: "w", Target: "srv", TraceInputLength: prompt, TheoreticalKnown: true})
				shown := make([]float64, 2)
				for r := range counts {
					counts[r] += prompt / 4
					if p.reset[r] {
						counts[r] = prompt / 4 // restarted, and served its share since
					}
					shown[r] = -1
					if p.shown[r] {
						shown[r] = counts[r]
					}
				}
				times := 1
				if p.dup {
					times = 2
				}
				mu.Lock()
				page = trtllmPage(shown, times)
				mu.Unlock()
				if err := s.ScrapeOnce(context.Background(), tr); err != nil {
					t.Logf("page %d: %v", i, err)
				}
			}
			cached := promtestutil.ToFloat64(c.reportedCached.WithLabelValues("w", "srv"))
			prompts := promtestutil.ToFloat64(c.reportedPrompt.WithLabelValues("w", "srv"))
			// A refused page's hits are credited with the next page's.
			if rate := cached / prompts; math.Abs(rate-0.5) > 1e-9 {
				t.Errorf("observed hit rate %v (%v of %v), want 0.5", rate, cached, prompts)
			}
			if got := promtestutil.ToFloat64(c.serverErrors.WithLabelValues("srv", "duplicate")); got != tt.wantDuplicates {
				t.Errorf("duplicate errors %v, want %v", got, tt.wantDuplicates)
			}
		})
	}
}

// TestServerScraperCountsErrors: Run's scrape counts what it does not
// credit in kvload_server_metrics_errors_total.
func TestServerScraperCountsErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total NaN\n")
	}))
	defer srv.Close()
	c := New(prometheus.NewRegistry())
	tr := servedcache.New(c)
	s := &engine.ServerScraper{Target: "t", URL: srv.URL, Dialect: "vllm", Client: srv.Client()}
	for range 2 {
		if err := s.ScrapeOnce(context.Background(), tr); err == nil {
			t.Fatal("a NaN counter was credited")
		}
	}
	if got := promtestutil.ToFloat64(c.serverErrors.WithLabelValues("t", "not_finite")); got != 2 {
		t.Errorf("kvload_server_metrics_errors_total{reason=\"not_finite\"} %v, want 2", got)
	}
	c.ForgetTarget("t")
	if n := promtestutil.CollectAndCount(c.serverErrors); n != 0 {
		t.Errorf("%d error series left after the target was forgotten", n)
	}
}

// TestPreambleLeftOutOfEfficiency: on a trace that shares nothing, an
// engine that reports its BOS as cached would read an observed hit rate
// above a theoretical one of 0; once learned, the BOS is on neither side.
// A request that really shares a prefix keeps its hit less the preamble.
func TestPreambleLeftOutOfEfficiency(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	tr := servedcache.New(c)
	c.SetTarget("llama", "m", "completions", "llamacpp")
	tr.SetTarget("llama", "llamacpp", "usage")
	t0 := time.Unix(1_700_000_000, 0)
	finish := func(cached, theoretical int) {
		r := &replay.Result{
			Response: openai.Response{Sent: t0, FirstToken: t0.Add(time.Millisecond), LastToken: t0.Add(time.Second), Outcome: openai.OutcomeSuccess, PromptTokens: 1001, PromptKnown: true, CachedTokens: cached, CachedKnown: true}, Workload: "w", Target: "llama",
			TraceInputLength: 1000, TheoreticalCachedTokens: theoretical, TheoreticalKnown: true}
		c.Start("w", "llama")
		tr.Sent("w", "llama", t0, t0)
		tr.Finished(r)
	}
	// The cache-truth step learns from 8 samples on, over a window of 32.
	const preambleMinSamples, preambleWindow = 8, 32
	// The first unrelated prompt finds an empty slot; the next ones hit the
	// BOS only. From the 8th sample (the 7th BOS hit) on, the lower
	// quartile is 1: the first 6 BOS hits counted, no later one.
	finish(0, 0)
	for range preambleMinSamples {
		finish(1, 0)
	}
	if got := testutil.Gather(t, reg).Sum("kvload_cache_reported_cached_prompt_tokens_total"); got != 6 {
		t.Fatalf("cached while the preamble was learned: %v, want 6", got)
	}
	if got := testutil.Gather(t, reg).Sum("kvload_target_cache_preamble_tokens"); got != 1 {
		t.Fatalf("preamble: %v, want 1", got)
	}
	for range preambleWindow {
		finish(1, 0)
	}
	mid := testutil.Gather(t, reg).Sum("kvload_cache_reported_cached_prompt_tokens_total")
	// A shared prefix of 512 trace tokens: the server reports BOS + 512.
	finish(513, 512)
	if got := testutil.Gather(t, reg).Sum("kvload_cache_reported_cached_prompt_tokens_total") - mid; got != 512 {
		t.Errorf("shared request credited %v cached tokens, want 512", got)
	}
	if mid != 6 {
		t.Errorf("cached after the second loop: %v, want 6", mid)
	}
	// The BOS left out of the last two learning requests, the whole
	// second loop and the shared request.
	wantPrompt := float64((1+preambleMinSamples+preambleWindow+1)*1001 - (2 + preambleWindow + 1))
	if got := testutil.Gather(t, reg).Sum("kvload_cache_reported_prompt_tokens_total"); got != wantPrompt {
		t.Errorf("reported prompt tokens %v, want %v", got, wantPrompt)
	}
}

// BenchmarkObserveRequest is what the collector does for one successful
// request, through the cache-truth step as the daemon does: Sent, then
// Finished.
func BenchmarkObserveRequest(b *testing.B) {
	c := New(prometheus.NewRegistry())
	tr := servedcache.New(c)
	c.SetTarget("sink", "bench", "chat", "openai")
	tr.SetTarget("sink", "openai", "usage")
	c.Start("rate", "sink")
	t0 := time.Now()
	r := &replay.Result{
		Response: openai.Response{Sent: t0, FirstToken: t0.Add(time.Millisecond), LastToken: t0.Add(3 * time.Millisecond), Outcome: openai.OutcomeSuccess,
			HTTPStatus: 200, OutputTokens: 32, OutputFromUsage: true, PromptTokens: 70, PromptKnown: true},
		Workload: "rate", Target: "sink", Scheduled: t0, TraceInputLength: 64, TheoreticalKnown: true,
		TheoreticalByCapacity: replay.CapacityProfile{Known: true},
	}
	b.ReportAllocs()
	for b.Loop() {
		tr.Sent(r.Workload, r.Target, r.Scheduled, r.Sent)
		tr.Finished(r)
	}
}

// TestForgetThenStartCountsAfresh forgets a (workload, target) that had
// requests and starts it again, as a reload that changed it does: its
// requests count from zero on series that /metrics shows.
func TestForgetThenStartCountsAfresh(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	t0 := time.Unix(1_700_000_000, 0)
	r := &replay.Result{
		Response: openai.Response{Sent: t0, FirstToken: t0.Add(time.Millisecond), LastToken: t0.Add(2 * time.Millisecond), Outcome: openai.OutcomeSuccess, HTTPStatus: 200, OutputTokens: 2},
		Workload: "canary", Target: "vllm-a", Scheduled: t0, TraceInputLength: 100,
	}
	c.Start("canary", "vllm-a")
	for range 3 {
		c.Sent(r.Workload, r.Target, r.Scheduled, r.Sent)
		c.Finished(r)
	}
	c.Forget("canary", "vllm-a")
	c.Start("canary", "vllm-a")
	c.Sent(r.Workload, r.Target, r.Scheduled, r.Sent)
	c.Finished(r)
	for _, m := range []struct {
		name string
		got  float64
	}{
		{"requests_total", promtestutil.ToFloat64(c.requests.WithLabelValues("canary", "vllm-a", string(openai.OutcomeSuccess)))},
		{"completion tokens", promtestutil.ToFloat64(c.completionTokens.WithLabelValues("canary", "vllm-a")) / 2},
		{"ttft count", float64(histogramCount(t, reg, "kvload_time_to_first_token_seconds"))},
	} {
		if m.got != 1 {
			t.Errorf("%s after the restart = %v, want 1", m.name, m.got)
		}
	}
}

// histogramCount is the sample count of the one series of histogram name.
func histogramCount(t *testing.T, reg prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no single series of %s", name)
	return 0
}
