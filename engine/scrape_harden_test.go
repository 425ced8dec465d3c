package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

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
