package lifecycle

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/synth"
)

// TestGeneratedWorkloadShared: a generator's rows are made once for its
// parameters, kept across a reload that keeps them, and made again when
// they change.
func TestGeneratedWorkloadShared(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	gen := &config.Generate{SharedPrefix: synth.SharedPrefix{Prefixes: 2, PrefixTokens: 32, Requests: 5, Rate: 0.001,
		InputTokens: config.TokenLengths{Mean: 10}, OutputTokens: config.TokenLengths{Mean: 2}}}
	cfg := daemontest.Config(srv.URL, "")
	cfg.Workloads[0].Generate = gen
	daemontest.WriteConfig(t, path, cfg)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	parses := d.traces.stats.parses.Load
	rows := d.units.byKey[unitKey{"w", "t"}].plan.Rows()
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
	if got := d.units.byKey[unitKey{"w", "t"}].plan.Rows().Len(); parses() != 2 || got != 6 {
		t.Errorf("after changing requests: %d rows, %d made; want 6, made twice", got, parses())
	}
}

// TestGeneratedShortPrefixNoted: the blog's workload, 256-token prefixes
// at 512-token blocks, shares nothing; Check warns, naming the block size
// and one that shares, and a start logs it.
func TestGeneratedShortPrefixNoted(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	cfg := daemontest.Config(srv.URL, "")
	cfg.Workloads[0].BlockSize = 512
	cfg.Workloads[0].Generate = &config.Generate{SharedPrefix: synth.SharedPrefix{Prefixes: 4, PrefixTokens: 256, Requests: 5, Rate: 0.001,
		InputTokens: config.TokenLengths{Mean: 10}, OutputTokens: config.TokenLengths{Mean: 2}}}
	daemontest.WriteConfig(t, path, cfg)
	notes, err := Check(path)
	if err != nil || len(notes) != 1 {
		t.Fatalf("Check = %q, %v; want one note", notes, err)
	}
	for _, want := range []string{"workload w: generate: the 256-token prefixes are shorter than workloads[0].block_size (512 tokens)",
		"a workloads[0].block_size of 256 "} {
		if !strings.Contains(notes[0], want) {
			t.Errorf("the note does not say %q:\n%s", want, notes[0])
		}
	}
	logs := &testutil.Buffer{}
	if _, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(logs) }); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "prefixes are shorter than workloads[0].block_size"); n != 1 {
		t.Errorf("the note is logged %d times, want once:\n%s", n, logs.String())
	}

	cfg.Workloads[0].BlockSize = 256
	daemontest.WriteConfig(t, path, cfg)
	if notes, err := Check(path); err != nil || len(notes) != 0 {
		t.Errorf("at the suggested block size: Check = %q, %v; want no note", notes, err)
	}
}
