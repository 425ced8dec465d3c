package cli

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

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

// TestSynthesizeSharedPrefixArrivals: --arrivals is the flag, named as the
// workload's generate.arrivals key; --arrival, the spelling that shipped
// first, gives the same file; a bad value under either is refused.
func TestSynthesizeSharedPrefixArrivals(t *testing.T) {
	synthesize := func(extra ...string) (int, string, string) {
		return runCLI(append(append([]string{"synthesize", "-o", "-", "--seed", "3"}, sharedPrefixArgs...), extra...)...)
	}
	_, poisson, _ := synthesize()
	_, constant, _ := synthesize("--arrivals", "constant")
	if poisson == "" || constant == "" || poisson == constant {
		t.Fatalf("constant and Poisson arrivals wrote the same file (or none)")
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     string // the output, or a part of stderr when refused
	}{
		{"new spelling", []string{"--arrivals", "constant"}, exitOK, constant},
		{"old spelling", []string{"--arrival", "constant"}, exitOK, constant},
		{"old spelling, default value", []string{"--arrival", "poisson"}, exitOK, poisson},
		{"both", []string{"--arrivals", "constant", "--arrival", "constant"}, exitBadInput,
			"--arrival cannot be given with --arrivals"},
		{"bad under the new spelling", []string{"--arrivals", "bursty"}, exitBadInput,
			`--arrivals "bursty" is not one of poisson, constant`},
		{"bad under the old spelling", []string{"--arrival", "bursty"}, exitBadInput,
			`--arrival "bursty" is not one of poisson, constant`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, stderr := synthesize(tt.args...)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d: %s", code, tt.wantCode, stderr)
			}
			if tt.wantCode == exitOK && out != tt.want {
				t.Errorf("output differs from the expected arrivals'")
			}
			if tt.wantCode != exitOK && !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr %q does not name %s", stderr, tt.want)
			}
		})
	}
	_, help, _ := runCLI("help", "synthesize")
	for _, name := range []string{"--arrivals=", "--arrival="} {
		if !strings.Contains(help, name) {
			t.Errorf("help does not mention %s", name)
		}
	}
}

// TestSynthesizeShortPrefixWarns: prefixes shorter than the block share
// nothing; synthesize says so on stderr, naming the block size and one
// that shares, and still writes the rows.
func TestSynthesizeShortPrefixWarns(t *testing.T) {
	for _, tc := range []struct {
		block string
		warns bool
	}{{"512", true}, {"256", false}} {
		code, out, stderr := runCLI("synthesize", "-o", "-", "--prefixes", "4", "--prefix-tokens", "256", "--num-requests", "20",
			"--input-tokens-mean", "100", "--output-tokens-mean", "8", "--rate", "1", "--block-size", tc.block)
		if code != exitOK || strings.Count(out, "\n") != 20 {
			t.Fatalf("block %s: exit %d, %d rows: %s", tc.block, code, strings.Count(out, "\n"), stderr)
		}
		warned := strings.Contains(stderr, "synthesize: warning: the 256-token prefixes are shorter than --block-size (512 tokens)") &&
			strings.Contains(stderr, "a --block-size of 256 ")
		if warned != tc.warns || strings.Contains(stderr, "warning") != tc.warns {
			t.Errorf("block %s: warned %v, want %v:\n%s", tc.block, warned, tc.warns, stderr)
		}
	}
}
