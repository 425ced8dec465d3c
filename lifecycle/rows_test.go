package lifecycle

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// TestSurplusIDsNotedOnce: a trace whose rows have more hash_ids than
// their input_length fills is replayed from the ids that fit; Check says
// so, naming the workload's block_size, and the daemon logs it once per
// file read, not at a reload that keeps the file.
func TestSurplusIDsNotedOnce(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	tracePath, path := filepath.Join(dir, "t.jsonl"), filepath.Join(dir, "kvload.yml")
	// In 16-token blocks: 20 tokens fill 2 of 3 ids, 40 tokens 3 of 5.
	daemontest.WriteFile(t, tracePath, `{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 3600000, "input_length": 40, "output_length": 1, "hash_ids": [1, 2, 4, 5, 6]}
{"timestamp": 7200000, "input_length": 16, "output_length": 1, "hash_ids": [1]}
`)
	cfg := daemontest.Config(srv.URL, tracePath)
	daemontest.WriteConfig(t, path, cfg)

	notes, err := Check(path)
	want := "workload w: " + tracePath + ": 2 rows have more hash_ids than their input_length fills in 16-token blocks (the first at line 1): 3 ids to spare in all, at most 2 in one row; their prompts use the ids that fit. Is workloads[0].block_size (16) the block size the trace was made with?"
	if err != nil || len(notes) != 1 || notes[0] != want {
		t.Fatalf("Check = %q, %v; want\n%q", notes, err, want)
	}

	logs := &testutil.Buffer{}
	d, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(logs) })
	if err != nil {
		t.Fatal(err)
	}
	rows := d.units[unitKey{"w", "t"}].plan.Rows()
	for i, n := range []int{2, 3, 1} {
		if ids, _ := rows.AppendHashIDs(nil, i); len(ids) != n {
			t.Errorf("row %d replays %v, want the %d ids that fit", i+1, ids, n)
		}
	}
	cfg.Workloads[0].MaxInFlight = 7 // a change that keeps the file
	daemontest.WriteConfig(t, path, cfg)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "2 rows have more hash_ids"); n != 1 {
		t.Errorf("the note is logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestTooFewIDsNamesBlockSize: a row whose ids cannot hold its length at
// the workload's block size is an error that names the block_size key.
func TestTooFewIDsNamesBlockSize(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tracePath, path := filepath.Join(dir, "t.jsonl"), filepath.Join(dir, "kvload.yml")
	daemontest.WriteFile(t, tracePath, `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`+"\n")
	cfg := daemontest.Config("http://127.0.0.1:1", tracePath)
	cfg.Workloads[0].BlockSize = 64
	daemontest.WriteConfig(t, path, cfg)
	_, err := Check(path)
	if !errors.Is(err, trace.ErrTooFewHashIDs) || !strings.Contains(err.Error(), "t.jsonl:1: input_length 600 does not fit 2 hash_ids of 64-token blocks: it needs 10; workloads[0].block_size is 64 tokens") {
		t.Errorf("Check: %v", err)
	}
}

// TestGeneratedWorkloadShared: a generator's rows are made once for its
// parameters, kept across a reload that keeps them, and made again when
// they change.
func TestGeneratedWorkloadShared(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	gen := &config.Generate{Prefixes: 2, PrefixTokens: 32, Requests: 5, Rate: 0.001,
		InputTokens: config.TokenLengths{Mean: 10}, OutputTokens: config.TokenLengths{Mean: 2}}
	cfg := daemontest.Config(srv.URL, "")
	cfg.Workloads[0].Generate = gen
	daemontest.WriteConfig(t, path, cfg)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	parses := d.traces.stats.parses.Load
	rows := d.units[unitKey{"w", "t"}].plan.Rows()
	if rows.Len() != 5 || rows.ISL(0) != 42 || parses() != 1 {
		t.Fatalf("%d rows, the first of %d tokens, %d made; want 5 of 42, made once", rows.Len(), rows.ISL(0), parses())
	}
	cfg.Workloads[0].MaxInFlight = 3
	daemontest.WriteConfig(t, path, cfg)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if parses() != 1 {
		t.Errorf("a reload that keeps the generator made its rows again")
	}
	gen.Requests = 6
	daemontest.WriteConfig(t, path, cfg)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := d.units[unitKey{"w", "t"}].plan.Rows().Len(); parses() != 2 || got != 6 {
		t.Errorf("after changing requests: %d rows, %d made; want 6, made twice", got, parses())
	}
}
