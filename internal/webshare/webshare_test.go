package webshare

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// countingGatherer blocks each gathering until release is closed (nil:
// does not block) and counts them.
type countingGatherer struct {
	started chan struct{}
	release chan struct{}
	calls   atomic.Int64
	err     error
}

func (g *countingGatherer) Gather() ([]*dto.MetricFamily, error) {
	n := g.calls.Add(1)
	if g.started != nil && n == 1 {
		close(g.started)
	}
	if g.release != nil {
		<-g.release
	}
	name := "m"
	return []*dto.MetricFamily{{Name: &name}}, g.err
}

// TestGatherer: calls made while a gathering is under way share it, result
// and error alike; a call after it has ended gathers anew.
func TestGatherer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		callers int
		err     error
	}{
		{"one caller", 1, nil},
		{"storm", 100, nil},
		{"storm with an error", 100, errors.New("collect failed")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &countingGatherer{started: make(chan struct{}), release: make(chan struct{}), err: tc.err}
			s := Gatherer(g).(*gatherer)
			type answer struct {
				mfs []*dto.MetricFamily
				err error
			}
			answers := make(chan answer, tc.callers)
			first := make(chan struct{})
			go func() { // the gathering the others join
				mfs, err := s.Gather()
				answers <- answer{mfs, err}
				close(first)
			}()
			<-g.started
			var joined sync.WaitGroup
			for range tc.callers - 1 {
				joined.Go(func() {
					mfs, err := s.Gather()
					answers <- answer{mfs, err}
				})
			}
			// Release the gathering only once every joiner waits for it.
			for s.attached.Load() != int64(tc.callers) {
				runtime.Gosched()
			}
			close(g.release)
			joined.Wait()
			<-first
			close(answers)
			n := 0
			for a := range answers {
				n++
				if len(a.mfs) != 1 || a.mfs[0].GetName() != "m" || !errors.Is(a.err, tc.err) {
					t.Errorf("answer %v, %v; want the shared gathering's", a.mfs, a.err)
				}
			}
			if n != tc.callers {
				t.Errorf("%d answers, want %d", n, tc.callers)
			}
			if c := g.calls.Load(); c != 1 {
				t.Errorf("%d gatherings for %d concurrent callers, want 1", c, tc.callers)
			}
			before := g.calls.Load()
			if _, err := s.Gather(); !errors.Is(err, tc.err) {
				t.Errorf("later call: %v", err)
			}
			if g.calls.Load() != before+1 {
				t.Error("a call after the gathering ended did not gather anew")
			}
		})
	}
}

var _ prometheus.Gatherer = Gatherer(prometheus.NewRegistry())

// TestResponses: requests negotiating the same response while one is
// being made get its status, headers and body from that one run; other
// negotiations and later requests run the handler anew; a waiter that
// gives up returns, and a handler that panics lets its waiters go.
func TestResponses(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		if n == 1 {
			close(started)
			<-release
		}
		w.Header().Set("Content-Type", "text/test; enc="+r.Header.Get("Accept-Encoding"))
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "run "+strconv.FormatInt(n, 10))
	})
	s := Responses(h).(*responses)
	get := func(ctx context.Context, enc string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/metrics", nil)
		req.Header.Set("Accept-Encoding", enc)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec
	}

	const callers = 50
	answers := make(chan *httptest.ResponseRecorder, callers)
	var wg sync.WaitGroup
	wg.Go(func() { answers <- get(t.Context(), "gzip") })
	<-started
	for range callers - 1 {
		wg.Go(func() { answers <- get(t.Context(), "gzip") })
	}
	gaveUp, cancel := context.WithCancel(t.Context())
	wg.Go(func() {
		if rec := get(gaveUp, "gzip"); rec.Body.Len() != 0 {
			t.Errorf("a waiter that gave up was sent %q", rec.Body.String())
		}
	})
	for s.attached.Load() != callers+1 { // the first, the 49 joiners and the one about to give up
		runtime.Gosched()
	}
	cancel()
	for s.attached.Load() != callers {
		runtime.Gosched()
	}
	// Another negotiation is not shared: it runs the handler at once.
	if rec := get(t.Context(), "identity"); rec.Body.String() != "run 2" || rec.Header().Get("Content-Type") != "text/test; enc=identity" {
		t.Errorf("other negotiation: %d %q %q", rec.Code, rec.Header(), rec.Body.String())
	}
	close(release)
	wg.Wait()
	close(answers)
	n := 0
	for rec := range answers {
		n++
		if rec.Code != http.StatusAccepted || rec.Header().Get("Content-Type") != "text/test; enc=gzip" || rec.Body.String() != "run 1" {
			t.Errorf("answer %d %q %q, want the first run's", rec.Code, rec.Header(), rec.Body.String())
		}
	}
	if n != callers {
		t.Errorf("%d answers, want %d", n, callers)
	}
	if rec := get(t.Context(), "gzip"); rec.Body.String() != "run 3" {
		t.Errorf("a later request got %q, want a run of its own", rec.Body.String())
	}

	// A panicking run: its waiters get a 500, not a hang.
	var panicked atomic.Bool
	block := make(chan struct{})
	p := Responses(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-block
		panic(http.ErrAbortHandler)
	})).(*responses)
	var pw sync.WaitGroup
	pw.Go(func() {
		// net/http recognises the very value, not one that wraps it.
		defer func() { panicked.Store(recover() == http.ErrAbortHandler) }() //nolint:errorlint
		p.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil))
	})
	for p.attached.Load() != 1 {
		runtime.Gosched()
	}
	waiter := httptest.NewRecorder()
	pw.Go(func() { p.ServeHTTP(waiter, httptest.NewRequest(http.MethodGet, "/metrics", nil)) })
	for p.attached.Load() != 2 {
		runtime.Gosched()
	}
	close(block)
	pw.Wait()
	if !panicked.Load() || waiter.Code != http.StatusInternalServerError {
		t.Errorf("panicked %v; waiter %d, want the panic to go on as http.ErrAbortHandler and the waiter a 500", panicked.Load(), waiter.Code)
	}
}

// TestGathererPanic: a gathering that panics panics in the call that
// started it, with the panic's value, and fails the calls that joined it
// with an error, rather than taking the process down or leaving them
// waiting.
func TestGathererPanic(t *testing.T) {
	boom := errors.New("collector exploded")
	started, release := make(chan struct{}), make(chan struct{})
	s := Gatherer(panickingGatherer{started, release, boom}).(*gatherer)
	var recovered any
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() { recovered = recover() }()
		_, _ = s.Gather() // it panics
	})
	<-started
	var joinErr error
	wg.Go(func() { _, joinErr = s.Gather() })
	for s.attached.Load() != 2 {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if err, ok := recovered.(error); !ok || !errors.Is(err, boom) {
		t.Errorf("the first caller recovered %v, want the gathering's panic", recovered)
	}
	if !errors.Is(joinErr, boom) || strings.Contains(joinErr.Error(), "goroutine") {
		t.Errorf("the joiner got %v, want an error carrying the gathering's panic without its stack", joinErr)
	}
}

type panickingGatherer struct {
	started, release chan struct{}
	value            any
}

func (g panickingGatherer) Gather() ([]*dto.MetricFamily, error) {
	close(g.started)
	<-g.release
	panic(g.value)
}

// TestResponsesPanicAfterWriting: a run that panics after it began its
// response sends its joiners a 500, not the partial response, and the
// request whose run it was panics with the value and where it happened.
func TestResponsesPanicAfterWriting(t *testing.T) {
	boom := errors.New("encoder exploded")
	started, release := make(chan struct{}), make(chan struct{})
	s := Responses(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "partial")
		close(started)
		<-release
		panic(boom)
	})).(*responses)
	var recovered any
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() { recovered = recover() }()
		s.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil))
	})
	<-started
	waiter := httptest.NewRecorder()
	wg.Go(func() { s.ServeHTTP(waiter, httptest.NewRequest(http.MethodGet, "/metrics", nil)) })
	for s.attached.Load() != 2 {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	err, ok := recovered.(error)
	if !ok || !errors.Is(err, boom) || !strings.Contains(err.Error(), "TestResponsesPanicAfterWriting") {
		t.Errorf("the first request recovered %v, want the run's panic with the stack where it happened", recovered)
	}
	if waiter.Code != http.StatusInternalServerError || strings.Contains(waiter.Body.String(), "partial") {
		t.Errorf("the joiner got %d %q, want a 500", waiter.Code, waiter.Body.String())
	}
}

// TestResponsesOverGathererPanic: a collector's panic that passes through
// both layers reaches the request that started the run once, not wrapped
// in the panic of the layer above.
func TestResponsesOverGathererPanic(t *testing.T) {
	boom := errors.New("collector exploded")
	started, release := make(chan struct{}), make(chan struct{})
	g := Gatherer(panickingGatherer{started, release, boom})
	s := Responses(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = g.Gather() // it panics
	}))
	var recovered any
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() { recovered = recover() }()
		s.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil))
	})
	<-started
	close(release)
	wg.Wait()
	p, ok := recovered.(*panicked)
	if !ok || p.value != any(boom) {
		t.Errorf("recovered %#v, want the collector's panic as it was raised", recovered)
	}
}

// TestResponsesFirstGivesUp: the request whose run it is may give up too;
// the run goes on and its joiners are sent its response.
func TestResponsesFirstGivesUp(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	s := Responses(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		io.WriteString(w, "done")
	})).(*responses)
	ctx, cancel := context.WithCancel(t.Context())
	first := httptest.NewRecorder()
	var wg sync.WaitGroup
	wg.Go(func() { s.ServeHTTP(first, httptest.NewRequestWithContext(ctx, http.MethodGet, "/metrics", nil)) })
	<-started
	waiter := httptest.NewRecorder()
	wg.Go(func() { s.ServeHTTP(waiter, httptest.NewRequest(http.MethodGet, "/metrics", nil)) })
	for s.attached.Load() != 2 {
		runtime.Gosched()
	}
	cancel()
	for s.attached.Load() != 1 {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if first.Body.Len() != 0 {
		t.Errorf("the request that gave up was sent %q", first.Body.String())
	}
	if waiter.Code != http.StatusOK || waiter.Body.String() != "done" {
		t.Errorf("the joiner got %d %q, want the run's response", waiter.Code, waiter.Body.String())
	}
}
