package testutil

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	msg := FatalMessage(t, func(tb testing.TB) {
		Eventually(tb, "third call", func() (bool, string) { return calls.Add(1) == 3, "" })
	})
	if msg != "" || calls.Load() != 3 {
		t.Errorf("failed %q after %d calls, want no failure after 3", msg, calls.Load())
	}
}

func TestEventuallyFailsWithTheLastDetail(t *testing.T) {
	var calls int
	msg := FatalMessage(t, func(tb testing.TB) {
		EventuallyWithin(tb, "never", 50*time.Millisecond, func() (bool, string) {
			calls++
			return false, fmt.Sprint("call ", calls)
		})
	})
	if want := fmt.Sprintf("never: not reached; last seen: call %d", calls); msg != want || calls < 2 {
		t.Errorf("failed with %q after %d calls, want %q", msg, calls, want)
	}
}

// TestDeadlineIsTheTestsWhenEarlier: a wait ends before the test binary's
// deadline rather than at the ceiling.
func TestDeadlineIsTheTestsWhenEarlier(t *testing.T) {
	soon := time.Now().Add(reportGrace + time.Second)
	if got := deadline(fixedDeadline{t, soon}, time.Hour); !got.Equal(soon.Add(-reportGrace)) {
		t.Errorf("deadline %v, want %v", got, soon.Add(-reportGrace))
	}
	if got := deadline(fixedDeadline{t, time.Now().Add(24 * time.Hour)}, time.Minute); time.Until(got) > time.Minute {
		t.Errorf("deadline %v from now, want the ceiling of a minute", time.Until(got))
	}
}

type fixedDeadline struct {
	testing.TB
	at time.Time
}

func (f fixedDeadline) Deadline() (time.Time, bool) { return f.at, true }

func TestWait(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Wait(t, "a value", ch); got != 7 {
		t.Errorf("Wait: %d, want 7", got)
	}
	closed := make(chan struct{})
	close(closed)
	Wait(t, "closed", closed)
	never := make(chan struct{})
	if msg := FatalMessage(t, func(tb testing.TB) {
		Wait(fixedDeadline{tb, time.Now().Add(reportGrace)}, "the event", never)
	}); msg != "the event: did not happen" {
		t.Errorf("failed with %q", msg)
	}
	var log Buffer
	_, _ = log.Write([]byte("the log")) // a Buffer never fails
	if msg := FatalMessage(t, func(tb testing.TB) {
		WaitShowing(fixedDeadline{tb, time.Now().Add(reportGrace)}, "the event", never, &log)
	}); msg != "the event: did not happen:\nthe log" {
		t.Errorf("failed with %q", msg)
	}
}

func TestFamiliesValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reqs_total", Help: "h"}, []string{"w", "outcome"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lat_seconds", Help: "h"}, []string{"w"})
	reg.MustRegister(c, h)
	c.WithLabelValues("a", "ok").Add(3)
	c.WithLabelValues("a", "err").Add(1)
	c.WithLabelValues("b", "ok").Add(5)
	h.WithLabelValues("a").Observe(1)
	h.WithLabelValues("a").Observe(2)

	srv := httptestServer(t, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	for name, mfs := range map[string]Families{"gathered": Gather(t, reg), "scraped": Scrape(t, srv)} {
		for _, tt := range []struct {
			name  string
			pairs []string
			sum   float64
			n     int
		}{
			{"reqs_total", nil, 9, 3},
			{"reqs_total", []string{"w", "a"}, 4, 2},
			{"reqs_total", []string{"w", "a", "outcome", "ok"}, 3, 1},
			{"reqs_total", []string{"w", "c"}, 0, 0},
			{"reqs_total", []string{"nolabel", "x"}, 0, 0},
			{"lat_seconds", []string{"w", "a"}, 2, 1},
			{"absent", nil, 0, 0},
		} {
			if sum, n := mfs.Value(tt.name, tt.pairs...); sum != tt.sum || n != tt.n {
				t.Errorf("%s: Value(%s, %v) = %v in %d series, want %v in %d", name, tt.name, tt.pairs, sum, n, tt.sum, tt.n)
			}
		}
		if got := mfs.SeriesWith("w", "b"); len(got) != 1 || !strings.HasPrefix(got[0], "reqs_total") {
			t.Errorf("%s: SeriesWith(w, b) = %v", name, got)
		}
	}
	if _, err := TryScrape("http://127.0.0.1:1"); err == nil {
		t.Error("TryScrape of a closed port: no error")
	}
}

// TestFakeServerStream: a streamed request gets its tokens and usage, a
// request that does not ask for a stream is refused, and the counts say
// what arrived.
func TestFakeServerStream(t *testing.T) {
	f := NewFakeServer(t, func(f *FakeServer) {
		f.Usage = func(n int) Usage { return Usage{Prompt: 7, Completion: n, Cached: 3} }
		f.Metrics = VLLMMetrics
	})
	req, _ := http.NewRequest(http.MethodPost, f.URL+"/v1/chat/completions", strings.NewReader(`{"stream": true, "max_tokens": 2}`))
	req.Header.Set("Authorization", "Bearer x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			events = append(events, line)
		}
	}
	resp.Body.Close()
	if len(events) != 5 || !strings.Contains(events[0], `"role":"assistant"`) || strings.Count(strings.Join(events, ""), `" tok"`) != 2 ||
		!strings.Contains(events[3], `"prompt_tokens":7`) || !strings.Contains(events[3], `"cached_tokens":3`) || events[4] != "data: [DONE]" {
		t.Errorf("stream:\n%s", strings.Join(events, "\n"))
	}
	resp, err = http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"max_tokens": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a request without stream: %s, want 400", resp.Status)
	}
	if mfs := Scrape(t, f.URL); mfs.Sum("vllm:prefix_cache_hits_total") != 0 || len(mfs) != 1 {
		t.Errorf("/metrics: %v", mfs)
	}
	if f.Requests() != 1 || f.Count("/v1/chat/completions") != 1 || f.Count("/metrics") != 1 || f.Auth("Bearer x") != 1 {
		t.Errorf("requests %d, by path %v, auth %v", f.Requests(), f.byPath, f.auth)
	}
}

// TestFakeServerRelease: a held request is answered once released, and one
// whose client goes away is counted as ended.
func TestFakeServerRelease(t *testing.T) {
	f := NewFakeServer(t, func(f *FakeServer) { f.Release = make(chan struct{}) })
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/chat/completions", strings.NewReader(`{"stream": true, "max_tokens": 1}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	Eventually(t, "the request held", func() (bool, string) { return f.Requests() == 1, fmt.Sprint(f.Requests()) })
	cancel()
	if err := Wait(t, "the client gone", gone); err == nil {
		t.Error("a canceled request got an answer")
	}
	Eventually(t, "the held request ended", func() (bool, string) { return f.Ended() == 1, fmt.Sprint(f.Ended()) })

	answered := make(chan int, 1)
	go func() {
		resp, err := http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream": true, "max_tokens": 1}`))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	Eventually(t, "the second request held", func() (bool, string) { return f.Requests() == 2, fmt.Sprint(f.Requests()) })
	f.Release <- struct{}{}
	if code := Wait(t, "the released answer", answered); code != http.StatusOK {
		t.Errorf("released: %d, want 200", code)
	}
}

func TestBuffer(t *testing.T) {
	var b Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			fmt.Fprint(&b, "x")
		}
	}()
	_ = b.String() // concurrently with the writes: -race checks it
	<-done
	if got := b.String(); got != strings.Repeat("x", 100) {
		t.Errorf("%q", got)
	}
}

func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
