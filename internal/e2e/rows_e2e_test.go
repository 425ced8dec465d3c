package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// e2eCacheRatio requires the observed cached tokens to be positive and
// within [lo, 1] of the theoretical ones.
func e2eCacheRatio(t *testing.T, got e2eTotals, lo float64) {
	t.Helper()
	ratio := got.CachedTokens / got.Theoretical
	t.Logf("observed cached %.0f / theoretical %.0f = %.4f of %.0f prompt tokens", got.CachedTokens, got.Theoretical, ratio, got.PromptTokens)
	if got.CachedTokens <= 0 || !(ratio >= lo && ratio <= 1) {
		t.Errorf("observed/theoretical cached tokens %.0f/%.0f, want > 0 and a ratio within [%v, 1]", got.CachedTokens, got.Theoretical, lo)
	}
}

// TestE2EHashExampleReplays: the sample prompts hashed as docs/tools.md
// prints it (16-token blocks) replay against the emulator with the
// workload's block_size the docs show, sharing their system prompt; read
// with the default block size instead, the trace is accepted with a
// warning that names block_size.
func TestE2EHashExampleReplays(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	dir := t.TempDir()
	tracePath := filepath.Join(dir, "prompts-trace.jsonl")
	if code, _, stderr := runCLI("hash", filepath.Join(e2eExamples, "prompts.jsonl"), tracePath, "16"); code != cli.ExitOK {
		t.Fatalf("hash: exit %d: %s", code, stderr)
	}
	const config = `targets:
  - name: demo
    api: completions
    emulate: {block_size: 16}
workloads:
  - name: prompts
    trace: prompts-trace.jsonl
    targets: [demo]
    synthesis: {speedup_ratio: 10}
    loop: once
`
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// Without block_size: 512-token blocks, which the rows' ids overfill.
	code, out, _ := runCLI("--config.file="+write("default.yml", config), "--config.check")
	if code != cli.ExitOK || !strings.Contains(out, "warning: workload prompts:") || !strings.Contains(out, "5 rows have more hash_ids") ||
		!strings.Contains(out, "workloads[0].block_size (512)") {
		t.Errorf("--config.check without block_size: exit %d, output %q; want 0 and a warning naming workloads[0].block_size", code, out)
	}

	cfg := write("kvload.yml", strings.Replace(config, "    loop: once\n", "    loop: once\n    block_size: 16\n", 1))
	if code, out, _ := runCLI("--config.file="+cfg, "--config.check"); code != cli.ExitOK || strings.Contains(out, "warning") {
		t.Errorf("--config.check with block_size 16: exit %d, output %q; want 0 and no warning", code, out)
	}
	d := e2eStart(t, cfg, "demo")
	m := e2eWaitPass(t, d, "prompts", 5, "demo")
	got := e2eCheckTruth(t, m, "demo", e2eStats(t, d.emulators["demo"]))
	if got.Success != 5 || got.PromptTokens != got.TracePromptTokens {
		t.Errorf("%v of 5 requests succeeded; the engine counted %v prompt tokens for the trace's %v", got.Success, got.PromptTokens, got.TracePromptTokens)
	}
	e2eCacheRatio(t, got, 0.95)
	if strings.Contains(d.log.String(), "more hash_ids") {
		t.Errorf("a warning about hash_ids with the right block_size:\n%s", d.log.String())
	}
}

// TestE2EAIPerfDocRows: the rows of AIPerf's trace documentation, one with
// an id more than its 655 tokens fill, replay against the emulator with
// prompts of exactly their input_length, and the log says once that a row
// had an id to spare.
func TestE2EAIPerfDocRows(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	dir := e2eDir(t, map[string][]byte{
		"doc.jsonl": []byte(testutil.AIPerfDocRows),
		"kvload.yml": []byte(`targets:
  - name: demo
    api: completions
    emulate: {block_size: 16}
workloads:
  - name: doc
    trace: doc.jsonl
    targets: [demo]
    loop: once
`),
	})
	d := e2eStart(t, filepath.Join(dir, "kvload.yml"), "demo")
	m := e2eWaitPass(t, d, "doc", 4, "demo")
	got := e2eCheckTruth(t, m, "demo", e2eStats(t, d.emulators["demo"]))
	if got.Success != 4 || got.TracePromptTokens != 655+1200+1800+1300 || got.PromptTokens != got.TracePromptTokens {
		t.Errorf("%v of 4 requests succeeded; %v prompt tokens counted by the engine, %v in the trace; want 4955 each",
			got.Success, got.PromptTokens, got.TracePromptTokens)
	}
	if n := strings.Count(d.log.String(), "1 row has more hash_ids than its input_length fills in 512-token blocks (line 1)"); n != 1 {
		t.Errorf("the warning about the row with an id to spare is logged %d times, want once:\n%s", n, d.log.String())
	}
}

// TestE2EGeneratedWorkload: a workload that names a shared-prefix
// generator instead of a trace checks and replays with no file at all,
// and the engine serves the prefixes and earlier turns from its cache.
func TestE2EGeneratedWorkload(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	dir := e2eDir(t, map[string][]byte{"kvload.yml": []byte(`targets:
  - name: demo
    api: completions
    emulate: {block_size: 16}
workloads:
  - name: gen
    generate:
      prefixes: 4
      prefix_tokens: 256
      requests: 60
      input_tokens: {mean: 64, stddev: 16}
      output_tokens: {mean: 8}
      turns: 2
      rate: 40
      arrival: constant
    block_size: 16
    seed: 3
    targets: [demo]
    loop: once
    on_saturation: queue
`)})
	cfg := filepath.Join(dir, "kvload.yml")
	if code, out, _ := runCLI("--config.file="+cfg, "--config.check"); code != cli.ExitOK {
		t.Fatalf("--config.check: exit %d: %s", code, out)
	}
	d := e2eStart(t, cfg, "demo")
	m := e2eWaitPass(t, d, "gen", 60, "demo")
	got := e2eCheckTruth(t, m, "demo", e2eStats(t, d.emulators["demo"]))
	if got.Success != 60 || got.PromptTokens != got.TracePromptTokens {
		t.Errorf("%v of 60 requests succeeded; the engine counted %v prompt tokens for the rows' %v", got.Success, got.PromptTokens, got.TracePromptTokens)
	}
	e2eCacheRatio(t, got, 0.9)
}
