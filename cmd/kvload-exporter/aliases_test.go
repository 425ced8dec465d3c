package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/synth"
)

// TestAnalyzeAIPerfNames: `analyze-trace` is `analyze`, and --input-file
// names the trace, as in AIPerf; both appear in the help.
func TestAnalyzeAIPerfNames(t *testing.T) {
	path := writeTrace(t, aiperfDocRows)
	_, want, _ := runCLI("analyze", path, "--format", "json")
	for _, args := range [][]string{
		{"analyze-trace", path, "--format", "json"},
		{"analyze-trace", "--input-file", path, "--format", "json"},
		{"analyze", "--input-file", path, "--format", "json"},
		{"analyze", path, "--input-file", path, "--format", "json"},
	} {
		code, got, stderr := runCLI(args...)
		if code != exitOK || got != want {
			t.Errorf("%v: exit %d, stderr %q, stdout:\n%s\nwant:\n%s", args, code, stderr, got, want)
		}
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"analyze-trace"}, "a trace is required: give TRACE or --input-file"},
		{[]string{"analyze", path, "--input-file", path + ".other"}, "disagree"},
	} {
		if code, _, stderr := runCLI(tt.args...); code != exitBadInput || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
	_, help, _ := runCLI("help", "analyze")
	for _, name := range []string{"analyze-trace", "--input-file", "aiperf"} {
		if !strings.Contains(help, name) {
			t.Errorf("help of analyze does not mention %s:\n%s", name, help)
		}
	}
}

// aiperfDocRows are the example rows of AIPerf's trace-replay
// documentation: the format's example, whose 655 tokens fill two of its
// three 512-token blocks, and the custom trace.
const aiperfDocRows = `{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 1200, "output_length": 52, "hash_ids": [0, 1, 2]}
{"timestamp": 105, "input_length": 1800, "output_length": 26, "hash_ids": [0, 3, 4, 5]}
{"timestamp": 274, "input_length": 1300, "output_length": 52, "hash_ids": [1, 4, 6]}
`

// TestAIPerfDocRows: analyze takes AIPerf's documentation rows, id to spare
// included, with AIPerf's numbers (worked out by hand from its
// definitions), and says how many rows had ids to spare; synthesize takes
// them too, keeping the ids that fit.
func TestAIPerfDocRows(t *testing.T) {
	path := writeTrace(t, aiperfDocRows)
	code, out, stderr := runCLI("analyze", path, "--format", "json")
	if code != exitOK {
		t.Fatalf("analyze: exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "1 row has more hash_ids than its input_length fills in 512-token blocks (line 1): 1 id to spare") {
		t.Errorf("analyze's stderr does not count the row with an id to spare: %q", stderr)
	}
	var got struct {
		Total      int     `json:"total_requests"`
		Unique     int     `json:"unique_prefixes"`
		Groups     int     `json:"num_prefix_groups"`
		CacheHit   float64 `json:"cache_hit_rate"`
		Reuse      float64 `json:"prefix_reuse_ratio"`
		AvgISL     float64 `json:"avg_isl"`
		ContextLen struct {
			Mean, Min, Max float64
		} `json:"context_length_stats"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	// Hit rates 0, 3/3, 1/4, 2/3; repeated (position, id): (0,0), (1,1),
	// (2,2), so contexts 655 (all repeated: the row's length), 1200, 512, 0.
	want := []float64{4, 9, 1, (0 + 1 + 0.25 + 2.0/3) / 4, 7.0 / 13, (655 + 1200 + 1800 + 1300) / 4.0, (655 + 1200 + 512 + 0) / 4.0, 0, 1200}
	have := []float64{float64(got.Total), float64(got.Unique), float64(got.Groups), got.CacheHit, got.Reuse, got.AvgISL, got.ContextLen.Mean, got.ContextLen.Min, got.ContextLen.Max}
	for i := range want {
		if math.Abs(have[i]-want[i]) > 1e-12 {
			t.Errorf("analyze: %v, want %v", have, want)
			break
		}
	}

	code, out, stderr = runCLI("synthesize", path, "-o", "-", "--speedup-ratio", "2")
	if code != exitOK || !strings.Contains(stderr, "synthesized from the ids that fit") {
		t.Fatalf("synthesize: exit %d, stderr %q", code, stderr)
	}
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			ISL int     `json:"input_length"`
			IDs []int64 `json:"hash_ids"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if len(r.IDs) != (r.ISL+511)/512 {
			t.Errorf("synthesized row %d: %d ids for %d tokens", i+1, len(r.IDs), r.ISL)
		}
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

// sharedPrefixArgs are synthesize's arguments for a shared-prefix workload
// whose token hit rate the test derives: 8 prefixes of 1,024 tokens in
// 16-token blocks, 4,000 single requests of 256 ± 32 more tokens.
var sharedPrefixArgs = []string{"--prefixes", "8", "--prefix-tokens", "1024", "--num-requests", "4000",
	"--input-tokens-mean", "256", "--input-tokens-stddev", "32", "--output-tokens-mean", "64",
	"--rate", "20", "--block-size", "16"}

// TestSynthesizeSharedPrefix: the same seed writes the same file, and
// analyze of it shows the token hit rate the parameters imply.
func TestSynthesizeSharedPrefix(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, extra ...string) []byte {
		path := filepath.Join(dir, name)
		args := append(append([]string{"synthesize", "-o", path}, sharedPrefixArgs...), extra...)
		if code, _, stderr := runCLI(args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b, c := write("a.jsonl", "--seed", "3"), write("b.jsonl", "--seed", "3"), write("c.jsonl", "--seed", "4")
	if string(a) != string(b) {
		t.Error("the same seed wrote different files")
	}
	if string(a) == string(c) {
		t.Error("another seed wrote the same file")
	}

	code, table, stderr := runCLI("analyze", filepath.Join(dir, "a.jsonl"), "--block-size", "16")
	if code != exitOK {
		t.Fatalf("analyze: exit %d: %s", code, stderr)
	}
	m := regexp.MustCompile(`(?m)^Token hit rate: +(\S+)$`).FindStringSubmatch(table)
	if m == nil {
		t.Fatalf("no token hit rate in:\n%s", table)
	}
	got, _ := strconv.ParseFloat(m[1], 64)
	// An infinite cache serves a request the prefix's 64 whole blocks if
	// its prefix came before: all but the D = P·(1 − (1 − 1/P)^N) first
	// uses of a prefix. Each request is 1,024 + 256 tokens on average.
	const P, N, L, mean = 8.0, 4000.0, 1024.0, 256.0
	first := P * (1 - math.Pow(1-1/P, N))
	want := L * (N - first) / (N * (L + mean))
	if math.Abs(got-want) > 0.02 {
		t.Errorf("token hit rate %.4f, the parameters imply %.4f", got, want)
	}
}

// TestSynthesizeSharedPrefixNames: AIPerf's names of the generator's
// parameters give the same file, and are in the help.
func TestSynthesizeSharedPrefixNames(t *testing.T) {
	_, want, _ := runCLI(append([]string{"synthesize", "-o", "-"}, sharedPrefixArgs...)...)
	aiperf := []string{"--prefix-prompt-pool-size", "8", "--prefix-prompt-length", "1024", "--num-requests", "4000",
		"--synthetic-input-tokens-mean", "256", "--synthetic-input-tokens-stddev", "32", "--output-tokens-mean", "64",
		"--request-rate", "20", "--block-size", "16"}
	code, got, stderr := runCLI(append([]string{"synthesize", "-o", "-"}, aiperf...)...)
	if code != exitOK || got != want || want == "" {
		t.Errorf("AIPerf's names: exit %d (%s), same output: %v", code, stderr, got == want)
	}
	_, help, _ := runCLI("help", "synthesize")
	for _, name := range []string{"--prefix-prompt-pool-size", "--prefix-prompt-length", "--synthetic-input-tokens-mean",
		"--synthetic-input-tokens-stddev", "--request-rate"} {
		if !strings.Contains(help, name) {
			t.Errorf("help does not mention %s", name)
		}
	}
}

func TestSynthesizeSharedPrefixBadInput(t *testing.T) {
	mixed := filepath.Join(synthTestdata, "mixed.jsonl")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--prefixes", "8", mixed}, "reads no TRACE"},
		{append([]string{"--speedup-ratio", "2"}, sharedPrefixArgs...), "reshape a TRACE"},
		{[]string{"--prefixes", "0", "--num-requests", "0", "--rate", "0"}, "--prefixes must be from 1 to"},
		{[]string{"--prefixes", "2", "--num-requests", "10", "--rate", "1", "--output-tokens-mean", "5"}, "--input-tokens-mean must be from 1"},
		{[]string{mixed, "--rate", "3"}, "--rate needs --prefixes"},
		{[]string{}, "a trace is required"},
	}
	for _, tt := range tests {
		args := append([]string{"synthesize", "-o", filepath.Join(t.TempDir(), "out.jsonl")}, tt.args...)
		if code, _, stderr := runCLI(args...); code != exitBadInput || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
}

// TestHashDynamoForm: `hash PROMPTS OUT [BLOCK_SIZE]` writes what -o and
// --block-size write, and says which block_size a workload needs.
func TestHashDynamoForm(t *testing.T) {
	prompts := filepath.Join(e2eExamples, "prompts.jsonl")
	dir := t.TempDir()
	hash := func(args ...string) (int, string, []byte) {
		code, _, stderr := runCLI(append([]string{"hash", prompts}, args...)...)
		b, _ := os.ReadFile(filepath.Join(dir, "t.jsonl"))
		os.Remove(filepath.Join(dir, "t.jsonl"))
		return code, stderr, b
	}
	out := filepath.Join(dir, "t.jsonl")
	code, stderr, want := hash("-o", out, "--block-size", "16")
	if code != exitOK || !strings.Contains(stderr, "needs block_size: 16") {
		t.Fatalf("-o: exit %d, stderr %q", code, stderr)
	}
	for _, args := range [][]string{{out, "16"}, {out, "16", "--block-size", "16"}, {out, "-o", out, "--block-size", "16"}} {
		if code, stderr, got := hash(args...); code != exitOK || string(got) != string(want) {
			t.Errorf("%v: exit %d (%s), same trace: %v", args, code, stderr, string(got) == string(want))
		}
	}
	_, _, def := hash("-o", out)
	if code, _, got := hash(out); code != exitOK || string(got) != string(def) || string(def) == string(want) {
		t.Errorf("OUT alone: exit %d, want the 512-token trace", code)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "the trace to write is required"},
		{[]string{out, "-o", out + ".2"}, "disagree"},
		{[]string{out, "16", "--block-size", "32"}, "disagree"},
		{[]string{out, "x"}, "BLOCK_SIZE: want an integer"},
		{[]string{out, "0"}, "must be positive"},
	} {
		if code, stderr, _ := hash(tt.args...); code != exitBadInput || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
	_, help, _ := runCLI("help", "hash")
	for _, name := range []string{"OUT", "BLOCK_SIZE", "Dynamo"} {
		if !strings.Contains(help, name) {
			t.Errorf("help of hash does not mention %s:\n%s", name, help)
		}
	}
}

// The generator's arrival processes are the same in the command's enum and
// the package's.
func TestArrivalNames(t *testing.T) {
	_, help, _ := runCLI("help", "synthesize")
	for _, a := range synth.Arrivals {
		if !strings.Contains(help, string(a)) {
			t.Errorf("help does not name arrival %s", a)
		}
	}
}
