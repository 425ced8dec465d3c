package tracing_test

import (
	"context"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvload-exporter/kvload-exporter/tracing"
	"github.com/kvload-exporter/kvload-exporter/tracing/tracingtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestExportQueueBound: a collector that hangs holds one batch; the queue
// keeps at most MaxQueueSpans more, and every span past them is dropped
// without holding up the request that ended it.
func TestExportQueueBound(t *testing.T) {
	release := make(chan struct{})
	recv := tracingtest.NewHeldReceiver(t, release)
	tr, err := tracing.New(context.Background(), tracing.Config{Endpoint: recv.URL, SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	const ended = 4 * tracing.MaxQueueSpans
	for range ended {
		_, span := tr.Start(context.Background(), "chat m")
		if !span.Recording() {
			t.Fatal("a sampled span with an endpoint is not recorded")
		}
		span.End(nil, "", "")
	}
	close(release)
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := len(recv.Spans())
	if got == 0 || got > tracing.MaxQueueSpans+tracing.MaxExportBatch {
		t.Errorf("%d of %d spans exported, want some and at most %d", got, ended, tracing.MaxQueueSpans+tracing.MaxExportBatch)
	}
	t.Logf("%d of %d spans exported", got, ended)
}

// TestNoSpanWithoutEndpoint: without an endpoint nothing is recorded, and
// the trace context is still valid and sampled as the ratio says.
func TestNoSpanWithoutEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ratio   float64
		sampled bool
	}{{1, true}, {0, false}} {
		tr, err := tracing.New(context.Background(), tracing.Config{SampleRatio: tc.ratio})
		if err != nil {
			t.Fatal(err)
		}
		if tr.Exports() {
			t.Error("a tracer without an endpoint exports")
		}
		_, span := tr.Start(context.Background(), "chat m")
		if span.Recording() || !span.Context().IsValid() || span.Context().IsSampled() != tc.sampled {
			t.Errorf("ratio %v: recording %v, context %v", tc.ratio, span.Recording(), span.Context())
		}
	}
}

// TestConfigCheck: the sample ratio is a share.
func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		ok    bool
	}{{0, true}, {0.5, true}, {1, true}, {-0.01, false}, {1.01, false}} {
		err := tracing.Config{SampleRatio: tc.ratio}.Check()
		if (err == nil) != tc.ok {
			t.Errorf("ratio %v: %v", tc.ratio, err)
		}
		if _, nerr := tracing.New(context.Background(), tracing.Config{SampleRatio: tc.ratio}); (nerr == nil) != tc.ok {
			t.Errorf("New with ratio %v: %v", tc.ratio, nerr)
		}
	}
}

// TestExportFailures: each export the collector refuses is told to
// OnExportFailed (one batch for spans ended at once), and none is where it
// takes them.
func TestExportFailures(t *testing.T) {
	recv := tracingtest.NewReceiver(t)
	for _, tc := range []struct {
		name, endpoint string
		failed         bool
	}{
		{"taken", recv.URL, false},
		// A 404: no retry, the batch is lost.
		{"refused", recv.URL + "/nowhere", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var failures atomic.Int64
			tr, err := tracing.New(context.Background(), tracing.Config{Endpoint: tc.endpoint, SampleRatio: 1},
				tracing.OnExportFailed(func(error) { failures.Add(1) }))
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				_, span := tr.Start(context.Background(), "chat m")
				span.End(nil, "", "")
			}
			// The SDK's flush reports an export's failure to OTel's
			// error handler, not to Shutdown.
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := failures.Load(); (got > 0) != tc.failed {
				t.Errorf("%d failed exports told, want failures %v", got, tc.failed)
			}
		})
	}
}
