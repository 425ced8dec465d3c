package collector

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
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

// TestSharedGatherer: calls made while a gathering is under way share it,
// result and error alike; a call after it has ended gathers anew.
func TestSharedGatherer(t *testing.T) {
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
			s := SharedGatherer(g)
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
			for s.(*sharedGatherer).waiting.Load() != int64(tc.callers-1) {
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

var _ prometheus.Gatherer = SharedGatherer(prometheus.NewRegistry())

// TestSharedResponses: requests negotiating the same response while one is
// being made get its status, headers and body from that one run; other
// negotiations and later requests run the handler anew; a waiter that
// gives up returns, and a handler that panics lets its waiters go.
func TestSharedResponses(t *testing.T) {
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
	s := SharedResponses(h).(*sharedResponses)
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
	for s.waiting.Load() != callers { // the 49 joiners and the one about to give up
		runtime.Gosched()
	}
	cancel()
	for s.waiting.Load() != callers-1 {
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
	p := SharedResponses(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-block
		panic(http.ErrAbortHandler)
	})).(*sharedResponses)
	var pw sync.WaitGroup
	pw.Go(func() {
		defer func() { panicked.Store(recover() != nil) }()
		p.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil))
	})
	for {
		p.mu.Lock()
		n := len(p.in)
		p.mu.Unlock()
		if n == 1 {
			break
		}
		runtime.Gosched()
	}
	waiter := httptest.NewRecorder()
	pw.Go(func() { p.ServeHTTP(waiter, httptest.NewRequest(http.MethodGet, "/metrics", nil)) })
	for p.waiting.Load() != 1 {
		runtime.Gosched()
	}
	close(block)
	pw.Wait()
	if !panicked.Load() || waiter.Code != http.StatusInternalServerError {
		t.Errorf("panicked %v; waiter %d, want the panic to go on and the waiter a 500", panicked.Load(), waiter.Code)
	}
}
