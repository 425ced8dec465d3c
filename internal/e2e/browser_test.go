//go:build browser

package e2e

// The landing page in a real browser: headless Chromium (Debian's
// chromium) loads it from a daemon replaying against five emulated
// engines (healthy, failing, degraded, reporting no cached tokens, never
// answering), and the test reads what it rendered (its DOM
// after load) and takes a screenshot. `make test-browser` runs it; the
// build tag keeps it out of a plain `go test ./...`, which may lack the
// browser. KVLOAD_SCREENSHOT=path keeps the screenshot there, relative to
// the repository (make screenshot writes docs/landing-page.png).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// chromiumBin is Debian's chromium; `make test-browser` installs it.
const chromiumBin = "/usr/bin/chromium"

// chromium runs headless Chromium on args plus url, and returns its stdout.
// Shared memory goes to the temporary directory: Debian's launcher decides
// that from findmnt, whose answer it misreads when /dev/shm is mounted twice.
// A browser killed by a signal is the machine's crash, not the page's: it is
// logged and run again, at most crashRuns times in all.
func chromium(t *testing.T, ctx context.Context, url string, args ...string) []byte {
	t.Helper()
	const crashRuns = 3
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage"}
	for run := 1; ; run++ {
		argv := append(append(append([]string{}, base...), "--user-data-dir="+t.TempDir()), args...)
		cmd := exec.CommandContext(ctx, chromiumBin, append(argv, url)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err == nil {
			return stdout.Bytes()
		}
		var exit *exec.ExitError
		crashed := errors.As(err, &exit) && ctx.Err() == nil && exit.ProcessState.Sys().(syscall.WaitStatus).Signaled()
		if !crashed || run == crashRuns {
			t.Fatalf("chromium %v (run %d): %v\n%s", args, run, err, stderr.String())
		}
		t.Logf("chromium %v crashed (run %d of %d), running it again: %v\n%s", args, run, crashRuns, err, stderr.String())
	}
}

// rowOf is the <tr> of table id for target, as rendered.
func rowOf(t *testing.T, dom, table, target string) string {
	t.Helper()
	start := strings.Index(dom, `<table id="`+table+`"`)
	if start < 0 {
		t.Fatalf("no table %q in:\n%s", table, dom)
	}
	end := strings.Index(dom[start:], "</table>")
	tbl := dom[start : start+end]
	re := regexp.MustCompile(`(?s)<tr[^>]*data-target="` + regexp.QuoteMeta(target) + `"[^>]*>.*?</tr>`)
	row := re.FindString(tbl)
	if row == "" {
		t.Fatalf("table %q has no row for %q:\n%s", table, target, tbl)
	}
	return row
}

// cells are the texts of a row's <td> cells.
func cells(row string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(row, -1) {
		out = append(out, text(m[1]))
	}
	return out
}

// Columns of the health table (landing.html).
const (
	colInFlight = 6
	colDropped  = 7
	colLag      = 8
	colPasses   = 9
)

// text is markup without its tags, spaces squeezed.
func text(markup string) string {
	s := regexp.MustCompile(`<[^>]+>`).ReplaceAllString(markup, " ")
	return strings.Join(strings.Fields(s), " ")
}

func TestBrowserLandingPage(t *testing.T) {
	if _, err := os.Stat(chromiumBin); err != nil {
		t.Fatalf("%s: %v (make test-browser installs it)", chromiumBin, err)
	}
	back := newFaultTarget(t, emulate.Config{Faults: emulate.Faults{Error500: 1}})
	cfg := strings.ReplaceAll(browserConfig, recoveringURL, back.srv.URL)
	dir := e2eDir(t, map[string][]byte{"kvload.yml": []byte(cfg), "trace.jsonl": browserTrace(100)})
	d := e2eStart(t, filepath.Join(dir, "kvload.yml"), "healthy", "failing", "flaky", "no-cached-count", "stalled")

	// Enough finished requests per target for every figure to be there,
	// a completed pass (100 rows, 10 s), and 20 failures of the engine that
	// comes back.
	testutil.Eventually(t, "40 finished requests per target and a pass", func() (bool, string) {
		m := testutil.Scrape(t, d.base)
		var seen []string
		ok := true
		for _, tn := range []string{"healthy", "failing", "flaky", "no-cached-count"} {
			n := e2eTotalsOf(m, tn, "canary").Finished
			seen = append(seen, fmt.Sprintf("%s %v", tn, n))
			ok = ok && n >= 40
		}
		failed := e2eTotalsOf(m, "recovering", "canary").Finished
		seen = append(seen, fmt.Sprintf("recovering %v", failed))
		ok = ok && failed >= 20
		passes := m.Sum("kvload_trace_loops_total", "workload", "canary")
		seen = append(seen, fmt.Sprintf("passes %v", passes))
		return ok && passes >= 1, strings.Join(seen, ", ")
	})

	// The recovering engine failed every request so far; it comes back,
	// and the page says so while its failures are still in the window.
	failedBefore := e2eTotalsOf(testutil.Scrape(t, d.base), "recovering", "canary").Finished
	if failedBefore < 20 {
		t.Fatalf("the recovering engine failed %v requests before coming back, want >= 20", failedBefore)
	}
	back.setFaults(t, `{}`)
	testutil.Eventually(t, "the recovering engine's row reads recovering", func() (bool, string) {
		_, page := httpGet(t, d.base+"/")
		row := rowOf(t, page, "health", "recovering")
		// The state's class: the target's own name reads "recovering" too.
		return strings.Contains(row, `class="state rec"`), text(row)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dom := string(chromium(t, ctx, d.base+"/", "--dump-dom"))

	// On a starved machine the exporter itself can fall behind the trace,
	// and the page rightly says so: a row degraded for its own pace alone
	// is that machine's, not the state under test.
	behind := regexp.MustCompile(`^(schedule lag p99 \d+ ms|\d+ scheduled requests dropped)`)
	states := map[string]string{}
	paced := map[string]bool{}
	for _, tn := range []string{"healthy", "failing", "flaky", "no-cached-count", "recovering", "stalled"} {
		row := rowOf(t, dom, "health", tn)
		m := regexp.MustCompile(`<span class="state [a-z]+">([a-z ]+)</span><span class="reason">([^<]*)</span>`).FindStringSubmatch(row)
		if m == nil {
			t.Fatalf("health/%s: no state in %s", tn, row)
		}
		states[tn] = m[1]
		paced[tn] = m[1] == "degraded" && behind.MatchString(m[2])
		if paced[tn] {
			t.Logf("health/%s: the exporter fell behind on this machine: %s", tn, m[2])
		}
	}

	// The verdict comes first, counts the healthy pairs and names the
	// others, worst first.
	verdict := regexp.MustCompile(`(?s)<p id="verdict" class="verdict bad">(.*?)</p>`).FindStringSubmatch(dom)
	if verdict == nil {
		t.Errorf("no verdict line of class bad in the page")
	} else {
		healthy, byState := 0, map[string][]string{}
		workload := map[string]string{"stalled": "hung"}
		for _, tn := range []string{"failing", "flaky", "healthy", "no-cached-count", "recovering", "stalled"} {
			if states[tn] == "ok" {
				healthy++
				continue
			}
			w := workload[tn]
			if w == "" {
				w = "canary"
			}
			byState[states[tn]] = append(byState[states[tn]], w+"/"+tn)
		}
		want := fmt.Sprintf("%d of 6 workload/target pairs healthy.", healthy)
		var parts []string
		for _, st := range []string{"failing", "degraded", "recovering", "not reported"} {
			if len(byState[st]) > 0 {
				parts = append(parts, st+": "+strings.Join(byState[st][:min(4, len(byState[st]))], ", "))
			}
		}
		if got := text(verdict[1]); !strings.HasPrefix(got, want+" "+strings.Join(parts, "; ")) {
			t.Errorf("verdict %q, want it to start %q", got, want+" "+strings.Join(parts, "; "))
		}
		if !paced["healthy"] && !paced["no-cached-count"] && !paced["recovering"] && !paced["flaky"] {
			if want := "2 of 6 workload/target pairs healthy. failing: canary/failing; degraded: canary/flaky; recovering: canary/recovering; not reported: hung/stalled."; text(verdict[1]) != want {
				t.Errorf("verdict %q, want %q", text(verdict[1]), want)
			}
		}
	}
	if strings.Index(dom, `id="verdict"`) > strings.Index(dom, `<table`) {
		t.Errorf("the verdict is not above the tables")
	}
	for _, h := range []string{"<h2>Health</h2>", "<h2>Cache</h2>", "<h2>Targets</h2>"} {
		if !strings.Contains(dom, h) {
			t.Errorf("page lacks the heading %s", h)
		}
	}

	for _, tt := range []struct {
		table, target string
		want          []string // in the row's text, in order
		class         string   // the state's colour class
	}{
		{"health", "healthy", []string{"canary", "healthy", "ok", "none failed"}, "state ok"},
		{"health", "failing", []string{"canary", "failing", "failing", "requests failed (100.0%), mostly http_error", "http_error", "http_error (HTTP 500)"}, "state bad"},
		{"health", "flaky", []string{"flaky", "degraded", "requests failed", "mostly http_error", "http_error (HTTP 500)"}, "state warn"},
		{"health", "no-cached-count", []string{"no-cached-count", "ok"}, "state ok"},
		{"health", "recovering", []string{"canary", "recovering", "recovering", "requests succeeded, since", "the window still holds", "requests failed", "mostly http_error"}, "state rec"},
		{"health", "stalled", []string{"hung", "stalled", "not reported", "no request finished in the last 1m0s", "none"}, "state none"},
		{"cache", "healthy", []string{"ms", "ms", "%", "%"}, "state ok"},
		{"cache", "no-cached-count", []string{"not reported", "%", "not reported"}, "state none"},
		{"cache", "failing", []string{"–", "–", "–", "–", "no success"}, "state none"},
		{"targets", "healthy", []string{"healthy", "kvload-emulated", "chat", "vllm", "16", "4096", "read from vllm:cache_config_info"}, ""},
		{"targets", "failing", []string{"failing", "16", "unbounded"}, ""},
	} {
		if tt.table == "health" && paced[tt.target] {
			continue
		}
		row := rowOf(t, dom, tt.table, tt.target)
		txt := text(row)
		rest := txt
		for _, w := range tt.want {
			i := strings.Index(rest, w)
			if i < 0 {
				t.Errorf("%s/%s: %q missing (in order) from %q", tt.table, tt.target, w, txt)
				break
			}
			rest = rest[i+len(w):]
		}
		if tt.class != "" && !strings.Contains(row, `class="`+tt.class+`"`) {
			t.Errorf("%s/%s: no %q in %s", tt.table, tt.target, tt.class, row)
		}
	}
	// The counters beside the health: a pass completed, nothing dropped,
	// and the stalled target's hung requests in flight.
	for _, tt := range []struct {
		target       string
		col          int
		what         string
		ok           func(v float64) bool
		want, suffix string
	}{
		{"healthy", colPasses, "passes", func(v float64) bool { return v >= 1 }, ">= 1", ""},
		{"healthy", colDropped, "dropped", func(v float64) bool { return v == 0 }, "0", ""},
		{"healthy", colLag, "schedule lag p99", func(v float64) bool { return v >= 0 && v < 60_000 }, "a few ms", " ms"},
		{"stalled", colInFlight, "in flight", func(v float64) bool { return v >= 1 }, ">= 1", ""},
		{"stalled", colDropped, "dropped", func(v float64) bool { return v == 0 }, "0", ""},
	} {
		c := cells(rowOf(t, dom, "health", tt.target))
		if len(c) <= tt.col {
			t.Errorf("health/%s: %d cells: %q", tt.target, len(c), c)
			continue
		}
		cell := c[tt.col]
		v, err := strconv.ParseFloat(strings.TrimSuffix(cell, tt.suffix), 64)
		if err != nil || !strings.HasSuffix(cell, tt.suffix) || !tt.ok(v) {
			t.Errorf("health/%s: %s reads %q, want %s%s", tt.target, tt.what, cell, tt.want, tt.suffix)
		}
	}
	// TTFT is always in milliseconds.
	if cache := rowOf(t, dom, "cache", "healthy"); regexp.MustCompile(`\d(µs|s)<`).MatchString(cache) {
		t.Errorf("TTFT not in ms: %s", text(cache))
	}
	for _, want := range []string{`http-equiv="refresh" content="10"`, "this page refreshes every 10 s", "Updated at 20", "<b>Window</b>"} {
		if !strings.Contains(dom, want) {
			t.Errorf("page lacks %q", want)
		}
	}

	shot := filepath.Join(t.TempDir(), "landing.png")
	if keep := os.Getenv("KVLOAD_SCREENSHOT"); keep != "" {
		if !filepath.IsAbs(keep) {
			keep = filepath.Join("..", "..", keep) // relative to the repository
		}
		shot, _ = filepath.Abs(keep)
	}
	chromium(t, ctx, d.base+"/", "--screenshot="+shot, "--window-size=1500,1200", "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
		t.Fatalf("screenshot %s: %d bytes, %v", shot, len(png), err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
}
