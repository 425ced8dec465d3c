package shipping

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/cli"
)

// TestExamplePrompts: examples/prompts.jsonl, the README's sample for
// hash, hashes into a trace whose rows share the prefixes they share as
// text: the support conversations their system prompt, the follow-up its
// first turn.
func TestExamplePrompts(t *testing.T) {
	out := filepath.Join(t.TempDir(), "trace.jsonl")
	var stderr bytes.Buffer
	args := []string{"hash", filepath.Join(shippingRoot, "examples", "prompts.jsonl"), "-o", out, "--block-size", "16"}
	if code := cli.Run(context.Background(), args, &stderr, &stderr); code != cli.ExitOK {
		t.Fatalf("hash exited %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]int64
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r struct {
			HashIDs []int64 `json:"hash_ids"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r.HashIDs)
	}
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 5", len(rows))
	}
	shared := func(a, b []int64) int {
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		return n
	}
	if n := shared(rows[0], rows[1]); n < 3 {
		t.Errorf("support rows share %d blocks, want their system prompt's", n)
	}
	if n := shared(rows[0], rows[2]); n <= shared(rows[0], rows[1]) || n == len(rows[0]) {
		t.Errorf("the follow-up shares %d blocks with its first turn (%d)", n, len(rows[0]))
	}
	if shared(rows[3], rows[4]) < 1 || slices.Contains(rows[3], rows[0][0]) {
		t.Errorf("summaries %v %v should share their start and nothing with the support rows", rows[3], rows[4])
	}
}

// TestMakeStampsVersion: make run and make build link the version in, so
// the landing page's footer and --version name the commit.
func TestMakeStampsVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	for _, target := range []string{"build", "run"} {
		cmd := exec.Command("make", "-n", target)
		cmd.Dir = filepath.Join("..", "..")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		if !strings.Contains(string(out), "-X github.com/prometheus/common/version.Version=") ||
			!strings.Contains(string(out), "version.Revision=") {
			t.Errorf("make %s does not stamp the version:\n%s", target, out)
		}
	}
}
