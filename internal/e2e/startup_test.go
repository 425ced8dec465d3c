package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/cli"
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
		exit <- cli.Run(context.Background(), []string{"--config.file=" + path,
			"--web.listen-address=" + taken.Addr().String(), "--shutdown.drain-timeout=1s"}, io.Discard, &stderr)
	}()
	if code := testutil.WaitShowing(t, "an exit with the listen address taken", exit, &stderr); code != cli.ExitBadInput {
		t.Errorf("exit code %d, want %d:\n%s", code, cli.ExitBadInput, stderr.String())
	}
	if n := srv.Count("/v1/chat/completions"); n != 0 {
		t.Errorf("the target saw %d requests, want 0", n)
	}
	if log := stderr.String(); !strings.Contains(log, "address already in use") || strings.Contains(log, "replay started") {
		t.Errorf("the log should name the bind failure and no replay:\n%s", log)
	}
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
			daemontest.WriteConfig(t, path, daemontest.ManyTargets(h.URL, fixture(t, "future.jsonl"), targets, scraped))
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
			// The reads hang until cancelled, each holding one of the
			// daemon's 32 slots: none starts after SIGTERM.
			if arrived > 32 {
				t.Errorf("%d reads came, want at most 32, those under way at SIGTERM", arrived)
			}
			if log := p.stderr.String(); !strings.Contains(log, "stopped before the configuration was applied") {
				t.Errorf("the log does not say the start was cut short:\n%s", log)
			}
		})
	}
}

// largestTokenizeAnswers is a vLLM whose tokenize answers are the largest
// the exporter accepts: as many ids as the text sent has bytes, plus the
// specials' and, for a chat, a template's allowance, padded with blanks to
// just under the 1 MiB body bound. With absurd set it answers 2M ids
// instead, as a hostile target did (250 MB each, read whole).
func largestTokenizeAnswers(t *testing.T, absurd bool) *httptest.Server {
	t.Helper()
	const bodyBound, specials, template = 1 << 20, 16, 1024
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			io.WriteString(w, testutil.VLLMMetrics)
			return
		}
		var req struct {
			Prompt   string
			Messages []struct{ Role, Content string }
		}
		if r.URL.Path != "/tokenize" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.NotFound(w, r)
			return
		}
		n := len(req.Prompt) + specials
		for _, m := range req.Messages {
			n += len(m.Role) + len(m.Content) + template
		}
		if absurd {
			n = 2_000_000
		}
		body := []byte(`{"tokens": [` + strings.TrimSuffix(strings.Repeat("7,", n), ",") + `]`)
		if pad := bodyBound - len(body) - 1; pad > 0 {
			body = append(body, bytes.Repeat([]byte(" "), pad)...)
		}
		w.Write(append(body, '}'))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// peakRSS is the most resident memory the process pid has held, in bytes
// (VmHWM in /proc/PID/status); ok is false where there is no such file.
func peakRSS(t *testing.T, pid int) (int64, bool) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if kb, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(kb), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM: %q", line)
			}
			return n << 10, true
		}
	}
	return 0, false
}

// TestStartupReadsMemory: 20 targets answering their tokenize checks, all
// at once, with the largest answers the exporter accepts (1 MiB each, for
// the text and the chat form), or with 2M ids: the process's resident
// memory stays under 300 MiB. Answers of 2M ids, read whole, once took it
// to 4.2 GB and exported a ratio of 3906. Not under the race detector,
// whose shadow memory multiplies the figure.
func TestStartupReadsMemory(t *testing.T) {
	t.Parallel()
	if testutil.RaceEnabled {
		t.Skip("the race detector's own memory would be measured")
	}
	const targets, limit = 20, 300 << 20
	for _, absurd := range []bool{false, true} {
		t.Run(fmt.Sprint("absurd=", absurd), func(t *testing.T) {
			t.Parallel()
			srv := largestTokenizeAnswers(t, absurd)
			path := filepath.Join(t.TempDir(), "kvload.yml")
			cfg := daemontest.ManyTargets(srv.URL, fixture(t, "future.jsonl"), targets, false)
			for i := range cfg.Targets {
				cfg.Targets[i].API = "chat"
			}
			daemontest.WriteConfig(t, path, cfg)
			p := startProcess(t, "--config.file="+path, "--web.listen-address=127.0.0.1:0", "--shutdown.drain-timeout=1s")
			p.waitListening(t) // the checks are done
			rss, ok := peakRSS(t, p.cmd.Process.Pid)
			if !ok {
				t.Skip("no /proc here to read the process's memory from")
			}
			_, metrics := httpGet(t, p.base+"/metrics")
			ratios := strings.Count(metrics, "kvload_target_tokenize_ratio{")
			t.Logf("peak RSS %.1f MiB after %d targets' tokenize checks; %d ratios exported", float64(rss)/(1<<20), targets, ratios)
			if rss > limit {
				t.Errorf("peak RSS %.1f MiB, want under %d MiB", float64(rss)/(1<<20), limit>>20)
			}
			if want := map[bool]int{false: targets, true: 0}[absurd]; ratios != want {
				t.Errorf("%d tokenize ratios exported, want %d", ratios, want)
			}
			p.signal(t, syscall.SIGTERM)
			testutil.Wait(t, "the exit", p.exited)
		})
	}
}
