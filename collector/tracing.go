package collector

import "github.com/prometheus/client_golang/prometheus"

// newTracingExportErrors counts the span exports that failed
// (tracing.endpoint): each a batch of spans the collector never got.
func newTracingExportErrors() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "tracing_export_errors_total",
		Help: "Span exports to tracing.endpoint that failed, each a batch of up to 512 spans lost: the collector refused it, or did not answer within 10 s of retries."})
}

// TracingExportFailed counts one span export that failed. The error is
// the OpenTelemetry SDK's to log.
func (c *Collector) TracingExportFailed(error) { c.tracingErrors.Inc() }
