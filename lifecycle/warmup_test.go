package lifecycle

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// sharedTrace is the path of one of the project's shared traces, which sit
// beside the repository; a test that needs one fails when it is missing.
func sharedTrace(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "testdata", "mooncake", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("shared traces missing: %s (%v)", p, err)
	}
	return p
}

// TestCacheMatchesTheory replays a slice of the shared synthetic trace once
// against an emulated engine with an unbounded cache (block size 16): what
// it reports as cached must be what the theoretical model predicts, within
// 2%.
//
// The slice is the first 500 rows without those over 16,000 prompt tokens
// (max_isl): 321 rows, 1.07M prompt tokens, to keep the emulator's work
// (decoding the token ids of every prompt) to a few seconds under -race.
// The engine gets exactly the trace's tokens (completions, token_ids);
// outputs are capped at 4 tokens (max_osl), as they do not matter here.
// Requests go one at a time, from one closed-loop user: a request that
// overtakes an earlier one sharing its prefix misses blocks the model
// counts as hits, a property of the server's scheduling, not of the model
// tested here. A closed loop sends each row when the last answer is in,
// so that no row can fall behind a schedule and be dropped however slow
// the machine.
func TestCacheMatchesTheory(t *testing.T) {
	t.Parallel()
	const rows, maxISL = 500, 16000
	dir := t.TempDir()
	src, err := os.Open(sharedTrace(t, "synthetic_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var slice bytes.Buffer
	sent := 0 // rows left after max_isl
	sc := bufio.NewScanner(src)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for i := 0; i < rows && sc.Scan(); i++ {
		var row struct {
			InputLength int `json:"input_length"`
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			t.Fatal(err)
		}
		if row.InputLength <= maxISL {
			sent++
		}
		slice.Write(sc.Bytes())
		slice.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	daemontest.WriteFile(t, filepath.Join(dir, "slice.jsonl"), slice.Bytes())
	path := filepath.Join(dir, "kvload.yml")
	daemontest.WriteConfig(t, path, config.Config{
		Targets: []config.Target{{Name: "emu", API: "completions", PromptFormat: "token_ids",
			Emulate: &config.Emulate{CapacityBlocks: 0, BlockSize: 16}}},
		// The trace's own block size: the default.
		Workloads: []config.Workload{{Name: "synthetic", Trace: "slice.jsonl", Targets: []string{"emu"}, Loop: "once",
			MaxInFlight: 1, Schedule: config.Schedule{Users: 1},
			Synthesis: config.Synthesis{MaxISL: maxISL, MaxOSL: 4}}},
	})
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mfs testutil.Families
	testutil.Eventually(t, "one pass finished", func() (bool, string) {
		mfs = testutil.Gather(t, d.reg)
		done, _ := mfs.Value("kvload_requests_total")
		dropped, _ := mfs.Value("kvload_requests_dropped_total")
		loops, _ := mfs.Value("kvload_trace_loops_total")
		theo, _ := mfs.Value("kvload_theoretical_cached_prompt_tokens_total", "workload", "synthetic")
		return loops == 1 && done+dropped == float64(sent) && theo > 0,
			fmt.Sprintf("%v finished, %v dropped of %d, %v passes", done, dropped, sent, loops)
	})
	// The last request's counters are updated one after another.
	testutil.Eventually(t, "the last request counted", func() (bool, string) {
		mfs = testutil.Gather(t, d.reg)
		a, _ := mfs.Value("kvload_trace_prompt_tokens_total")
		b, _ := mfs.Value("kvload_prompt_tokens_total")
		return a == b, fmt.Sprint(a, b)
	})
	if v, _ := mfs.Value("kvload_requests_total", "outcome", "success"); v != float64(sent) {
		t.Errorf("%v successful requests, want %d", v, sent)
	}
	if v, _ := mfs.Value("kvload_requests_dropped_total"); v != 0 {
		t.Errorf("%v requests dropped, want 0", v)
	}
	cached, _ := mfs.Value("kvload_cached_prompt_tokens_total")
	theo, _ := mfs.Value("kvload_theoretical_cached_prompt_tokens_total")
	prompt, _ := mfs.Value("kvload_trace_prompt_tokens_total")
	ratio := cached / theo
	t.Logf("%d rows: cached %v, theoretical %v of %v prompt tokens: observed/theoretical %.4f", sent, cached, theo, prompt, ratio)
	if ratio < 0.98 || ratio > 1.02 {
		t.Errorf("observed/theoretical cached tokens %.4f (%v / %v), want within 2%% of 1", ratio, cached, theo)
	}
}
