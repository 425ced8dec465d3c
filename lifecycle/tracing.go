package lifecycle

import (
	"context"

	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// buildTracer builds cfg's tracing where it differs from the running
// one's; nil keeps the running tracer (and its queued spans) as it is.
func (d *Daemon) buildTracer(ctx context.Context, cfg *config.Config) (*tracing.Tracer, error) {
	want := cfg.Tracing.Config()
	if d.tracer.Load().Config() == want {
		return nil, nil
	}
	var opts []tracing.Option
	if d.coll != nil {
		opts = append(opts, tracing.OnExportFailed(d.coll.TracingExportFailed))
	}
	t, err := tracing.New(ctx, want, opts...)
	if err != nil {
		return nil, cfg.KeyError("tracing", err)
	}
	return t, nil
}

// swapTracer makes t, when there is one, the tracing of every request
// from now on, and flushes the one it replaces. A request in flight that
// started its span under the old one loses that span: the old exporter
// is shut down.
func (d *Daemon) swapTracer(t *tracing.Tracer) {
	if t == nil {
		return
	}
	d.dropTracer(d.tracer.Swap(t))
	if t.Exports() {
		level.Info(d.logger).Log("msg", "exporting a span per request", "endpoint", t.Config().Endpoint, "sample_ratio", t.Config().SampleRatio)
	}
}

// dropTracer flushes t's queued spans, within tracing.FlushTimeout, and
// ends its export.
func (d *Daemon) dropTracer(t *tracing.Tracer) {
	if t == nil || !t.Exports() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracing.FlushTimeout)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		level.Warn(d.logger).Log("msg", "spans not exported", "err", err)
	}
}
