package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/kvload-exporter/kvload-exporter/collector"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// pollDeadline only guards against a hang; no test asserts speed with it.
const pollDeadline = 2 * time.Minute

// eventually polls cond until it holds; detail says what was last seen.
func eventually(t *testing.T, what string, cond func() (ok bool, detail string)) {
	t.Helper()
	deadline := time.Now().Add(pollDeadline)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v; last seen: %s", what, pollDeadline, detail)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeConfig(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// families is a gathered registry, by metric name.
type families map[string]*dto.MetricFamily

func gatherFamilies(t *testing.T, g prometheus.Gatherer) families {
	t.Helper()
	list, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	mfs := families{}
	for _, mf := range list {
		mfs[mf.GetName()] = mf
	}
	return mfs
}

// value sums the series of name whose labels include the given pairs.
func (mfs families) value(name string, pairs ...string) (sum float64, n int) {
	mf := mfs[name]
	if mf == nil {
		return 0, 0
	}
	want := map[string]string{}
	for i := 0; i+1 < len(pairs); i += 2 {
		want[pairs[i]] = pairs[i+1]
	}
next:
	for _, m := range mf.GetMetric() {
		matched := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok {
				if v != l.GetValue() {
					continue next
				}
				matched++
			}
		}
		if matched != len(want) {
			continue
		}
		n++
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, n
}

// seriesWith lists "name{labels}" of every series carrying label=value.
func (mfs families) seriesWith(label, value string) []string {
	var out []string
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					out = append(out, fmt.Sprintf("%s%v", name, m.GetLabel()))
				}
			}
		}
	}
	return out
}

// fakeServer speaks OpenAI chat completions over SSE and records when each
// request arrived.
type fakeServer struct {
	*httptest.Server
	// hold, when set, runs before each answer; false means the client went
	// away meanwhile, and nothing is answered.
	hold func(r *http.Request) bool

	mu       sync.Mutex
	arrived  map[string]int // by URL path
	arrivals []time.Time
	ended    int // requests whose client went away while held
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	return newHoldingServer(t, nil)
}

// newHoldingServer is a fakeServer that calls hold before answering.
func newHoldingServer(t *testing.T, hold func(r *http.Request) bool) *fakeServer {
	t.Helper()
	f := &fakeServer{arrived: map[string]int{}, hold: hold}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

// lastArrival is when the latest request arrived, and how many did.
func (f *fakeServer) lastArrival() (time.Time, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last time.Time
	for _, a := range f.arrivals {
		if a.After(last) {
			last = a
		}
	}
	return last, len(f.arrivals)
}

func (f *fakeServer) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.arrived[path]
}

func (f *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		MaxTokens int `json:"max_tokens"`
	}
	arrived := time.Now() // before the body is read: as early as the handler can tell
	json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.arrived[r.URL.Path]++
	if strings.HasSuffix(r.URL.Path, "/metrics") {
		// A vLLM's /metrics (scrapes and cache discovery), not a request.
		f.mu.Unlock()
		fmt.Fprintf(w, "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 0\n")
		return
	}
	f.arrivals = append(f.arrivals, arrived)
	f.mu.Unlock()
	if f.hold != nil && !f.hold(r) {
		f.mu.Lock()
		f.ended++
		f.mu.Unlock()
		return
	}
	n := max(req.MaxTokens, 1)
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range n {
		finish := "null"
		if i == n-1 {
			finish = `"stop"`
		}
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},\"finish_reason\":%s}]}\n\n", finish)
		fl.Flush()
	}
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", 10*n, n, 11*n)
	io.WriteString(w, "data: [DONE]\n\n")
	fl.Flush()
}

// started is a daemon started on path, stopped (and drained) by the test's
// cleanup.
type started struct {
	*Daemon
	reg     *prometheus.Registry
	stop    context.CancelFunc
	held    <-chan struct{} // a test's beforeApply hook says it holds a reload
	release chan struct{}   // and lets it go on when closed
}

func startDaemon(t *testing.T, path string, configure func(*Options)) (*started, error) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o := Options{ConfigFile: path, DrainTimeout: time.Second, Collector: collector.New(reg)}
	if configure != nil {
		configure(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := New(o)
	if err := d.Start(ctx); err != nil {
		cancel()
		return nil, err
	}
	s := &started{Daemon: d, reg: reg, stop: cancel}
	t.Cleanup(func() {
		cancel()
		<-d.Done()
	})
	return s, nil
}
