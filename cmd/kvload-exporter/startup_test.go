package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestDaemonBindsBeforeSending: with its listen address already taken, the
// daemon exits 2 at once and the target never sees a request. (It used to
// start replaying, send a few requests, drain, and only then exit 1.)
func TestDaemonBindsBeforeSending(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { taken.Close() })
	srv := testutil.NewFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, daemontest.Config(srv.URL, fixture(t, "tiny.jsonl")))

	var stderr testutil.Buffer
	exit := make(chan int, 1)
	go func() {
		exit <- run(context.Background(), []string{"--config.file=" + path,
			"--web.listen-address=" + taken.Addr().String(), "--shutdown.drain-timeout=1s"},
			streams{stdout: io.Discard, stderr: &stderr})
	}()
	if code := testutil.WaitShowing(t, "an exit with the listen address taken", exit, &stderr); code != exitBadInput {
		t.Errorf("exit code %d, want %d:\n%s", code, exitBadInput, stderr.String())
	}
	if n := srv.Count("/v1/chat/completions"); n != 0 {
		t.Errorf("the target saw %d requests, want 0", n)
	}
	if log := stderr.String(); !strings.Contains(log, "address already in use") || strings.Contains(log, "replay started") {
		t.Errorf("the log should name the bind failure and no replay:\n%s", log)
	}
}

// hangingTargets is a configuration of n vLLM targets at url, all sent to
// by one workload. With scraped set every one is observed through its
// server metrics, read under /hang/.
func hangingTargets(t *testing.T, url string, n int, scraped bool) config.Config {
	w := daemontest.Workload("w", fixture(t, "future.jsonl"))
	var cfg config.Config
	for i := range n {
		tg := daemontest.Target(fmt.Sprintf("t%03d", i), url)
		if scraped {
			tg.Cache.Observed = engine.ObservedServerMetrics
			tg.Cache.MetricsURL = url + "/hang/metrics"
		}
		cfg.Targets = append(cfg.Targets, tg)
		w.Targets = append(w.Targets, tg.Name)
	}
	cfg.Workloads = []config.Workload{w}
	return cfg
}

// TestStartupWithHangingTargets: with 100 targets that accept connections
// and never answer, the process answers /-/healthy (and /-/ready 503)
// while its start-up reads of them still hang, and SIGTERM ends it, exit
// status 0, while they still hang: the reads are cancelled, and none
// starts after it. Either the cache layouts' and tokenize checks' reads
// hang, or only the server-metrics baselines. The web server once started
// only after every read, and the baselines ran one after another beyond
// SIGTERM's reach: 10 such targets kept /-/healthy silent 31 s, and a
// SIGTERM 5 s in took 28 s. The timings are logged, not asserted
// (docs/reliability.md records them).
func TestStartupWithHangingTargets(t *testing.T) {
	t.Parallel()
	const targets = 100
	for _, scraped := range []bool{false, true} {
		t.Run(fmt.Sprint("scraped=", scraped), func(t *testing.T) {
			t.Parallel()
			h := testutil.NewHangingServer(t, func(r *http.Request) bool {
				return !scraped || strings.HasPrefix(r.URL.Path, "/hang/")
			})
			path := filepath.Join(t.TempDir(), "kvload.yml")
			daemontest.WriteConfig(t, path, hangingTargets(t, h.URL, targets, scraped))
			began := time.Now()
			p := startProcess(t, "--config.file="+path, "--web.listen-address=127.0.0.1:0", "--shutdown.drain-timeout=2s")
			p.waitServing(t)
			testutil.Eventually(t, "start-up reads hanging", func() (bool, string) {
				_, held, _ := h.Counts()
				return held > 0, fmt.Sprint(held, " held")
			})
			healthy, _ := httpGet(t, p.base+"/-/healthy")
			healthyAfter := time.Since(began)
			ready, _ := httpGet(t, p.base+"/-/ready")
			_, held, _ := h.Counts()
			if healthy != http.StatusOK || ready != http.StatusServiceUnavailable || held == 0 {
				t.Fatalf("GET /-/healthy %d, /-/ready %d with %d reads hanging; want 200, 503 while some hang", healthy, ready, held)
			}

			before, _, _ := h.Counts()
			p.signal(t, syscall.SIGTERM)
			sent := time.Now()
			testutil.Wait(t, "the exit after SIGTERM", p.exited)
			exitAfter := time.Since(sent)
			if p.err != nil {
				t.Errorf("exit: %v, want status 0\n%s", p.err, p.stderr.String())
			}
			arrived, _, _ := h.Counts()
			t.Logf("/-/healthy answered %v after the start, with %d reads hanging; exit %v after SIGTERM; %d reads came, %d after SIGTERM",
				healthyAfter.Round(time.Millisecond), held, exitAfter.Round(time.Millisecond), arrived, arrived-before)
			// The reads hang until cancelled, each holding one of the 16
			// slots: none starts after SIGTERM.
			if arrived > 16 {
				t.Errorf("%d reads came, want at most 16, those under way at SIGTERM", arrived)
			}
			if log := p.stderr.String(); !strings.Contains(log, "stopped before the configuration was applied") {
				t.Errorf("the log does not say the start was cut short:\n%s", log)
			}
		})
	}
}
