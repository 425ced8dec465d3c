// Package tracing gives every request the exporter sends its W3C trace
// context and, where the configuration names an OTLP endpoint, exports the
// request as a span with OpenTelemetry's SDK. A Tracer belongs to one
// configuration; Current holds the running one, which a reload replaces.
package tracing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/common/version"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
)

// The bounds of the span export. A span ended while MaxQueueSpans wait is
// dropped: a collector that is down costs the requests nothing.
const (
	MaxQueueSpans  = 2048
	MaxExportBatch = 512
	// ExportTimeout bounds one export request to the endpoint, retries
	// included.
	ExportTimeout = 10 * time.Second
	// FlushTimeout bounds the flush of the spans still queued when a
	// tracer is replaced or the daemon stops.
	FlushTimeout = 5 * time.Second
)

// Config is what the configuration's tracing key says.
type Config struct {
	// Endpoint is the OTLP/HTTP traces URL (http://collector:4318/v1/traces);
	// empty exports nothing, and requests still carry a traceparent.
	Endpoint string
	// SampleRatio is the share of requests whose traceparent says sampled,
	// and, with an Endpoint, whose span is exported: 0 to 1.
	SampleRatio float64
}

// Default is the tracing of a configuration without the key: every request
// carries a sampled traceparent, and no span is exported.
var Default = Config{SampleRatio: 1}

// defaultTracer is the tracer of Default, which needs nothing built.
var defaultTracer = &Tracer{cfg: Default, threshold: ratioThreshold(Default.SampleRatio)}

// DefaultTracer is the tracer of Default: a sampled traceparent on every
// request and no span.
func DefaultTracer() *Tracer { return defaultTracer }

// Check reports what is wrong with c.
func (c Config) Check() error {
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) {
		return fmt.Errorf("sample_ratio %v: want a number from 0 to 1", c.SampleRatio)
	}
	return nil
}

// Tracer starts the trace of each request under one configuration.
// It is safe for concurrent use.
type Tracer struct {
	cfg Config
	// threshold: a trace id whose last 8 bytes, shifted right by one, are
	// below it is sampled, the SDK's TraceIDRatioBased rule, so that both
	// paths sample alike.
	threshold uint64
	provider  *sdktrace.TracerProvider // nil without an endpoint
	tracer    trace.Tracer
}

// Option changes what New builds beside cfg: what the daemon observes of
// the export, which is no part of the configuration.
type Option func(*options)

type options struct {
	exportFailed func(error)
}

// OnExportFailed calls failed, on the SDK's export goroutine, with the
// error of each export that did not deliver its batch of spans (up to
// MaxExportBatch), its retries spent or refused by the collector.
func OnExportFailed(failed func(error)) Option {
	return func(o *options) { o.exportFailed = failed }
}

// failureExporter tells failed of each export that returned an error.
type failureExporter struct {
	sdktrace.SpanExporter
	failed func(error)
}

func (e failureExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		e.failed(err)
	}
	return err
}

// New builds the tracer of cfg. With an endpoint it starts the SDK's batch
// processor, whose goroutine Shutdown ends; nothing is sent before the
// first span. Headers and TLS files of the export come from the standard
// OTEL_EXPORTER_OTLP_* environment variables (OTEL_EXPORTER_OTLP_HEADERS,
// OTEL_EXPORTER_OTLP_CERTIFICATE), and the resource from
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, so that no secret sits
// in the configuration file; service.version is the binary's.
func New(ctx context.Context, cfg Config, opts ...Option) (*Tracer, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	t := &Tracer{cfg: cfg, threshold: ratioThreshold(cfg.SampleRatio)}
	if cfg.Endpoint == "" {
		return t, nil
	}
	exp, err := otlptracehttp.New(ctx,
		otlptracehttp.WithEndpointURL(cfg.Endpoint),
		otlptracehttp.WithTimeout(ExportTimeout),
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: true, InitialInterval: time.Second, MaxInterval: 5 * time.Second, MaxElapsedTime: ExportTimeout}),
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	res, err := sdkresource.New(ctx,
		sdkresource.WithSchemaURL(semconv.SchemaURL),
		sdkresource.WithAttributes(semconv.ServiceName("kvload-exporter"), semconv.ServiceVersion(version.Version)),
		sdkresource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		sdkresource.WithTelemetrySDK(),
	)
	if err != nil && res == nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: the resource: %w", err)
	}
	var export sdktrace.SpanExporter = exp
	if o.exportFailed != nil {
		export = failureExporter{SpanExporter: exp, failed: o.exportFailed}
	}
	t.provider = sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.TraceIDRatioBased(cfg.SampleRatio)),
		sdktrace.WithBatcher(export,
			sdktrace.WithMaxQueueSize(MaxQueueSpans),
			sdktrace.WithMaxExportBatchSize(MaxExportBatch),
			sdktrace.WithExportTimeout(ExportTimeout)),
	)
	t.tracer = t.provider.Tracer("github.com/kvload-exporter/kvload-exporter/tracing")
	return t, nil
}

// ratioThreshold is the SDK's TraceIDRatioBased bound for ratio.
func ratioThreshold(ratio float64) uint64 {
	if ratio >= 1 {
		return 1 << 63 // every id: the shifted value is below 2^63
	}
	return uint64(ratio * (1 << 63))
}

// Config is the configuration t was built from.
func (t *Tracer) Config() Config { return t.cfg }

// Exports tells whether t exports spans.
func (t *Tracer) Exports() bool { return t.provider != nil }

// Shutdown exports the spans still queued, within ctx, and ends the
// export. Spans ended afterwards are dropped.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flushing the spans to %s: %w", t.cfg.Endpoint, err)
	}
	return nil
}

// Span is the trace of one request: its context, sent as the request's
// traceparent, and, where it is exported and sampled, its span.
type Span struct {
	sc   trace.SpanContext
	span trace.Span // nil when nothing is recorded
}

// Start begins the trace of one request, named name (the gen_ai
// convention's "{operation} {model}"), and returns ctx carrying it.
// Without an endpoint it builds no span: it draws the ids and applies the
// sampling ratio only.
func (t *Tracer) Start(ctx context.Context, name string) (context.Context, Span) {
	if t.provider != nil {
		ctx, s := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithNewRoot())
		sp := Span{sc: s.SpanContext()}
		if s.IsRecording() {
			sp.span = s
		}
		return ctx, sp
	}
	var tid trace.TraceID
	var sid trace.SpanID
	putUint64(tid[:8], rand.Uint64())
	low := rand.Uint64()
	putUint64(tid[8:], low)
	putUint64(sid[:], rand.Uint64()|1) // never the invalid all-zero id
	var flags trace.TraceFlags
	if low>>1 < t.threshold {
		flags = trace.FlagsSampled
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags})
	return trace.ContextWithSpanContext(ctx, sc), Span{sc: sc}
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}

// Context is the request's trace context, as its traceparent carries it.
func (s Span) Context() trace.SpanContext { return s.sc }

// Recording tells whether the span is exported: only then do End's
// attributes matter, and a caller may skip building them.
func (s Span) Recording() bool { return s.span != nil }

// End ends the span with attrs; a non-empty failure (error.type, the
// outcome) marks it failed, with message as its status description.
func (s Span) End(attrs []attribute.KeyValue, failure, message string) {
	if s.span == nil {
		return
	}
	s.span.SetAttributes(attrs...)
	if failure != "" {
		s.span.SetAttributes(semconv.ErrorTypeKey.String(failure))
		s.span.SetStatus(codes.Error, message)
	}
	s.span.End()
}

// propagator writes the traceparent (and tracestate) header.
var propagator = propagation.TraceContext{}

// Inject sets the traceparent header of h from ctx, which Start returned.
func Inject(ctx context.Context, h http.Header) {
	InjectInto(ctx, propagation.HeaderCarrier(h))
}

// InjectInto is Inject for headers that are not an http.Header.
func InjectInto(ctx context.Context, c propagation.TextMapCarrier) {
	propagator.Inject(ctx, c)
}

// Current holds the tracer of the running configuration. The clients read
// it at each request; the daemon replaces it at a reload.
type Current struct {
	p atomic.Pointer[Tracer]
}

// NewCurrent holds t.
func NewCurrent(t *Tracer) *Current {
	c := &Current{}
	c.p.Store(t)
	return c
}

// Load is the running tracer.
func (c *Current) Load() *Tracer { return c.p.Load() }

// Swap makes t the running tracer and returns the one it replaces, for
// its owner to shut down.
func (c *Current) Swap(t *Tracer) *Tracer { return c.p.Swap(t) }
