package lifecycle

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newFakeServer is the kit's fake server standing for a vLLM: its /metrics
// answers the cache discovery and the server-metrics scrapers.
func newFakeServer(t *testing.T, configure func(*testutil.FakeServer)) *testutil.FakeServer {
	t.Helper()
	return testutil.NewFakeServer(t, func(f *testutil.FakeServer) {
		f.Metrics = testutil.VLLMMetrics
		if configure != nil {
			configure(f)
		}
	})
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
