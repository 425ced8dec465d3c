package e2e

// End-to-end tests of the quickstart and the emulator: the daemon runs in
// this process (run, as main runs it) with its in-process emulated engines,
// and what it exports on /metrics is checked against each emulator's ground
// truth, GET /emulator/stats (the JSON of emulate.Engine.Stats). The
// TestE2E* tests are what `make test-e2e` runs, without the race detector;
// the heaviest skips itself under -race.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

const (
	e2eTraces   = "../../testdata/mooncake"
	e2eExamples = "../../examples"
	e2eFixtures = "testdata/e2e"
)

func e2eGet(u string) (int, []byte, error) {
	resp, err := http.Get(u)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func e2ePost(t *testing.T, u, body string) []byte {
	t.Helper()
	resp, err := http.Post(u, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s %s %v", u, resp.Status, out, err)
	}
	return out
}

// e2eTotals are one target's exported counters, summed over workloads
// unless a workload is given.
type e2eTotals struct {
	Finished, Success, Dropped, InFlight         float64
	PromptTokens, TracePromptTokens              float64
	CompletionTokens, CachedTokens, Theoretical  float64
	TTFTCount, DurationCount, ScheduleLagSamples float64
}

func e2eTotalsOf(m testutil.Families, target, workload string) e2eTotals {
	l := []string{"target", target}
	if workload != "" {
		l = append(l, "workload", workload)
	}
	return e2eTotals{
		Finished:           m.Sum("kvload_requests_total", l...),
		Success:            m.Sum("kvload_requests_total", append(l, "outcome", "success")...),
		Dropped:            m.Sum("kvload_requests_dropped_total", l...),
		InFlight:           m.Sum("kvload_requests_in_flight", l...),
		PromptTokens:       m.Sum("kvload_prompt_tokens_total", l...),
		TracePromptTokens:  m.Sum("kvload_trace_prompt_tokens_total", l...),
		CompletionTokens:   m.Sum("kvload_completion_tokens_total", l...),
		CachedTokens:       m.Sum("kvload_cached_prompt_tokens_total", l...),
		Theoretical:        m.Sum("kvload_theoretical_cached_prompt_tokens_total", l...),
		TTFTCount:          m.Sum("kvload_time_to_first_token_seconds", l...),
		DurationCount:      m.Sum("kvload_request_duration_seconds", l...),
		ScheduleLagSamples: m.Sum("kvload_schedule_lag_seconds", l...),
	}
}

// e2eWaitPass polls /metrics until workload has replayed its rows once
// against every target: the pass is counted, every row finished or was
// dropped, nothing is in flight, and a second scrape shows the same
// counters (a request's counters are updated one after another).
func e2eWaitPass(t *testing.T, d *e2eDaemon, workload string, rows int, targets ...string) testutil.Families {
	t.Helper()
	var last testutil.Families
	var lastSeen []e2eTotals
	testutil.Eventually(t, fmt.Sprintf("workload %s: a pass over %d rows", workload, rows), func() (bool, string) {
		m := testutil.Scrape(t, d.base)
		loops := m.Sum("kvload_trace_loops_total", "workload", workload)
		var seen []e2eTotals
		done := loops >= 1
		for _, tn := range targets {
			tt := e2eTotalsOf(m, tn, workload)
			seen = append(seen, tt)
			done = done && tt.Finished+tt.Dropped == float64(rows) && tt.InFlight == 0
		}
		settled := done && fmt.Sprint(seen) == fmt.Sprint(lastSeen)
		last, lastSeen = m, seen
		return settled, fmt.Sprintf("%v passes, per target %+v", loops, seen)
	})
	return last
}

// e2eStats is the emulator's ground truth.
func e2eStats(t *testing.T, emulatorURL string) emulate.Stats {
	t.Helper()
	code, body, err := e2eGet(emulatorURL + "/emulator/stats")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /emulator/stats: %d %v", code, err)
	}
	var s emulate.Stats
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("/emulator/stats: %v: %s", err, body)
	}
	return s
}

// e2eCheckTruth requires the exporter's counters for target (all
// workloads) to equal what its emulator counted, and every request to have
// succeeded.
func e2eCheckTruth(t *testing.T, m testutil.Families, target string, s emulate.Stats) e2eTotals {
	t.Helper()
	got := e2eTotalsOf(m, target, "")
	for _, c := range []struct {
		what     string
		exported float64
		truth    int64
	}{
		{"successful requests", got.Success, s.Success},
		{"prompt tokens", got.PromptTokens, s.PromptTokens},
		{"completion tokens", got.CompletionTokens, s.CompletionTokens},
		{"cached prompt tokens", got.CachedTokens, s.CachedTokens},
		{"TTFT histogram count", got.TTFTCount, s.Success},
		{"request duration histogram count", got.DurationCount, s.Success},
	} {
		if c.exported != float64(c.truth) {
			t.Errorf("target %s: exported %s %v, emulator counted %d", target, c.what, c.exported, c.truth)
		}
	}
	if got.Finished != got.Success {
		t.Errorf("target %s: %v requests finished, only %v successfully", target, got.Finished, got.Success)
	}
	if bad := s.Error500 + s.Error429 + s.Disconnected + s.Malformed + s.Hung + s.Rejected + s.Canceled; bad != 0 {
		t.Errorf("target %s: the emulator saw %d unsuccessful requests: %+v", target, bad, s)
	}
	return got
}

// e2eHead returns the first n rows of a JSONL trace (all if n ≤ 0).
func e2eHead(t *testing.T, path string, n int) []byte {
	t.Helper()
	if strings.HasPrefix(path, e2eTraces) {
		testutil.NeedShared(t, path)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for rows := 0; (n <= 0 || rows < n) && sc.Scan(); rows++ {
		out.Write(sc.Bytes())
		out.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n > 0 && bytes.Count(out.Bytes(), []byte("\n")) != n {
		t.Fatalf("%s has fewer than %d rows", path, n)
	}
	return out.Bytes()
}

// e2eDir writes files (name → content) into a new temporary directory
// and returns it.
func e2eDir(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func e2eFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e2eFixtures, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestE2EQuickstart runs examples/quickstart.yml as shipped, except that
// the trace is its first rows, replayed once and faster, and checks every
// exported total against the emulator's own count.
func TestE2EQuickstart(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	rows := 200
	if testutil.RaceEnabled {
		rows = 40
	}
	src, err := os.ReadFile(filepath.Join(e2eExamples, "quickstart.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(src, &cfg); err != nil {
		t.Fatal(err)
	}
	workloads, _ := cfg["workloads"].([]any)
	if len(workloads) != 1 {
		t.Fatalf("quickstart.yml has %d workloads; this test expects one", len(workloads))
	}
	w := workloads[0].(map[string]any)
	targets, _ := w["targets"].([]any)
	if len(targets) != 1 {
		t.Fatalf("the quickstart workload has %d targets; this test expects one", len(targets))
	}
	workload, target := w["name"].(string), targets[0].(string)
	trace := e2eHead(t, filepath.Join(e2eExamples, w["trace"].(string)), rows)
	w["trace"] = "head.jsonl"
	w["loop"] = "once"
	synthesis, _ := w["synthesis"].(map[string]any)
	if synthesis == nil {
		synthesis = map[string]any{}
		w["synthesis"] = synthesis
	}
	synthesis["speedup_ratio"] = 20
	edited, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := e2eDir(t, map[string][]byte{"quickstart.yml": edited, "head.jsonl": trace})

	d := e2eStart(t, filepath.Join(dir, "quickstart.yml"), target)
	m := e2eWaitPass(t, d, workload, rows, target)
	s := e2eStats(t, d.emulators[target])
	got := e2eCheckTruth(t, m, target, s)
	if got.Success == 0 {
		t.Fatalf("no request succeeded: %+v", got)
	}
	if got.ScheduleLagSamples != got.Finished {
		t.Errorf("%v schedule lag samples for %v requests sent", got.ScheduleLagSamples, got.Finished)
	}
	t.Logf("%d rows: %v sent, %v dropped; exporter = emulator: %v successes, %.0f prompt, %.0f completion, %.0f cached tokens (theoretical %.0f)",
		rows, got.Finished, got.Dropped, got.Success, got.PromptTokens, got.CompletionTokens, got.CachedTokens, got.Theoretical)
}

// TestE2ECacheRatio replays the whole Mooncake synthetic trace once against
// an emulated engine with an unbounded cache: the cached tokens it reports
// must be 95 to 100% of what the theoretical model predicts (see
// testdata/e2e/cache.yml for the settings). Then it turns the emulator's
// cache off and replays more: observed cached tokens must stop growing
// while the theoretical ones go on.
func TestE2ECacheRatio(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("tokenizes 61M prompt tokens: too slow under -race; run by `make test-e2e`")
	}
	const target = "emulated"
	full := e2eHead(t, filepath.Join(e2eTraces, "synthetic_trace.jsonl"), 0)
	rows := bytes.Count(full, []byte("\n"))
	const afterRows = 400
	dir := e2eDir(t, map[string][]byte{
		"kvload.yml":      e2eFixture(t, "cache.yml"),
		"synthetic.jsonl": full,
		"after.jsonl":     e2eHead(t, filepath.Join(e2eTraces, "synthetic_trace.jsonl"), afterRows),
	})
	cfg := filepath.Join(dir, "kvload.yml")
	d := e2eStart(t, cfg, target)

	start := time.Now()
	m := e2eWaitPass(t, d, "synthetic", rows, target)
	before := e2eCheckTruth(t, m, target, e2eStats(t, d.emulators[target]))
	if before.Dropped != 0 || before.Success != float64(rows) {
		t.Fatalf("%v of %d rows succeeded, %v dropped; want all of them sent and answered", before.Success, rows, before.Dropped)
	}
	// On /v1/completions the engine counts exactly the tokens of the
	// trace, here for every row of it.
	if before.PromptTokens != before.TracePromptTokens {
		t.Errorf("the engine counted %.0f prompt tokens, the trace says %.0f", before.PromptTokens, before.TracePromptTokens)
	}
	ratio := before.CachedTokens / before.Theoretical
	t.Logf("pass over %d rows in %v: observed cached %.0f / theoretical %.0f = %.4f (observed hit rate %.4f, theoretical %.4f)",
		rows, time.Since(start).Round(time.Millisecond), before.CachedTokens, before.Theoretical, ratio,
		before.CachedTokens/before.PromptTokens, before.Theoretical/before.TracePromptTokens)
	if !(ratio >= 0.95 && ratio <= 1.0) {
		t.Errorf("observed/theoretical cached tokens %.4f (%v / %v), want within [0.95, 1]", ratio, before.CachedTokens, before.Theoretical)
	}

	// A cache regression: the engine stops reusing prefixes.
	var state emulate.CacheState
	if err := json.Unmarshal(e2ePost(t, d.emulators[target]+"/emulator/cache", `{"enabled": false}`), &state); err != nil || state.Enabled {
		t.Fatalf("cache state after disabling: %+v %v", state, err)
	}
	// More traffic: a second workload on the same target, everything
	// already running unchanged.
	phase2 := append(e2eFixture(t, "cache.yml"), e2eFixture(t, "cache-after.yml")...)
	if err := os.WriteFile(cfg+".tmp", phase2, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(cfg+".tmp", cfg); err != nil {
		t.Fatal(err)
	}
	e2ePost(t, d.base+"/-/reload", "")
	m = e2eWaitPass(t, d, "after", afterRows, target)
	s := e2eStats(t, d.emulators[target])
	if s.Cache.Enabled {
		t.Fatalf("the reload restarted the emulator: its cache is on again")
	}
	all := e2eCheckTruth(t, m, target, s)
	after := e2eTotalsOf(m, target, "after")
	t.Logf("cache off, %d more rows: observed cached +%.0f, theoretical +%.0f", afterRows, all.CachedTokens-before.CachedTokens, after.Theoretical)
	if all.CachedTokens != before.CachedTokens || after.CachedTokens != 0 {
		t.Errorf("observed cached tokens grew by %v with the cache off (the new workload's: %v), want 0",
			all.CachedTokens-before.CachedTokens, after.CachedTokens)
	}
	if after.Success != afterRows || after.Theoretical <= 0 {
		t.Errorf("after disabling: %v of %d requests succeeded, theoretical cached tokens %v; want all, and > 0",
			after.Success, afterRows, after.Theoretical)
	}
	if got := e2eTotalsOf(m, target, "synthetic"); got.Theoretical != before.Theoretical || got.CachedTokens != before.CachedTokens {
		t.Errorf("the reload changed the finished workload's counters: %+v, before %+v", got, before)
	}
}

// TestE2EPromptTokens checks the prompt builder against a real tokenizer
// end to end: the emulator (o200k_base) counts exactly the trace's
// input_length for every prompt sent to /v1/completions; on
// /v1/chat/completions the exporter measures the chat template through the
// target's /tokenize before the first request and leaves it room, so that
// the server counts the trace's length too, except where a row's last
// block is too short to give the template all its room.
func TestE2EPromptTokens(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	rows := 150
	if testutil.RaceEnabled {
		rows = 30
	}
	slice := e2eHead(t, filepath.Join(e2eTraces, "synthetic_trace.jsonl"), rows)
	dir := e2eDir(t, map[string][]byte{
		"kvload.yml":  e2eFixture(t, "prompt-tokens.yml"),
		"slice.jsonl": slice,
	})
	d := e2eStart(t, filepath.Join(dir, "kvload.yml"), "completions", "chat")
	m := e2eWaitPass(t, d, "slice", rows, "completions", "chat")

	comp := e2eCheckTruth(t, m, "completions", e2eStats(t, d.emulators["completions"]))
	chat := e2eCheckTruth(t, m, "chat", e2eStats(t, d.emulators["chat"]))
	for _, tt := range []e2eTotals{comp, chat} {
		if tt.Success != float64(rows) || tt.TracePromptTokens == 0 {
			t.Fatalf("%v of %d requests succeeded (trace prompt tokens %v)", tt.Success, rows, tt.TracePromptTokens)
		}
	}
	t.Logf("completions: %.0f prompt tokens counted by the server for %.0f in the trace (%+.4f%%)",
		comp.PromptTokens, comp.TracePromptTokens, 100*(comp.PromptTokens-comp.TracePromptTokens)/comp.TracePromptTokens)
	if comp.PromptTokens != comp.TracePromptTokens {
		t.Errorf("completions: the server counted %v prompt tokens, the trace says %v", comp.PromptTokens, comp.TracePromptTokens)
	}

	// The chat template's cost of one user message, from the emulator's
	// /tokenize: the same text in a message and as a plain prompt.
	count := func(body string) int {
		var r struct {
			Count int `json:"count"`
		}
		if err := json.Unmarshal(e2ePost(t, d.emulators["chat"]+"/tokenize", body), &r); err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	overhead := count(`{"messages": [{"role": "user", "content": " alpha beta"}]}`) - count(`{"prompt": " alpha beta"}`)
	excess := chat.PromptTokens - chat.TracePromptTokens
	t.Logf("chat: %.0f prompt tokens for %.0f in the trace (%+.4f%%); the template is %d tokens (/tokenize), counted on top by %.1f requests",
		chat.PromptTokens, chat.TracePromptTokens, 100*excess/chat.TracePromptTokens, overhead, excess/float64(overhead))
	if overhead <= 0 {
		t.Fatalf("the emulator's chat template is %d tokens", overhead)
	}
	// The room comes off a row's last block (of 512 trace tokens), which
	// keeps one token of its own: a row whose last block is shorter than
	// the template plus one carries the rest of the template on top. Before
	// the measurement at start-up, every request sent until two answers had
	// come back carried all of it (20 to 86 of 150, with the machine's load).
	var short float64
	for i, line := range bytes.Split(bytes.TrimSpace(slice), []byte("\n")) {
		var row struct {
			InputLength int   `json:"input_length"`
			HashIDs     []int `json:"hash_ids"`
		}
		if err := json.Unmarshal(line, &row); err != nil {
			t.Fatalf("slice line %d: %v", i+1, err)
		}
		last := row.InputLength - (len(row.HashIDs)-1)*512
		short += float64(overhead - min(overhead, last-1))
	}
	if excess != short {
		t.Errorf("chat: %v prompt tokens over the trace's %v, want %v (the template's tokens that rows with a short last block cannot make room for)",
			excess, chat.TracePromptTokens, short)
	}
	if want := fmt.Sprintf("tokens=%d", overhead); !strings.Contains(d.log.String(), "chat template overhead read from the target's tokenize endpoint") || !strings.Contains(d.log.String(), want) {
		t.Errorf("the log does not say the template (%s) was measured:\n%s", want, d.log.String())
	}
}

// TestExampleConfigsCheck runs --config.check on every examples/*.yml: each
// must be valid as shipped, trace included.
func TestExampleConfigsCheck(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(e2eExamples, "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ab.yml", "dynamo.yml", "llamacpp.yml", "quickstart.yml", "server-metrics.yml", "sglang.yml", "trtllm.yml", "vllm.yml"}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("examples/*.yml = %v, want %v", names, want)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := cli.Run(context.Background(), []string{"--config.file", f, "--config.check"}, &stdout, &stderr)
			if code != cli.ExitOK {
				t.Errorf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
			}
		})
	}
}
