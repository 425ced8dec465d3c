package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// startInBackground starts a daemon on path under ctx, handing Start's
// error to the channel returned; the test's cleanup ends it.
func startInBackground(ctx context.Context, t *testing.T, path string) (*Daemon, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	d := New(Options{ConfigFile: path, DrainTimeout: time.Second, Collector: collector.New(prometheus.NewRegistry())})
	started := make(chan error, 1)
	go func() { started <- d.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-d.Done()
	})
	return d, started
}

// TestStartupReadsBounded: the reads a load makes of its targets (cache
// layouts, tokenize checks) run at most maxTargetReads at once, and the
// load waits for them. They once ran two per target at once, whatever
// the number of targets.
func TestStartupReadsBounded(t *testing.T) {
	t.Parallel()
	const targets = 40 // 80 reads
	h := testutil.NewHangingServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, daemontest.ManyTargets(h.URL, fixture(t, "future.jsonl"), targets, false))
	d, started := startInBackground(context.Background(), t, path)
	testutil.Eventually(t, "as many reads held as the bound allows", func() (bool, string) {
		_, held, _ := h.Counts()
		return held >= maxTargetReads, fmt.Sprint(held, " held")
	})
	if d.Ready() {
		t.Error("ready while its targets' reads are under way")
	}
	h.LetGo()
	if err := testutil.Wait(t, "the start", started); err != nil {
		t.Fatal(err)
	}
	arrived, _, most := h.Counts()
	t.Logf("%d reads, at most %d at once", arrived, most)
	if most != maxTargetReads {
		t.Errorf("at most %d reads held at once, want %d", most, maxTargetReads)
	}
	if arrived < 2*targets {
		t.Errorf("%d reads, want at least %d (a layout and a tokenize check each)", arrived, 2*targets)
	}
	if !d.Ready() {
		t.Error("not ready after the start")
	}
}

// TestStartupBaselinesBounded: the server-metrics baselines of a load's
// targets are read side by side, at most maxTargetReads at once, like
// its other reads. They were read one after another, so that 10 targets
// whose /metrics hung held the load back ten times discoverTimeout.
func TestStartupBaselinesBounded(t *testing.T) {
	t.Parallel()
	const targets = 40
	// Only the baselines hang: the layout and tokenize reads fail at once.
	h := testutil.NewHangingServer(t, func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/hang/") })
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, daemontest.ManyTargets(h.URL, fixture(t, "future.jsonl"), targets, true))
	d, started := startInBackground(context.Background(), t, path)
	testutil.Eventually(t, "as many baselines held as the bound allows", func() (bool, string) {
		_, held, _ := h.Counts()
		return held >= maxTargetReads, fmt.Sprint(held, " held")
	})
	h.LetGo()
	if err := testutil.Wait(t, "the start", started); err != nil {
		t.Fatal(err)
	}
	arrived, _, most := h.Counts()
	t.Logf("%d baseline reads, at most %d at once", arrived, most)
	if most != maxTargetReads {
		t.Errorf("at most %d baselines held at once, want %d", most, maxTargetReads)
	}
	if arrived < targets {
		t.Errorf("%d baseline reads, want %d", arrived, targets)
	}
	if !d.Ready() {
		t.Error("not ready after the start")
	}
}

// TestStartupEndsWithShutdown: a shutdown during the first load ends the
// targets' reads under way, starts no more, and Start returns
// ErrShuttingDown, whether it comes during the cache layouts' and
// tokenize checks' reads or the server-metrics baselines'. Against
// targets that never answer, every read would have waited for
// discoverTimeout: the baselines did, one after another (10 hanging
// targets held a start 31 s, and its SIGTERM 28 s).
func TestStartupEndsWithShutdown(t *testing.T) {
	t.Parallel()
	for _, scraped := range []bool{false, true} {
		t.Run(fmt.Sprint("scraped=", scraped), func(t *testing.T) {
			t.Parallel()
			const targets = 40
			// Scraped, only the baselines hang: the other reads fail at once.
			h := testutil.NewHangingServer(t, func(r *http.Request) bool {
				return !scraped || strings.HasPrefix(r.URL.Path, "/hang/")
			})
			path := filepath.Join(t.TempDir(), "kvload.yml")
			daemontest.WriteConfig(t, path, daemontest.ManyTargets(h.URL, fixture(t, "future.jsonl"), targets, scraped))
			ctx, shutdown := context.WithCancel(context.Background())
			d, started := startInBackground(ctx, t, path)
			testutil.Eventually(t, "reads held", func() (bool, string) {
				_, held, _ := h.Counts()
				return held > 0, fmt.Sprint(held, " held")
			})
			before, _, _ := h.Counts()
			shutdown()
			if err := testutil.Wait(t, "the start's end", started); !errors.Is(err, ErrShuttingDown) {
				t.Fatalf("Start: %v, want ErrShuttingDown", err)
			}
			testutil.Wait(t, "the daemon's end", d.Done())
			arrived, _, _ := h.Counts()
			t.Logf("%d reads before the shutdown, %d after", before, arrived-before)
			// Every read that hangs holds its slot until the shutdown, and
			// none starts after it: those that came were all under way
			// (some maybe still connecting) when it began.
			if arrived > maxTargetReads {
				t.Errorf("%d reads came (%d after the shutdown began), want at most %d", arrived, arrived-before, maxTargetReads)
			}
			testutil.Eventually(t, "no read left open", func() (bool, string) {
				_, held, _ := h.Counts()
				return held == 0, fmt.Sprint(held, " held")
			})
		})
	}
}
