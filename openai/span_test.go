package openai

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/version"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/tracing"
	"github.com/kvload-exporter/kvload-exporter/tracing/tracingtest"
)

// headerServer streams a 4-token vLLM answer with usage and keeps the
// traceparent of every request it got, in arrival order.
type headerServer struct {
	*httptest.Server
	mu     sync.Mutex
	parent []string
}

func newHeaderServer(t *testing.T) *headerServer {
	t.Helper()
	s := &headerServer{}
	pieces := vllmStream(4)
	s.Server = newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.parent = append(s.parent, r.Header.Get("traceparent"))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, p := range pieces {
			_, _ = w.Write(p)
		}
	}))
	return s
}

func (s *headerServer) traceparents() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.parent...)
}

// parseTraceparent reads a traceparent as the W3C propagator does; ok is
// false when it is not a valid one.
func parseTraceparent(h string) (traceID string, sampled, ok bool) {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": h})
	span := trace.SpanContextFromContext(ctx)
	return span.TraceID().String(), span.IsSampled(), span.IsValid() && span.IsRemote()
}

// TestTraceparentByDefault: with no tracing configured, every request
// carries a valid, sampled traceparent of its own, the one its Response
// names.
func TestTraceparentByDefault(t *testing.T) {
	// A request timeout derives the request's context anew: the trace
	// context must survive it.
	for _, timeout := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprint("request_timeout ", timeout), func(t *testing.T) { traceparentByDefault(t, timeout) })
	}
}

func traceparentByDefault(t *testing.T, timeout time.Duration) {
	srv := newHeaderServer(t)
	c := mustClient(t, TargetConfig{URL: srv.URL, Model: "m", Dialect: engine.DialectVLLM, RequestTimeout: timeout})
	const n = 20
	var sent []string
	for range n {
		var res Response
		c.Do(context.Background(), Request{Prompt: "hello", MaxTokens: 4}, &res)
		if res.Outcome != OutcomeSuccess {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Error)
		}
		if !res.Trace.IsValid() || !res.Trace.IsSampled() {
			t.Fatalf("response trace %v: want a valid, sampled context", res.Trace)
		}
		sent = append(sent, res.Trace.TraceID().String())
	}
	got := srv.traceparents()
	seen := map[string]bool{}
	for i, h := range got {
		id, sampled, ok := parseTraceparent(h)
		if !ok || !sampled {
			t.Fatalf("request %d: traceparent %q: valid %v, sampled %v", i, h, ok, sampled)
		}
		if id != sent[i] {
			t.Errorf("request %d: the server got trace %s, the response names %s", i, id, sent[i])
		}
		if seen[id] {
			t.Errorf("trace id %s sent twice", id)
		}
		seen[id] = true
	}
	if len(got) != n {
		t.Fatalf("%d requests reached the server, want %d", len(got), n)
	}
}

// TestTraceSampleRatio: the traceparent's sampled flag follows
// sample_ratio, with and without an endpoint.
func TestTraceSampleRatio(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ratio    float64
		endpoint bool
	}{
		{"none without endpoint", 0, false},
		{"all without endpoint", 1, false},
		{"none exported", 0, true},
		{"half without endpoint", 0.5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newHeaderServer(t)
			cfg := tracing.Config{SampleRatio: tc.ratio}
			var recv *tracingtest.Receiver
			if tc.endpoint {
				recv = tracingtest.NewReceiver(t)
				cfg.Endpoint = recv.URL
			}
			tr, err := tracing.New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			c := mustClient(t, TargetConfig{URL: srv.URL, Model: "m", Dialect: engine.DialectVLLM, Tracer: tracing.NewCurrent(tr)})
			const n = 200
			for range n {
				var res Response
				c.Do(context.Background(), Request{Prompt: "hello", MaxTokens: 4}, &res)
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			sampled := 0
			for _, h := range srv.traceparents() {
				_, s, ok := parseTraceparent(h)
				if !ok {
					t.Fatalf("traceparent %q is not valid", h)
				}
				if s {
					sampled++
				}
			}
			lo, hi := int(tc.ratio*n*0.7), int(tc.ratio*n*1.3+0.5)
			if sampled < lo || sampled > hi {
				t.Errorf("%d of %d sampled, want %d to %d", sampled, n, lo, hi)
			}
			if recv != nil && len(recv.Spans()) != sampled {
				t.Errorf("%d spans exported, want one per sampled request (%d)", len(recv.Spans()), sampled)
			}
		})
	}
}

// TestSpansReachOTLPReceiver: with an endpoint, each request is exported
// as one client span over OTLP/HTTP with the gen_ai attributes, in the
// trace whose traceparent the server got.
func TestSpansReachOTLPReceiver(t *testing.T) {
	recv := tracingtest.NewReceiver(t)
	tr, err := tracing.New(context.Background(), tracing.Config{Endpoint: recv.URL, SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	srv := newHeaderServer(t)
	failing := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
	}))
	cur := tracing.NewCurrent(tr)
	c := mustClient(t, TargetConfig{Name: "vllm-a", Workload: "canary", URL: srv.URL, Model: "Qwen/Qwen3-0.6B", Dialect: engine.DialectVLLM, Tracer: cur})
	bad := mustClient(t, TargetConfig{Name: "down", URL: failing.URL, API: APICompletions, Model: "m", Tracer: cur})
	const n = 5
	for range n {
		var res Response
		c.Do(context.Background(), Request{Prompt: "hello", MaxTokens: 4}, &res)
		if res.Outcome != OutcomeSuccess {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Error)
		}
	}
	var failed Response
	bad.Do(context.Background(), Request{Prompt: "hello", MaxTokens: 4}, &failed)
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := recv.Refused(); len(r) > 0 {
		t.Fatalf("the receiver refused: %v", r)
	}
	byTrace := map[string]tracingtest.Span{}
	for _, s := range recv.Spans() {
		if _, dup := byTrace[s.TraceID]; dup {
			t.Errorf("two spans in trace %s", s.TraceID)
		}
		byTrace[s.TraceID] = s
	}
	if len(byTrace) != n+1 {
		t.Fatalf("%d spans received, want %d", len(byTrace), n+1)
	}
	for _, h := range srv.traceparents() {
		id, _, _ := parseTraceparent(h)
		s, ok := byTrace[id]
		if !ok {
			t.Fatalf("no span in the trace %s the server got", id)
		}
		if s.Name != "chat Qwen/Qwen3-0.6B" || s.Kind != tracepb.Span_SPAN_KIND_CLIENT || s.Status == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("span %q kind %v status %v", s.Name, s.Kind, s.Status)
		}
		wantAttrs := map[string]any{
			"gen_ai.operation.name":                "chat",
			"gen_ai.provider.name":                 "vllm",
			"gen_ai.request.model":                 "Qwen/Qwen3-0.6B",
			"gen_ai.request.max_tokens":            int64(4),
			"gen_ai.usage.input_tokens":            int64(1043),
			"gen_ai.usage.output_tokens":           int64(4),
			"gen_ai.usage.cache_read.input_tokens": int64(1024),
			"kvload.outcome":                       "success",
			"kvload.target":                        "vllm-a",
			"kvload.workload":                      "canary",
			"server.address":                       "127.0.0.1",
			"http.response.status_code":            int64(200),
		}
		for k, v := range wantAttrs {
			if s.Attrs[k] != v {
				t.Errorf("%s = %v (%T), want %v", k, s.Attrs[k], s.Attrs[k], v)
			}
		}
		if ttft, ok := s.Attrs["gen_ai.response.time_to_first_chunk"].(float64); !ok || ttft <= 0 {
			t.Errorf("gen_ai.response.time_to_first_chunk = %v", s.Attrs["gen_ai.response.time_to_first_chunk"])
		}
		if _, ok := s.Attrs["error.type"]; ok {
			t.Errorf("a success has error.type %v", s.Attrs["error.type"])
		}
		if s.Resource["service.name"] != "kvload-exporter" || s.Resource["service.version"] != version.Version {
			t.Errorf("resource %v", s.Resource)
		}
	}
	s := byTrace[failed.Trace.TraceID().String()]
	if s.Name != "text_completion m" || s.Status != tracepb.Status_STATUS_CODE_ERROR || s.Attrs["error.type"] != "http_error" ||
		s.Attrs["kvload.outcome"] != "http_error" || s.Attrs["http.response.status_code"] != int64(503) {
		t.Errorf("the failed request's span: %+v", s)
	}
	if _, ok := s.Attrs["gen_ai.usage.output_tokens"]; ok {
		t.Errorf("a request that got no answer reports output tokens")
	}
	if w, ok := s.Attrs["kvload.workload"]; ok {
		t.Errorf("a client of no workload names one on its spans: %v", w)
	}
}

// BenchmarkRequestTraceOverhead is what tracing and the phase timings add
// to a request without an endpoint: the ids, the traceparent header, the
// hooks of httptrace and the phases worked out (the hooks themselves run
// in BenchmarkClientStream32).
func BenchmarkRequestTraceOverhead(b *testing.B) {
	tr := tracing.DefaultTracer()
	h := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		ctx, span := tr.Start(context.Background(), "chat m")
		tracing.Inject(ctx, h)
		clock := new(phaseClock)
		_ = httptrace.WithClientTrace(ctx, clock.trace())
		_ = clock.phases()
		_ = span.Context()
	}
}
