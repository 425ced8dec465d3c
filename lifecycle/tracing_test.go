package lifecycle

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/tracing/tracingtest"
)

// TestTracingReloadAndShutdown: a reload that changes tracing flushes the
// old exporter's spans and sends the next requests' to the new endpoint;
// the shutdown flushes the last. Every span is in the trace whose
// traceparent the server got, one per request, and names its workload.
func TestTracingReloadAndShutdown(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string // the trace ids the server received
	srv := newFakeServer(t, func(f *testutil.FakeServer) {
		f.Hold = func(r *http.Request) bool {
			ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(r.Header))
			if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && sc.IsSampled() {
				mu.Lock()
				got = append(got, sc.TraceID().String())
				mu.Unlock()
			}
			return true
		}
	})
	recvA, recvB := tracingtest.NewReceiver(t), tracingtest.NewReceiver(t)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl") // two rows at once, the third an hour later
	write := func(workload, endpoint string) {
		cfg := daemontest.Config(srv.URL, trace)
		cfg.Workloads[0].Name = workload
		cfg.Tracing = config.Tracing{Endpoint: endpoint}
		daemontest.WriteConfig(t, path, cfg)
	}
	successes := func(s *started, w string) func() (bool, string) {
		return func() (bool, string) {
			v, _ := testutil.Gather(t, s.reg).Value("kvload_requests_total", "workload", w, "outcome", "success")
			return v == 2, ""
		}
	}
	write("first", recvA.URL)
	s, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the first workload's two requests", successes(s, "first"))
	write("second", recvB.URL)
	if err := s.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(recvA.Spans()); n != 2 {
		t.Errorf("the replaced exporter flushed %d spans, want 2", n)
	}
	testutil.Eventually(t, "the second workload's two requests", successes(s, "second"))
	s.stop()
	<-s.Done()
	if n := len(recvB.Spans()); n != 2 {
		t.Errorf("the shutdown flushed %d spans, want 2", n)
	}
	var exported []string
	for recv, workload := range map[*tracingtest.Receiver]string{recvA: "first", recvB: "second"} {
		for _, sp := range recv.Spans() {
			exported = append(exported, sp.TraceID)
			if sp.Attrs["kvload.workload"] != workload {
				t.Errorf("a span of the workload %s names %v", workload, sp.Attrs["kvload.workload"])
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(got)
	slices.Sort(exported)
	if len(got) != 4 || !slices.Equal(got, exported) {
		t.Errorf("the server got traces %v, the spans are in %v", got, exported)
	}
}

// TestTracingExportErrors: the spans of a collector that refuses them
// (a 404: no retry) are counted lost in kvload_tracing_export_errors_total
// by the shutdown's flush, which starts at 0.
func TestTracingExportErrors(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	recv := tracingtest.NewReceiver(t)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	cfg := daemontest.Config(srv.URL, fixture(t, "future.jsonl")) // two rows at once, the third an hour later
	cfg.Tracing = config.Tracing{Endpoint: recv.URL + "/nowhere"}
	daemontest.WriteConfig(t, path, cfg)
	s, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, n := testutil.Gather(t, s.reg).Value("kvload_tracing_export_errors_total"); v != 0 || n != 1 {
		t.Errorf("kvload_tracing_export_errors_total %v in %d series at the start, want 0 in 1", v, n)
	}
	testutil.Eventually(t, "the two requests", func() (bool, string) {
		v, _ := testutil.Gather(t, s.reg).Value("kvload_requests_total", "outcome", "success")
		return v == 2, ""
	})
	s.stop()
	<-s.Done()
	if v, _ := testutil.Gather(t, s.reg).Value("kvload_tracing_export_errors_total"); v < 1 {
		t.Errorf("kvload_tracing_export_errors_total %v after the flush to a collector that refuses, want at least 1", v)
	}
	if got := len(recv.Spans()); got != 0 {
		t.Errorf("%d spans taken by a collector that refuses them", got)
	}
}
