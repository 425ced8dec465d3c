// Package tracingtest is an OTLP/HTTP trace receiver for tests: it decodes
// the real protobuf ExportTraceServiceRequest that OpenTelemetry's
// exporter sends and keeps the spans.
package tracingtest

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, its attributes flattened to Go values
// (string, int64, float64, bool).
type Span struct {
	TraceID, SpanID string // lowercase hex, as in a traceparent
	Name            string
	Kind            tracepb.Span_SpanKind
	Status          tracepb.Status_StatusCode
	Attrs           map[string]any
	Resource        map[string]any
}

// Receiver serves POST /v1/traces on a loopback port until the test ends.
type Receiver struct {
	URL string // the traces endpoint

	release <-chan struct{} // nil: answer at once

	mu    sync.Mutex
	spans []Span
	bad   []string
}

// NewReceiver starts a receiver closed at t's cleanup.
func NewReceiver(t testing.TB) *Receiver { return NewHeldReceiver(t, nil) }

// NewHeldReceiver starts a receiver that holds every export until release
// is closed, as a collector that hangs: the test must close it.
func NewHeldReceiver(t testing.TB, release <-chan struct{}) *Receiver {
	t.Helper()
	r := &Receiver{release: release}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.URL = srv.URL + "/v1/traces"
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if r.release != nil {
		<-r.release
	}
	body, err := io.ReadAll(req.Body)
	var msg collectortrace.ExportTraceServiceRequest
	switch {
	case req.URL.Path != "/v1/traces" || req.Method != http.MethodPost:
		r.refuse(w, http.StatusNotFound, req.Method+" "+req.URL.Path)
		return
	case req.Header.Get("Content-Type") != "application/x-protobuf":
		r.refuse(w, http.StatusUnsupportedMediaType, "content type "+req.Header.Get("Content-Type"))
		return
	case err != nil:
		r.refuse(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := proto.Unmarshal(body, &msg); err != nil {
		r.refuse(w, http.StatusBadRequest, "decode: "+err.Error())
		return
	}
	r.mu.Lock()
	for _, rs := range msg.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{
					TraceID:  hex.EncodeToString(s.GetTraceId()),
					SpanID:   hex.EncodeToString(s.GetSpanId()),
					Name:     s.GetName(),
					Kind:     s.GetKind(),
					Status:   s.GetStatus().GetCode(),
					Attrs:    attrs(s.GetAttributes()),
					Resource: res,
				})
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) refuse(w http.ResponseWriter, code int, why string) {
	r.mu.Lock()
	r.bad = append(r.bad, why)
	r.mu.Unlock()
	http.Error(w, why, code)
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = v.IntValue
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = v.DoubleValue
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = v.BoolValue
		default:
			m[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return m
}

// Spans are the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Refused lists the requests the receiver could not take, and why.
func (r *Receiver) Refused() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}
