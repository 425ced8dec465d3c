package cli

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/synth"
)

var updateSynthesize = flag.Bool("update-synthesize", false, "rewrite the synthesize golden files")

const (
	synthTestdata          = "../../synth/testdata/synthesize"
	synthConversationTrace = "../../testdata/mooncake/conversation_trace.jsonl"
)

// runSynthesize runs the command and returns exit code, stdout and stderr.
func runSynthesize(ctx context.Context, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(ctx, append([]string{"synthesize"}, args...), streams{stdout: &out, stderr: &errOut})
	return code, out.String(), errOut.String()
}

func TestSynthesizeGolden(t *testing.T) {
	mixed := filepath.Join(synthTestdata, "mixed.jsonl")
	tests := []struct {
		golden string
		args   []string
		stderr []string
	}{
		{"mixed.transform.golden.jsonl",
			[]string{mixed, "--prefix-len-multiplier", "2", "--speedup-ratio", "2", "--prefix-root-multiplier", "2", "--seed", "1", "--max-isl", "5000", "--max-osl", "400"},
			[]string{"read 8 rows", "transformed 7 rows", "dropped 1 input rows with input_length > 5000"}},
		{"mixed.caps.golden.jsonl",
			[]string{mixed, "--max-isl", "5000", "--max-osl", "400"},
			[]string{"transformed 7 rows", "dropped 1 input rows"}},
		{"conversation.generate.golden.jsonl",
			[]string{synthConversationTrace, "--num-requests", "20", "--seed", "5", "--prefix-root-multiplier", "3", "--max-isl", "20000"},
			[]string{"read 12031 rows", "generated 20 rows", "sampled requests with input_length > 20000"}},
	}
	for _, tc := range tests {
		t.Run(tc.golden, func(t *testing.T) {
			if tc.args[0] == synthConversationTrace {
				testutil.NeedShared(t, synthConversationTrace)
			}
			code, stdout, stderr := runSynthesize(t.Context(), append(tc.args, "-o", "-")...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			for _, s := range tc.stderr {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr %q lacks %q", stderr, s)
				}
			}
			path := filepath.Join(synthTestdata, tc.golden)
			if *updateSynthesize {
				if err := os.WriteFile(path, []byte(stdout), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if stdout != string(want) {
				t.Errorf("output differs from %s (rerun with -update-synthesize to accept):\n%s", tc.golden, stdout)
			}
		})
	}
}

func TestSynthesizeBadInput(t *testing.T) {
	mixed := filepath.Join(synthTestdata, "mixed.jsonl")
	bad := filepath.Join(synthTestdata, "bad.jsonl")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"malformed JSON", []string{bad}, "bad.jsonl:2: invalid JSON"},
		{"missing file", []string{filepath.Join(synthTestdata, "nope.jsonl")}, "nope.jsonl"},
		{"speedup 0", []string{mixed, "--speedup-ratio", "0"}, "--speedup-ratio must be a finite number > 0, got 0"},
		{"prefix NaN", []string{mixed, "--prefix-len-multiplier", "NaN"}, "--prefix-len-multiplier must be"},
		{"prompt negative", []string{mixed, "--prompt-len-multiplier=-1"}, "--prompt-len-multiplier must be"},
		{"output negative", []string{mixed, "--output-len-multiplier=-0.5"}, "--output-len-multiplier must be a finite number ≥ 0"},
		{"root 0", []string{mixed, "--prefix-root-multiplier", "0"}, "--prefix-root-multiplier must be an integer ≥ 1, got 0"},
		{"root fractional", []string{mixed, "--prefix-root-multiplier", "1.5"}, `want an integer, got "1.5"`},
		{"block size", []string{mixed, "--block-size", "0"}, "--block-size must be > 0"},
		{"negative caps", []string{mixed, "--max-isl=-1", "--max-osl=-2"}, "--max-osl must be ≥ 0"},
		{"negative requests", []string{mixed, "--num-requests=-5"}, "--num-requests must be ≥ 0"},
		{"generate without timestamps", []string{mixed, "--num-requests", "5"}, "mixed.jsonl: line 9: generating needs a timestamp"},
		{"ids do not fit block size", []string{mixed, "--block-size", "64"}, "mixed.jsonl:1: input_length 1900 does not fit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.jsonl")
			code, _, stderr := runSynthesize(t.Context(), append(tc.args, "-o", out)...)
			if code != exitBadInput {
				t.Errorf("exit %d, want %d", code, exitBadInput)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q lacks %q", stderr, tc.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("output written despite the error")
			}
		})
	}
	code, _, stderr := runSynthesize(t.Context(), mixed)
	if code != exitBadInput || !strings.Contains(stderr, "output-file") {
		t.Errorf("without -o: exit %d, %q", code, stderr)
	}
}

// TestSynthesizeFile checks the file path: same seed, same bytes; another
// seed, other bytes; the root multiplier leaves lengths and timestamps
// alone; and a failed write leaves nothing behind.
func TestSynthesizeFile(t *testing.T) {
	testutil.NeedShared(t, synthConversationTrace)
	dir := t.TempDir()
	gen := func(name string, extra ...string) []byte {
		t.Helper()
		path := filepath.Join(dir, name)
		args := append([]string{synthConversationTrace, "--num-requests", "3000", "-o", path}, extra...)
		if code, _, stderr := runSynthesize(t.Context(), args...); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := gen("a.jsonl", "--seed", "7")
	if b := gen("b.jsonl", "--seed", "7"); !bytes.Equal(a, b) {
		t.Error("same seed, different files")
	}
	if c := gen("c.jsonl", "--seed", "8"); bytes.Equal(a, c) {
		t.Error("seeds 7 and 8 give the same file")
	}
	rooted := gen("r.jsonl", "--seed", "7", "--prefix-root-multiplier", "5")
	if bytes.Equal(a, rooted) {
		t.Error("the root multiplier changed nothing")
	}
	// Lines differ only inside hash_ids.
	strip := func(b []byte) string {
		var s strings.Builder
		for line := range strings.Lines(string(b)) {
			s.WriteString(line[:strings.Index(line, `"hash_ids"`)] + "\n")
		}
		return s.String()
	}
	if strip(a) != strip(rooted) {
		t.Error("the root multiplier changed timestamps or lengths")
	}
	if info, err := os.Stat(filepath.Join(dir, "a.jsonl")); err != nil || info.Mode().Perm() != 0o644 {
		t.Errorf("output file mode: %v %v", info, err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	failDir := t.TempDir()
	code, _, stderr := runSynthesize(ctx, synthConversationTrace, "--num-requests", "10", "-o", filepath.Join(failDir, "x.jsonl"))
	if code != exitFailure {
		t.Errorf("canceled run: exit %d: %s", code, stderr)
	}
	if entries, _ := os.ReadDir(failDir); len(entries) != 0 {
		t.Errorf("canceled run left %v", entries)
	}
}

// TestSynthesizeSpecialFiles: a device or a pipe named by -o is written in
// place, never replaced by a renamed regular file, and a failed write is a
// runtime failure naming the file.
func TestSynthesizeSpecialFiles(t *testing.T) {
	for _, tt := range []struct {
		name, path string
		code       int
		stderr     string
	}{
		{"/dev/null", "/dev/null", exitOK, ""},
		{"a full device", "/dev/full", exitFailure, "write /dev/full: no space left on device"},
		{"a directory", t.TempDir(), exitBadInput, "is a directory"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before, err := os.Stat(tt.path)
			if err != nil {
				t.Skipf("%s: %v", tt.path, err)
			}
			code, _, stderr := runSynthesize(t.Context(), synthConversationTrace, "--num-requests", "10", "-o", tt.path)
			if code != tt.code || !strings.Contains(stderr, tt.stderr) || strings.Count(stderr, tt.path) > 1 {
				t.Errorf("exit %d, stderr %q; want %d with %q, the file named once", code, stderr, tt.code, tt.stderr)
			}
			after, err := os.Stat(tt.path)
			if err != nil || after.Mode() != before.Mode() {
				t.Fatalf("%s was %v, is now %v (%v)", tt.path, before.Mode(), after.Mode(), err)
			}
		})
	}
}

// TestSynthesizeAIPerfAndDynamoNames: every other spelling of a synthesize
// flag gives the output of the flag it stands for (which differs from the
// default's, so that an ignored alias fails), and is in the help.
func TestSynthesizeAIPerfAndDynamoNames(t *testing.T) {
	mixed := filepath.Join(synthTestdata, "mixed.jsonl")
	tests := []struct {
		flag, alias string
		value       string
		with        []string
	}{
		{"--speedup-ratio", "--synthesis-speedup-ratio", "2", nil},
		{"--prefix-len-multiplier", "--synthesis-prefix-len-multiplier", "2", nil},
		{"--prefix-root-multiplier", "--synthesis-prefix-root-multiplier", "3", []string{"--seed", "5"}},
		{"--prompt-len-multiplier", "--synthesis-prompt-len-multiplier", "0.5", nil},
		{"--output-len-multiplier", "--synthesis-output-len-multiplier", "0.5", nil},
		{"--output-len-multiplier", "--osl-multiplier", "0.5", nil},
		{"--max-isl", "--synthesis-max-isl", "5000", nil},
		{"--max-osl", "--synthesis-max-osl", "6", nil},
		{"--seed", "--random-seed", "9", []string{"--prefix-root-multiplier", "4"}},
	}
	_, help, _ := runCLI("help", "synthesize")
	for _, tt := range tests {
		t.Run(tt.alias, func(t *testing.T) {
			base := append([]string{"synthesize", mixed, "-o", "-"}, tt.with...)
			_, def, _ := runCLI(base...)
			code, want, stderr := runCLI(append(base, tt.flag, tt.value)...)
			if code != exitOK || want == def {
				t.Fatalf("%s %s: exit %d (%s), output changed: %v", tt.flag, tt.value, code, stderr, want != def)
			}
			code, got, stderr := runCLI(append(base, tt.alias, tt.value)...)
			if code != exitOK || got != want {
				t.Errorf("%s %s: exit %d (%s), output differs from %s's", tt.alias, tt.value, code, stderr, tt.flag)
			}
			if !strings.Contains(help, tt.alias) {
				t.Errorf("help does not mention %s", tt.alias)
			}
		})
	}
	t.Run("--input-file", func(t *testing.T) {
		_, want, _ := runCLI("synthesize", mixed, "-o", "-", "--speedup-ratio", "2")
		code, got, stderr := runCLI("synthesize", "--input-file", mixed, "-o", "-", "--speedup-ratio", "2")
		if code != exitOK || got != want {
			t.Errorf("exit %d (%s), output differs from TRACE's", code, stderr)
		}
		if !strings.Contains(help, "--input-file") {
			t.Error("help does not mention --input-file")
		}
	})
}

// The generator's arrival processes are the same in the command's enum and
// the package's.
func TestArrivalNames(t *testing.T) {
	_, help, _ := runCLI("help", "synthesize")
	for _, a := range synth.ArrivalProcesses {
		if !strings.Contains(help, string(a)) {
			t.Errorf("help does not name arrival %s", a)
		}
	}
}
