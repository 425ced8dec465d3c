package e2e

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// readmeExitCodes parses the README's "Exit codes:" line into meaning →
// code.
func readmeExitCodes(t *testing.T) map[string]int {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^Exit codes: (.*)\.$`).FindSubmatch(readme)
	if line == nil {
		t.Fatal(`README.md has no "Exit codes: ..." line`)
	}
	codes := map[string]int{}
	for _, part := range strings.Split(string(line[1]), ", ") {
		num, meaning, ok := strings.Cut(part, " ")
		n, err := strconv.Atoi(num)
		if !ok || err != nil {
			t.Fatalf("README exit code %q: not NUMBER MEANING", part)
		}
		codes[meaning] = n
	}
	return codes
}

// TestExitCodesMatchREADME holds the README's documented exit codes and
// the binary's together: each invocation exits with the code the README
// gives for its case.
func TestExitCodesMatchREADME(t *testing.T) {
	t.Parallel()
	readme := readmeExitCodes(t)
	const (
		ok      = "ok"
		runtime = "runtime failure"
		bad     = "bad usage or bad input"
	)
	if len(readme) != 3 || readme[ok] != cli.ExitOK || readme[runtime] != cli.ExitFailure || readme[bad] != cli.ExitBadInput {
		t.Fatalf("README's exit codes %v; the binary's: %d %s, %d %s, %d %s", readme, cli.ExitOK, ok, cli.ExitFailure, runtime, cli.ExitBadInput, bad)
	}

	dir := t.TempDir()
	good := fixture(t, "check-good.yml")
	badCfg := filepath.Join(dir, "bad.yml")
	daemontest.WriteFile(t, badCfg, "targets: [\n")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { taken.Close() })

	tests := []struct {
		name string
		ctx  context.Context
		args []string
		want string // the README's meaning
	}{
		{"--version", context.Background(), []string{"--version"}, ok},
		{"--config.check of a good file", context.Background(), []string{"--config.file=" + good, "--config.check"}, ok},
		{"an unknown flag", context.Background(), []string{"--no-such-flag"}, bad},
		{"--config.check of a bad file", context.Background(), []string{"--config.file=" + badCfg, "--config.check"}, bad},
		{"--config.check of a missing file", context.Background(), []string{"--config.file=" + filepath.Join(dir, "none.yml"), "--config.check"}, bad},
		{"a start with a bad file", context.Background(), []string{"--config.file=" + badCfg, "--web.listen-address=127.0.0.1:0"}, bad},
		{"a start on a taken port", context.Background(), []string{"--config.file=" + good, "--web.listen-address=" + taken.Addr().String()}, bad},
		{"emulate unable to listen", context.Background(), []string{"emulate", "--listen", "256.0.0.1:bad"}, bad},
		{"emulate on a taken port", context.Background(), []string{"emulate", "--listen", taken.Addr().String()}, bad},
		{"synthesize onto a full device", context.Background(), []string{"synthesize", "--num-requests", "10", "-o", "/dev/full", filepath.Join(e2eTraces, "conversation_trace.jsonl")}, runtime},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr testutil.Buffer
			code := cli.Run(tt.ctx, tt.args, io.Discard, &stderr)
			if code != readme[tt.want] {
				t.Errorf("exit code %d, the README says %d (%s):\n%s", code, readme[tt.want], tt.want, stderr.String())
			}
		})
	}
}
