package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

func TestServerScraperDialects(t *testing.T) {
	tests := []struct {
		dialect     string
		body        string
		want        float64
		wantPrompt  float64
		promptKnown bool
	}{
		{"vllm", "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 100\nvllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 28\n" +
			"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 400\nvllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 100\n", 128, 500, true},
		{"vllm hits only", "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 5\n", 5, 0, false},
		{"sglang", "# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total{model_name=\"m\"} 7\n# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name=\"m\"} 70\n", 7, 70, true},
		{"trtllm", "# TYPE trtllm_prompt_cached_tokens_total counter\ntrtllm_prompt_cached_tokens_total 9\n", 9, 0, false},
		// llama-server's prompt_tokens_total leaves the cached tokens out:
		// counts adds them back (TestServerScraperPromptExcludesCached).
		{"llamacpp", "# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total 1234\n# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 766\n", 1234, 766, true},
		{"dynamo", "# TYPE dynamo_frontend_cached_tokens histogram\ndynamo_frontend_cached_tokens_bucket{model=\"m\",le=\"+Inf\"} 3\ndynamo_frontend_cached_tokens_sum{model=\"m\"} 4096\ndynamo_frontend_cached_tokens_count{model=\"m\"} 3\n", 4096, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.dialect, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, tt.body)
			}))
			defer srv.Close()
			dialect, _, _ := strings.Cut(tt.dialect, " ")
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: Dialect(dialect), Client: srv.Client()}
			got, err := s.read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got.cached.sum() != tt.want || got.prompt.sum() != tt.wantPrompt || (got.prompt != nil) != tt.promptKnown {
				t.Errorf("cached %v, prompt %v (known %v); want %v, %v (%v)", got.cached.sum(), got.prompt.sum(), got.prompt != nil, tt.want, tt.wantPrompt, tt.promptKnown)
			}
		})
	}
}

func TestServerScraperMissingMetric(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE up gauge\nup 1\n")
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: "vllm", Client: srv.Client()}
	if _, err := s.read(context.Background()); err == nil || !strings.Contains(err.Error(), "vllm:prefix_cache_hits_total") {
		t.Fatalf("err = %v", err)
	}
}

func TestServerScraperDelta(t *testing.T) {
	s := &ServerScraper{}
	for i, step := range []struct {
		value, start, want float64
		refused            ServerMetricsErrorReason
	}{
		{1000, 10, 0, ""}, // baseline: what the server counted before we started is not ours
		{1500, 10, 500, ""},
		{1500, 10, 0, ""},
		{200, 10, 0, ServerErrorBackwards}, // a decrease with the same start time: no restart explains it
		{260, 10, 60, ""},                  // counted on from the value refused
		{900, 99, 900, ""},                 // restart seen by the start time, the new count already past the old
		{950, 99, 50, ""},
		{960, 0, 10, ""},  // a server without a start time
		{100, 0, 100, ""}, // then only a decrease tells: the counter began again
	} {
		got, err := s.counts(engineRead{cached: seriesValues{"": step.value}, start: step.start})
		var reason ServerMetricsErrorReason
		if bad := (*RejectedCount)(nil); errors.As(err, &bad) {
			reason = bad.Reason
		} else if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got.Cached != step.want || reason != step.refused {
			t.Errorf("step %d: counts(%v, start %v) = %v, refused %q, want %v, refused %q", i, step.value, step.start, got.Cached, reason, step.want, step.refused)
		}
	}
}

// TestServerScraperRejectsImplausiblePrompt: the prompt-token counter is
// held to the cached one's rules. A NaN, +Inf, 1e300, negative, jumping
// or (with the start time unchanged) decreasing prompt count refuses the
// read, by reason, and poisons nothing: the next sane read counts from
// the last good baseline (from the value read, after a decrease).
func TestServerScraperRejectsImplausiblePrompt(t *testing.T) {
	tests := []struct {
		name   string
		prompt string // the second read's; the first is 1000, the third 1300
		reason ServerMetricsErrorReason
		next   float64 // the third read's prompt increase
	}{
		{"NaN", "NaN", ServerErrorNotFinite, 300},
		{"+Inf", "+Inf", ServerErrorNotFinite, 300},
		{"1e300", "1e300", ServerErrorTooLarge, 300},
		{"negative", "-1", ServerErrorNegative, 300},
		{"jump by 2^41", "2199023256552", ServerErrorJump, 300},
		{"backwards", "400", ServerErrorBackwards, 900},
		{"sane", "1100", "", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page := func(prompt string) string {
				return "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 100\n" +
					"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total " + prompt + "\n" +
					"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 10\n"
			}
			pages := []string{page("1000"), page(tt.prompt), page("1300")}
			var mu sync.Mutex
			next := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				p := pages[next]
				next++
				mu.Unlock()
				fmt.Fprint(w, p)
			}))
			defer srv.Close()
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: "vllm", Client: srv.Client()}
			var prompts []float64
			var reasons []ServerMetricsErrorReason
			for range pages {
				r, err := s.read(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				c, err := s.counts(r)
				if bad := (*RejectedCount)(nil); errors.As(err, &bad) {
					reasons = append(reasons, bad.Reason)
					if bad.Counter != PromptCounter {
						t.Errorf("refused as the %s counter, want %s", bad.Counter, PromptCounter)
					}
					continue
				}
				prompts = append(prompts, c.Prompt)
			}
			switch {
			case tt.reason == "" && len(reasons) != 0:
				t.Errorf("refused %v, want none", reasons)
			case tt.reason != "" && (len(reasons) != 1 || reasons[0] != tt.reason):
				t.Errorf("refused %v, want one %s", reasons, tt.reason)
			}
			for _, p := range prompts {
				if math.IsNaN(p) || math.IsInf(p, 0) || p > 1<<53 {
					t.Fatalf("a read handed on with prompt %v", p)
				}
			}
			if last := prompts[len(prompts)-1]; last != tt.next {
				t.Errorf("the last read's prompt increase %v, want %v", last, tt.next)
			}
		})
	}
}

// TestServerScraperPromptExcludesCached: an engine whose prompt counter
// leaves the cached tokens out (llama.cpp) gets them added back to its
// prompt increase.
func TestServerScraperPromptExcludesCached(t *testing.T) {
	s := &ServerScraper{Dialect: DialectLlamaCpp}
	for i, step := range []struct{ cached, prompt, wantPrompt float64 }{
		{1234, 766, 0},
		{1300, 800, 100},
	} {
		got, err := s.counts(engineRead{cached: seriesValues{"": step.cached}, prompt: seriesValues{"": step.prompt}})
		if err != nil || got.Prompt != step.wantPrompt || !got.PromptKnown {
			t.Errorf("step %d: prompt %v (known %v), %v; want %v", i, got.Prompt, got.PromptKnown, err, step.wantPrompt)
		}
	}
}

// TestServerScraperBaselineFlag: only the first read a scraper makes is
// its baseline, whether it was Prime's or Run's; a rejected first read
// leaves the next one the baseline.
func TestServerScraperBaselineFlag(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		want   []bool // Baseline of each read that was not rejected
	}{
		{"first read", []float64{100, 150, 170}, []bool{true, false, false}},
		{"a rejected first read", []float64{-1, 100, 150}, []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
			var got []bool
			for _, v := range tt.values {
				c, err := s.counts(engineRead{cached: seriesValues{"": v}, prompt: seriesValues{"": 10 * v}})
				if err == nil {
					got = append(got, c.Baseline)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Baseline of each read = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCountsPromptTokens(t *testing.T) {
	got := CountingPromptTokens()
	want := []Dialect{DialectVLLM, DialectSGLang, DialectLlamaCpp}
	if !slices.Equal(got, want) {
		t.Errorf("CountingPromptTokens() = %v, want %v", got, want)
	}
}

// countsSink keeps what a scraper hands it.
type countsSink struct{ got []ServerCounts }

func (c *countsSink) AddServerCounts(_ string, d ServerCounts)                { c.got = append(c.got, d) }
func (c *countsSink) ServerMetricsError(_ string, _ ServerMetricsErrorReason) {}

// TestServerScraperReadTime: a read says when it was asked for, so that
// what happened while the page was on its way counts at the next.
func TestServerScraperReadTime(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "vllm:prefix_cache_hits_total 5\nvllm:prefix_cache_queries_total 50\n")
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: DialectVLLM, Client: srv.Client()}
	var sink countsSink
	for range 2 {
		before := time.Now()
		if err := s.ScrapeOnce(context.Background(), &sink); err != nil {
			t.Fatal(err)
		}
		if at := sink.got[len(sink.got)-1].At; at.Before(before) || at.After(time.Now()) {
			t.Errorf("read at %v, want between %v and now", at, before)
		}
	}
	if !sink.got[0].Baseline || sink.got[1].Baseline {
		t.Errorf("baselines %v, %v; want only the first", sink.got[0].Baseline, sink.got[1].Baseline)
	}
}

// TestServerScraperRestartedFlag: a read says when it found the engine
// restarted (a new process start time), never on the first read.
func TestServerScraperRestartedFlag(t *testing.T) {
	s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
	var got []bool
	for _, start := range []float64{10, 10, 99, 99, 0} {
		c, err := s.counts(engineRead{cached: seriesValues{"": 5}, prompt: seriesValues{"": 50}, start: start})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.Restarted)
	}
	if want := []bool{false, false, true, false, false}; !slices.Equal(got, want) {
		t.Errorf("Restarted of each read = %v, want %v", got, want)
	}
}

// TestServerScraperSeriesBeganFlag: an engine without a start time that
// restarts shows it only by counters that went back; the read says so.
func TestServerScraperSeriesBeganFlag(t *testing.T) {
	s := &ServerScraper{Target: "t", Dialect: DialectLlamaCpp}
	var got []bool
	for _, cached := range []float64{5, 7, 3, 4, 4} {
		c, err := s.counts(engineRead{cached: seriesValues{"": cached}, prompt: seriesValues{"": 10 * cached}})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.SeriesBegan)
	}
	if want := []bool{false, false, true, false, false}; !slices.Equal(got, want) {
		t.Errorf("SeriesBegan of each read = %v, want %v", got, want)
	}
}

// sink records what a scraper hands the collector.
type sink struct {
	mu     sync.Mutex
	errs   map[ServerMetricsErrorReason]int
	cached float64 // credited in all
	adds   int
}

func (s *sink) AddServerCounts(_ string, c ServerCounts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cached += c.Cached
	s.adds++
}

func (s *sink) ServerMetricsError(_ string, reason ServerMetricsErrorReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.errs == nil {
		s.errs = map[ServerMetricsErrorReason]int{}
	}
	s.errs[reason]++
}

func (s *sink) state() (errs map[ServerMetricsErrorReason]int, cached float64, adds int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs = map[ServerMetricsErrorReason]int{}
	for k, v := range s.errs {
		errs[k] = v
	}
	return errs, s.cached, s.adds
}

func vllmHits(v int64) string {
	return fmt.Sprintf("# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total %d\n", v)
}

// TestServerScrapeDeadline: a target whose /metrics hangs before its
// head, or drips its page a byte at a time, costs one counted timeout per
// scrape and is logged; the scrapes go on meanwhile, and when it answers
// again they credit what it counted. (Without a deadline the scraper
// waited on the first hung scrape for good, counting nothing.)
func TestServerScrapeDeadline(t *testing.T) {
	var mode atomic.Value
	mode.Store("ok")
	var value atomic.Int64
	value.Store(100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "hang":
			<-r.Context().Done()
			return
		case "drip":
			// A valid page, a comment byte at a time, without end.
			// The pace is the stimulus, far inside every timeout, so
			// that only a deadline on the whole scrape cuts it. A
			// loaded machine only spaces the bytes more: the scrape
			// still times out, and that it is counted as a timeout is
			// all that is judged.
			rc := http.NewResponseController(w)
			for r.Context().Err() == nil {
				w.Write([]byte("#"))
				if rc.Flush() != nil {
					return
				}
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Millisecond):
				}
			}
			return
		}
		fmt.Fprint(w, vllmHits(value.Load()))
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: DialectVLLM, Client: srv.Client(),
		Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond, HeaderTimeout: 100 * time.Millisecond}
	var sk sink
	var logged atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx, &sk, func(error) { logged.Add(1) })
	}()
	defer func() { cancel(); <-done }()

	testutil.Eventually(t, "the baseline and a first scrape", func() (bool, string) {
		_, _, adds := sk.state()
		return adds >= 2, fmt.Sprintf("%d scrapes credited", adds)
	})
	for _, m := range []string{"hang", "drip"} {
		before, _, _ := sk.state()
		mode.Store(m)
		testutil.Eventually(t, "three timed-out scrapes of a target that does "+m, func() (bool, string) {
			errs, _, _ := sk.state()
			return errs[ServerErrorTimeout] >= before[ServerErrorTimeout]+3, fmt.Sprintf("errors %v", errs)
		})
	}
	value.Store(160)
	mode.Store("ok")
	testutil.Eventually(t, "scrapes resume after the target recovers", func() (bool, string) {
		_, cached, _ := sk.state()
		return cached == 60, fmt.Sprintf("%v credited, want 60", cached)
	})
	errs, _, _ := sk.state()
	if n := logged.Load(); n < int64(errs[ServerErrorTimeout]) {
		t.Errorf("%d failed scrapes logged, %d timeouts counted", n, errs[ServerErrorTimeout])
	}
	if len(errs) != 1 {
		t.Errorf("errors %v: only timeouts expected", errs)
	}
}

// TestServerScrapeHeaderTimeout: an answer whose head does not come within
// HeaderTimeout fails the scrape as a timeout, whatever the overall bound.
func TestServerScrapeHeaderTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: DialectVLLM, Client: srv.Client(), HeaderTimeout: 50 * time.Millisecond}
	var sk sink
	err := s.ScrapeOnce(context.Background(), &sk)
	if err == nil || !strings.Contains(err.Error(), "no answer head") {
		t.Fatalf("err = %v, want no answer head", err)
	}
	if errs, _, _ := sk.state(); errs[ServerErrorTimeout] != 1 {
		t.Errorf("errors %v, want one timeout", errs)
	}
}

// TestServerScraperCancelledNotCounted: a scrape cut short because its
// scraper stopped counts no error: the target may be gone, its series
// deleted, and a count would bring one back.
func TestServerScraperCancelledNotCounted(t *testing.T) {
	inFlight := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inFlight)
		<-r.Context().Done()
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: DialectVLLM, Client: srv.Client(), Timeout: time.Hour}
	var sk sink
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-inFlight
		cancel()
	}()
	if err := s.ScrapeOnce(ctx, &sk); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if errs, _, _ := sk.state(); len(errs) != 0 {
		t.Errorf("errors %v counted for a cancelled scrape", errs)
	}
}

// TestServerScraperClosesConnections: a scraper that stops closes its
// kept-alive connection to the target. (Otherwise every reload leaves one
// per changed target, and two goroutines, open for minutes.)
func TestServerScraperClosesConnections(t *testing.T) {
	var open atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, vllmHits(1))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	defer srv.Close()
	// A transport of its own that never closes an idle connection by
	// itself, as the daemon's (five idle minutes) within a test.
	client := &http.Client{Transport: &http.Transport{}}
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: DialectVLLM, Client: client, Interval: 10 * time.Millisecond}
	var sk sink
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx, &sk, func(error) {})
	}()
	testutil.Eventually(t, "scrapes on a kept-alive connection", func() (bool, string) {
		_, _, adds := sk.state()
		return adds >= 3 && open.Load() == 1, fmt.Sprintf("%d scrapes, %d connections open", adds, open.Load())
	})
	cancel()
	<-done
	testutil.Eventually(t, "the connection closed after the scraper stopped", func() (bool, string) {
		return open.Load() == 0, fmt.Sprintf("%d connections open", open.Load())
	})
}

// TestServerScraperDuplicateSeries: a page holding one series of the
// counter twice is refused and counted as duplicate, not summed; the
// baseline stays. (Summed, the two took the observed hit rate to 0.891
// where the truth was 0.5.)
func TestServerScraperDuplicateSeries(t *testing.T) {
	pages := []string{
		"trtllm_prompt_cached_tokens_total{model=\"m\",rank=\"0\"} 100\n",
		// The same label set twice, in another order the second time.
		"trtllm_prompt_cached_tokens_total{model=\"m\",rank=\"0\"} 150\ntrtllm_prompt_cached_tokens_total{rank=\"0\",model=\"m\"} 150\n",
		"trtllm_prompt_cached_tokens_total{model=\"m\",rank=\"0\"} 170\n",
	}
	var next atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, pages[next.Add(1)-1])
	}))
	defer srv.Close()
	s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: DialectTRTLLM, Client: srv.Client()}
	var sk sink
	for range pages {
		_ = s.ScrapeOnce(context.Background(), &sk)
	}
	errs, cached, _ := sk.state()
	if errs[ServerErrorDuplicate] != 1 || len(errs) != 1 {
		t.Errorf("errors %v, want one duplicate", errs)
	}
	if cached != 70 {
		t.Errorf("credited %v, want 70 (170 - 100, the duplicated page refused)", cached)
	}
}

// TestServerScraperSeriesResets: each series of the counter counts on its
// own. (Counted as one, a series missing from one page reads as a restart
// of the whole counter, and its return as new hits: TensorRT-LLM's
// observed hit rate read 133 where the truth was 0.5.)
func TestServerScraperSeriesResets(t *testing.T) {
	type read struct {
		a, b  float64 // -1: the series is missing
		start float64
		want  float64
	}
	tests := []struct {
		name  string
		reads []read
	}{
		{"a series missing, then back", []read{
			{1e6, 1e6, 0, 0}, {1e6 + 50, 1e6 + 50, 0, 100},
			{1e6 + 100, -1, 0, 50},         // b's hits wait for its return
			{1e6 + 150, 1e6 + 150, 0, 150}, // b credits what it gained while missing
		}},
		{"a decrease is that series' reset only", []read{
			{1000, 5000, 0, 0},
			{30, 5100, 0, 130}, // a began again; b went on
			{50, 5200, 0, 120},
		}},
		{"a series not seen before is its own baseline", []read{
			{1000, -1, 0, 0},
			{1100, 7000, 0, 100},
			{1200, 7050, 0, 150},
		}},
		{"a new process start time: every series began again", []read{
			{1000, 2000, 10, 0},
			{1500, 2500, 99, 4000}, // already past the old counts
			{1600, -1, 99, 100},
			{1700, 2600, 99, 200},
		}},
		{"a series forgotten after a long absence credits nothing on its return", append(append([]read{{100, 100, 0, 0}},
			repeat(read{100, -1, 0, 0}, maxMissedReads+1)...), read{100, 5000, 0, 0}, read{100, 5010, 0, 10})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &ServerScraper{Dialect: DialectTRTLLM}
			for i, r := range tt.reads {
				v := seriesValues{}
				for key, x := range map[string]float64{"rank\xff0": r.a, "rank\xff1": r.b} {
					if x >= 0 {
						v[key] = x
					}
				}
				got, err := s.counts(engineRead{cached: v, start: r.start})
				if err != nil || got.Cached != r.want {
					t.Errorf("read %d (%v): credited %v, %v; want %v", i, r, got.Cached, err, r.want)
				}
			}
		})
	}
}

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestServerScraperRefusesOversizePages: a page over 32 MiB is an error,
// never a parse of its first 32 MiB; neither is one whose counter's series
// take more than maxFamilyBytes.
func TestServerScraperRefusesOversizePages(t *testing.T) {
	counter := vllmHits(5)
	line := "# padding line of a page too long to be read\n"
	filler := strings.Repeat(line, (maxMetricsBytes-len(counter))/len(line)+1)
	flood := new(strings.Builder)
	for i := 0; flood.Len() <= maxFamilyBytes; i++ {
		fmt.Fprintf(flood, "vllm:prefix_cache_hits_total{i=\"%d\"} 1\n", i)
	}
	for _, tt := range []struct {
		name, page string
		err        error
	}{
		{"over 32 MiB", counter + filler, errPageTooLarge},
		{"a flood of series", flood.String(), errFamiliesTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, tt.page)
			}))
			defer srv.Close()
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: DialectVLLM, Client: srv.Client()}
			var sk sink
			if err := s.ScrapeOnce(context.Background(), &sk); !errors.Is(err, tt.err) {
				t.Errorf("err = %v, want %v", err, tt.err)
			}
			if errs, _, adds := sk.state(); errs[ServerErrorScrape] != 1 || adds != 0 {
				t.Errorf("errors %v, %d credits; want one scrape error", errs, adds)
			}
		})
	}
}

// TestServerScraperRejectsImplausible: a scraped cached-token counter that
// is NaN, ±Inf, negative, above 2^53 or that jumped by more than 2^40 in one
// scrape is not credited: the scrape fails with a *RejectedCount naming
// the reason, kvload_server_metrics_errors_total counts it, and the
// baseline stays where it was, so the next sane value is credited from
// there. (Credited, one such answer would ruin every rate.)
func TestServerScraperRejectsImplausible(t *testing.T) {
	tests := []struct {
		name   string
		values []string // served in turn; the first is the baseline
		want   []any    // per scrape after the baseline: the credit (float64) or the rejection's reason (string)
	}{
		{"sane", []string{"100", "150", "150"}, []any{50.0, 0.0}},
		{"NaN", []string{"100", "NaN", "130"}, []any{"not_finite", 30.0}},
		{"+Inf", []string{"100", "+Inf", "130"}, []any{"not_finite", 30.0}},
		{"-Inf", []string{"100", "-Inf", "130"}, []any{"not_finite", 30.0}},
		{"negative", []string{"100", "-5", "130"}, []any{"negative", 30.0}},
		{"above 2^53", []string{"100", "1e18", "130"}, []any{"too_large", 30.0}},
		{"jump by 2^41", []string{"100", "2199023255652", "130"}, []any{"jump", 30.0}},
		{"jump by exactly 2^40: accepted", []string{"100", "1099511627876"}, []any{1099511627776.0}},
		{"restart: a decrease credits the new count", []string{"100", "40"}, []any{40.0}},
		{"unreadable", []string{"100", "garbage {", "130"}, []any{"scrape", 30.0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			next := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				v := tt.values[next]
				next++
				mu.Unlock()
				fmt.Fprintf(w, "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total %s\n", v)
			}))
			defer srv.Close()
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: "vllm", Client: srv.Client()}
			if err := s.Prime(context.Background()); err != nil {
				t.Fatalf("baseline: %v", err)
			}
			for i, want := range tt.want {
				before := maps.Clone(s.cached)
				r, err := s.read(context.Background())
				var credit float64
				if err == nil {
					var counts ServerCounts
					counts, err = s.counts(r)
					credit = counts.Cached
				}
				// As Run would: a failed read is a scrape error.
				reason := ServerErrorScrape
				if bad := (*RejectedCount)(nil); errors.As(err, &bad) {
					reason = bad.Reason
					if bad.Target != "t" {
						t.Errorf("scrape %d: the rejection names target %q", i, bad.Target)
					}
				}
				switch w := want.(type) {
				case float64:
					if err != nil || credit != w {
						t.Errorf("scrape %d (%s): credit %v, %v; want %v", i, tt.values[i+1], credit, err, w)
					}
				case string:
					if err == nil || string(reason) != w {
						t.Errorf("scrape %d (%s): credit %v, err %v; want rejected as %s", i, tt.values[i+1], credit, err, w)
					}
					if !maps.Equal(s.cached, before) {
						t.Errorf("scrape %d (%s): the baseline moved from %v to %v", i, tt.values[i+1], before, s.cached)
					}
				}
			}
		})
	}
}

// counterPage writes a text-format page of the counters given, each
// "family{labels} value" line under its family's TYPE line.
func counterPage(lines ...string) string {
	var b strings.Builder
	typed := map[string]bool{}
	for _, line := range lines {
		family, _, _ := strings.Cut(line, "{")
		family, _, _ = strings.Cut(family, " ")
		if !typed[family] {
			fmt.Fprintf(&b, "# TYPE %s counter\n", family)
			typed[family] = true
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// scaled is the page of lines with every value multiplied by k: the
// counters' second read.
func scaled(t *testing.T, k float64, lines []string) []string {
	out := make([]string, len(lines))
	for i, line := range lines {
		head, v, _ := strings.Cut(line, " ")
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Errorf("line %q: %v", line, err)
		}
		out[i] = fmt.Sprintf("%s %g", head, k*x)
	}
	return out
}

// TestCachedCounterOrder: each engine's cached-token counter is read from
// the cleanest counter its page holds, and only where it lacks that one
// from the next. Each case's page is read twice, the second time with
// every counter doubled, so that the increase credited is the first
// read's values of the counter read.
func TestCachedCounterOrder(t *testing.T) {
	const (
		cached       = `vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 100`
		local        = `vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 110`
		localCompute = `vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 890`
		external     = `vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 0`
		recomputed   = `vllm:prompt_tokens_recomputed_total{engine="0",model_name="m"} 10`
		hits         = `vllm:prefix_cache_hits_total{engine="0",model_name="m"} 150`
		queries      = `vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000`
		// Fewer than the queries: a preempted request looked up again.
		prompt = `vllm:prompt_tokens_total{engine="0",model_name="m"} 900`
	)
	tests := []struct {
		name    string
		dialect Dialect
		page    []string
		// The counter read, the cached tokens credited, and the
		// recomputed tokens where the engine counts them; the prompt
		// tokens read with them (0: none).
		read                 string
		want, wantRecomputed float64
		recomputedKnown      bool
		wantPrompt           float64
	}{
		// vLLM since PR 33290, until PR 38709: every counter, hits 1.5
		// times the truth as issue 25780 makes them.
		{"vllm, every counter", DialectVLLM, []string{cached, local, localCompute, external, recomputed, hits, queries, prompt},
			"vllm:prompt_tokens_cached_total", 100, 10, true, 900},
		// vLLM since PR 38709: no recomputed counter, local_cache_hit
		// without them.
		{"vllm, no recomputed counter", DialectVLLM, []string{`vllm:prompt_tokens_cached_total 100`, `vllm:prompt_tokens_by_source_total{source="local_cache_hit"} 100`, hits, queries, prompt},
			"vllm:prompt_tokens_cached_total", 100, 0, false, 900},
		// A page without prompt_tokens_cached: local_cache_hit, less
		// the recomputed tokens it counts.
		{"vllm, by source", DialectVLLM, []string{local, localCompute, external, recomputed, hits, queries, prompt},
			`vllm:prompt_tokens_by_source_total{source="local_cache_hit"}`, 100, 10, true, 900},
		{"vllm, by source without recomputed", DialectVLLM, []string{local, localCompute, hits, prompt},
			`vllm:prompt_tokens_by_source_total{source="local_cache_hit"}`, 110, 0, false, 900},
		// The family without the local_cache_hit series says nothing of
		// the cache: the next counter is read.
		{"vllm, by source without its local series", DialectVLLM, []string{localCompute, external, hits, queries, prompt},
			"vllm:prefix_cache_hits_total", 150, 0, false, 1000},
		// prefix_cache_hits with the queries counted with it.
		{"vllm before PR 33290", DialectVLLM, []string{hits, queries, prompt}, "vllm:prefix_cache_hits_total", 150, 0, false, 1000},
		{"vllm, hits without _total", DialectVLLM, []string{`vllm:prefix_cache_hits 70`}, "vllm:prefix_cache_hits", 70, 0, false, 0},
		{"vllm, gpu_prefix_cache_hits", DialectVLLM, []string{`vllm:gpu_prefix_cache_hits_total 60`, `vllm:prompt_tokens_total 600`}, "vllm:gpu_prefix_cache_hits_total", 60, 0, false, 600},
		// SGLang with HiCache splits its count by cache_source: every
		// source is a cached token its usage counts.
		{"sglang by cache source", DialectSGLang, []string{`sglang:cached_tokens_total{cache_source="device",model_name="m"} 40`, `sglang:cached_tokens_total{cache_source="host",model_name="m"} 2`, `sglang:prompt_tokens_total{model_name="m"} 100`},
			"sglang:cached_tokens_total", 42, 0, false, 100},
		{"sglang", DialectSGLang, []string{`sglang:cached_tokens_total{model_name="m"} 7`}, "sglang:cached_tokens_total", 7, 0, false, 0},
		{"sglang, older name", DialectSGLang, []string{`sglang:cached_tokens{model_name="m"} 8`}, "sglang:cached_tokens", 8, 0, false, 0},
		{"trtllm", DialectTRTLLM, []string{`trtllm_prompt_cached_tokens_total 9`, `trtllm_prompt_cache_hit_tokens_total 90`}, "trtllm_prompt_cached_tokens_total", 9, 0, false, 0},
		{"trtllm, other name", DialectTRTLLM, []string{`trtllm_prompt_cache_hit_tokens_total 90`}, "trtllm_prompt_cache_hit_tokens_total", 90, 0, false, 0},
		{"llamacpp", DialectLlamaCpp, []string{`llamacpp:prompt_tokens_cached_total 12`, `llamacpp:prompt_tokens_total 88`}, "llamacpp:prompt_tokens_cached_total", 12, 0, false, 100},
		{"llamacpp, without _total", DialectLlamaCpp, []string{`llamacpp:prompt_tokens_cached 13`}, "llamacpp:prompt_tokens_cached", 13, 0, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var reads atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				page := tt.page
				if reads.Add(1) > 1 {
					page = scaled(t, 2, page)
				}
				fmt.Fprint(w, counterPage(page...))
			}))
			defer srv.Close()
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: tt.dialect, Client: srv.Client()}
			var sk countsSink
			for range 2 {
				if err := s.ScrapeOnce(context.Background(), &sk); err != nil {
					t.Fatal(err)
				}
			}
			r, err := s.read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := r.cachedFrom.String(); got != tt.read {
				t.Errorf("read %s, want %s", got, tt.read)
			}
			got := sk.got[1]
			if got.Cached != tt.want || got.Recomputed != tt.wantRecomputed || got.RecomputedKnown != tt.recomputedKnown {
				t.Errorf("credited %v cached, %v recomputed (known %v); want %v, %v (%v)",
					got.Cached, got.Recomputed, got.RecomputedKnown, tt.want, tt.wantRecomputed, tt.recomputedKnown)
			}
			if got.Prompt != tt.wantPrompt || got.PromptKnown != (tt.wantPrompt != 0) {
				t.Errorf("prompt %v (known %v), want %v", got.Prompt, got.PromptKnown, tt.wantPrompt)
			}
		})
	}
}

// TestCachedCounterSwitch: a page that stops holding the counter read
// and holds another (an engine upgraded behind a proxy that kept its
// process start time) credits nothing at the switch, never one counter's
// value less another's, and goes on from there.
func TestCachedCounterSwitch(t *testing.T) {
	s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
	hits, cached := Series{Family: "vllm:prefix_cache_hits_total"}, Series{Family: vllmPromptTokensCached}
	key := func(c Series) string { return c.Family + "\xfd" }
	for i, step := range []struct {
		from  Series
		value float64
		want  float64
	}{
		{hits, 1000, 0},
		{hits, 1500, 500},
		{cached, 200, 0},
		{cached, 260, 60},
	} {
		got, err := s.counts(engineRead{cached: seriesValues{key(step.from): step.value}, cachedFrom: step.from, start: 1})
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if got.Cached != step.want {
			t.Errorf("read %d (%s %v): credited %v, want %v", i, step.from, step.value, got.Cached, step.want)
		}
	}
}

// TestRecomputedCounterHeldToTheRules: a recomputed-token counter that
// goes back with no restart refuses the read, as the other counters do.
func TestRecomputedCounterHeldToTheRules(t *testing.T) {
	s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
	read := func(recomputed float64) error {
		_, err := s.counts(engineRead{cached: seriesValues{"c": 100}, recomputed: seriesValues{"r": recomputed}, start: 1})
		return err
	}
	if err := read(10); err != nil {
		t.Fatal(err)
	}
	err := read(5)
	if bad := (*RejectedCount)(nil); !errors.As(err, &bad) || bad.Counter != RecomputedCounter || bad.Reason != ServerErrorBackwards {
		t.Errorf("a recomputed counter gone back: %v, want refused as backwards", err)
	}
}
