package cli

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCheckTellsEveryProblem: --config.check reports every problem
// of a file in one run, each with its line: a dialect typo, a URL with the
// API's path (with the base URL to give), an unknown target (with the
// name a typo away), a type error in YAML's words, and a missing trace.
func TestConfigCheckTellsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kvload.yml")
	const file = `targets:
  - name: vllm-a
    url: http://localhost:8000/v1/chat/completions
    model: m
    dialect: vlm
workloads:
  - name: w
    trace: missing.jsonl
    targets: [vllm-b]
  - name: w2
    trace: ` + sharedSynthetic + `
    targets: vllm-a
`
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := runCLI("--config.file", path, "--config.check")
	if code != exitBadInput {
		t.Errorf("exit %d, want 2", code)
	}
	for _, want := range []string{
		`targets[0].url: http://localhost:8000/v1/chat/completions: give the base URL, http://localhost:8000: the exporter adds /v1 and the API's path (line 3)`,
		`targets[0].dialect: "vlm" is not one of vllm, sglang, trtllm, dynamo, llamacpp, ollama, openai (line 5)`,
		`workloads[0].targets[0]: unknown target "vllm-b"; did you mean "vllm-a"? (line 9)`,
		`workloads[0].trace (line 8): "missing.jsonl": no such file or directory`,
		`workloads[1].targets: expected a list, got the string "vllm-a" (line 12)`,
	} {
		if !strings.Contains(stdout, path+": "+want) {
			t.Errorf("the check does not say %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "workloads[1].targets: at least one target") {
		t.Errorf("the check repeats what follows from the type error:\n%s", stdout)
	}
}

// TestConfigCheckSyntaxLine: a YAML syntax error names the line to fix,
// not the line where its block began.
func TestConfigCheckSyntaxLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvload.yml")
	if err := os.WriteFile(path, []byte("targets:\n  - name: a\n    url: http://a:8000\n   model: m\nworkloads: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := runCLI("--config.file", path, "--config.check")
	if code != exitBadInput || !strings.Contains(stdout, "invalid YAML: line 4: ") {
		t.Errorf("exit %d:\n%s\nwant 2 and line 4", code, stdout)
	}
}

// TestBusyPortSuggestsTheFlag: a listen address another process holds
// fails the start with exit 2 and the flag that chooses another.
func TestBusyPortSuggestsTheFlag(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	code, _, stderr := runCLI("--config.file", "../../examples/quickstart.yml", "--web.listen-address", taken.Addr().String(), "--memory.limit", "0")
	if code != exitBadInput || !strings.Contains(stderr, "address already in use: another process listens on "+taken.Addr().String()+"; give another address with --web.listen-address") {
		t.Errorf("exit %d, stderr:\n%s\nwant 2 and the flag", code, stderr)
	}
}
