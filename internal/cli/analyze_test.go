package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// The shared reference traces and the golden reports of package synth,
// relative to this directory.
const (
	sharedSynthetic = "../../testdata/mooncake/synthetic_trace.jsonl"
	goldenDir       = "../../synth/testdata/analyze/"
)

func writeTrace(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, streams{stdout: &out, stderr: &errOut})
	return code, out.String(), errOut.String()
}

func TestAnalyzeBadInput(t *testing.T) {
	const good = `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}` + "\n"
	tests := []struct {
		name    string
		content string // trace file content; "" with missing for no file
		missing bool
		flags   []string
		want    string // substring of stderr; "FILE" is replaced by the path
	}{
		{name: "bad JSON", content: good + `{"input_length": 5,` + "\n", want: "FILE:2: invalid JSON"},
		{name: "not an object", content: "[1, 2]\n", want: "FILE:1: invalid JSON"},
		{name: "wrong type", content: `{"input_length": "abc"}` + "\n", want: "FILE:1: input_length: must be an integer"},
		{name: "negative input length", content: `{"input_length": -5}` + "\n", want: "FILE:1: input_length: must be ≥ 0"},
		{name: "negative output length", content: good + good + `{"input_length": 5, "output_length": -3}` + "\n", want: "FILE:3: output_length: must be ≥ 0"},
		{name: "too few hash_ids", content: good + `{"input_length": 2000, "hash_ids": [7]}` + "\n", want: "FILE:2: input_length 2000 does not fit 1 hash_ids"},
		{name: "hash_ids checked with --block-size", content: good, flags: []string{"--block-size", "256"}, want: "FILE:1: input_length 600 does not fit 2 hash_ids of 256-token blocks"},
		{name: "empty file", content: "", want: "FILE: trace has no rows"},
		{name: "blank lines only", content: "\n  \n\n", want: "FILE: trace has no rows"},
		{name: "missing file", missing: true, want: "FILE: no such file or directory"},
		{name: "zero block size", content: good, flags: []string{"--block-size", "0"}, want: "--block-size must be positive, got 0"},
		{name: "negative block size", content: good, flags: []string{"--block-size=-512"}, want: "--block-size must be positive, got -512"},
		{name: "unknown format", content: good, flags: []string{"--format", "xml"}, want: "enum value must be one of table,json,aiperf"},
		{name: "aiperf format with a curve", content: good, flags: []string{"--format", "aiperf", "--capacity-curve"}, want: "--format aiperf is AIPerf's report"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var path string
			if tt.missing {
				path = filepath.Join(t.TempDir(), "absent.jsonl")
			} else {
				path = writeTrace(t, tt.content)
			}
			args := append([]string{"analyze", path}, tt.flags...)
			code, stdout, stderr := runCLI(args...)
			if code != exitBadInput {
				t.Errorf("exit code %d, want %d; stderr %q", code, exitBadInput, stderr)
			}
			if want := strings.ReplaceAll(tt.want, "FILE", path); !strings.Contains(stderr, want) {
				t.Errorf("stderr %q does not contain %q", stderr, want)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
				t.Errorf("stderr is not one line: %q", stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}
}

func readGolden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(goldenDir + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAnalyzeOutputs runs the command on the shared synthetic trace and
// checks stdout and --output-file against synth's golden reports.
func TestAnalyzeOutputs(t *testing.T) {
	table, js := readGolden(t, "synthetic.txt"), readGolden(t, "synthetic.json")
	tests := []struct {
		name       string
		flags      []string
		wantStdout string
		wantFile   string // "" when no --output-file is given
	}{
		{"table by default", nil, table, ""},
		{"json", []string{"--format", "json"}, js, ""},
		{"table and a JSON file", []string{"--output-file", "OUT"}, table, js},
		{"json and a JSON file", []string{"--format=json", "--output-file=OUT"}, js, js},
		{"aiperf", []string{"--format", "aiperf"}, readGolden(t, "synthetic.aiperf.txt"), ""},
		{"aiperf and a JSON file", []string{"--format", "aiperf", "--output-file", "OUT"}, readGolden(t, "synthetic.aiperf.txt"), js},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The file's directory does not exist yet: analyze creates it.
			out := filepath.Join(t.TempDir(), "new", "dir", "stats.json")
			args := []string{"analyze", testutil.NeedShared(t, sharedSynthetic)}
			for _, f := range tt.flags {
				args = append(args, strings.ReplaceAll(f, "OUT", out))
			}
			code, stdout, stderr := runCLI(args...)
			// Progress lines appear when the read takes over a second, as it
			// may on a loaded machine: anything else on stderr is wrong.
			if code != exitOK || withoutProgress(stderr) != "" {
				t.Fatalf("exit code %d, stderr %q", code, stderr)
			}
			if stdout != tt.wantStdout {
				t.Errorf("stdout:\n%s\nwant:\n%s", stdout, tt.wantStdout)
			}
			got, err := os.ReadFile(out)
			switch {
			case tt.wantFile == "" && !errors.Is(err, os.ErrNotExist):
				t.Errorf("output file written without --output-file (err %v)", err)
			case tt.wantFile != "" && err != nil:
				t.Errorf("output file: %v", err)
			case tt.wantFile != "" && string(got) != tt.wantFile:
				t.Errorf("output file:\n%s\nwant:\n%s", got, tt.wantFile)
			}
		})
	}
}

// fakeClock returns a clock that starts at a fixed time and advances by step
// on every reading after the first.
func fakeClock(step time.Duration) func() time.Time {
	t := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	first := true
	return func() time.Time {
		if !first {
			t = t.Add(step)
		}
		first = false
		return t
	}
}

func TestProgress(t *testing.T) {
	tests := []struct {
		name string
		step time.Duration // clock advance per row
		rows int
		want string
	}{
		{"a fast read prints nothing", time.Millisecond, 500, ""},
		{"nothing before the first second", 300 * time.Millisecond, 3, ""},
		// Rows are read at 0.3 s, 0.6 s, …: the first line comes at 1.2 s
		// (row 4), the next ones at least a second later (rows 8, 12).
		{"at most once a second", 300 * time.Millisecond, 12,
			"analyze: read 4 rows...\nanalyze: read 8 rows...\nanalyze: read 12 rows...\nanalyze: read 12 rows, computing statistics\n"},
		{"slow rows", 5 * time.Second, 2,
			"analyze: read 1 rows...\nanalyze: read 2 rows...\nanalyze: read 2 rows, computing statistics\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			p := newProgress(&buf, fakeClock(tt.step))
			for r := 1; r <= tt.rows; r++ {
				p.tick(r)
			}
			p.done(tt.rows)
			if buf.String() != tt.want {
				t.Errorf("progress output %q, want %q", buf.String(), tt.want)
			}
		})
	}
}

// TestAnalyzeProgressOnStderr checks that the command wires the clock to
// the reading loop: with a clock that jumps a second per reading, every row
// is reported, on stderr only.
func TestAnalyzeProgressOnStderr(t *testing.T) {
	path := writeTrace(t, strings.Repeat(`{"input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`+"\n", 3))
	var out, errOut bytes.Buffer
	o := analyzeOptions{trace: path, blockSize: 512, format: "json"}
	if err := runAnalyze(context.Background(), streams{&out, &errOut}, o, fakeClock(time.Second)); err != nil {
		t.Fatal(err)
	}
	want := "analyze: read 1 rows...\nanalyze: read 2 rows...\nanalyze: read 3 rows...\nanalyze: read 3 rows, computing statistics\n"
	if errOut.String() != want {
		t.Errorf("stderr %q, want %q", errOut.String(), want)
	}
	if !strings.Contains(out.String(), `"total_requests": 3,`) {
		t.Errorf("stdout lacks the report:\n%s", out.String())
	}
}

func TestAnalyzeCanceled(t *testing.T) {
	path := writeTrace(t, strings.Repeat(`{"input_length": 1}`+"\n", 2*ctxCheckRows))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"analyze", path}, streams{&out, &errOut})
	if code != exitFailure || !strings.Contains(errOut.String(), "context canceled") {
		t.Errorf("exit code %d, stderr %q; want %d and context canceled", code, errOut.String(), exitFailure)
	}
}

// withoutProgress drops analyze's progress lines from stderr.
func withoutProgress(stderr string) string {
	var kept []string
	for _, l := range strings.SplitAfter(stderr, "\n") {
		if !strings.HasPrefix(l, "analyze: read ") {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, "")
}

// TestAnalyzeAIPerfNames: `analyze-trace` is `analyze`, and --input-file
// names the trace, as in AIPerf; both appear in the help.
func TestAnalyzeAIPerfNames(t *testing.T) {
	path := writeTrace(t, testutil.AIPerfDocRows)
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

// TestAIPerfDocRows: analyze takes AIPerf's documentation rows, id to spare
// included, with AIPerf's numbers (worked out by hand from its
// definitions), and says how many rows had ids to spare; synthesize takes
// them too, keeping the ids that fit.
func TestAIPerfDocRows(t *testing.T) {
	path := writeTrace(t, testutil.AIPerfDocRows)
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

// TestAnalyzeChainReuseNote: on AIPerf's documentation trace, whose third
// row reuses ids after other blocks, analyze keeps AIPerf's statistics and
// says on stderr how many rows reuse ids and what an engine serves; the
// capacity curve, keyed as an engine keys its cache, says 11.9 %. A
// Mooncake trace gets no note.
func TestAnalyzeChainReuseNote(t *testing.T) {
	const docTrace = "../../testdata/aiperf/custom_trace.jsonl"
	code, out, stderr := runCLI("analyze", docTrace, "--format", "json")
	if code != exitOK {
		t.Fatalf("analyze: exit %d: %s", code, stderr)
	}
	var stats struct {
		CacheHit float64 `json:"cache_hit_rate"`
		Unique   int     `json:"unique_prefixes"`
	}
	if err := json.Unmarshal([]byte(out), &stats); err != nil {
		t.Fatal(err)
	}
	// AIPerf's hit rates by id: 0, 1/4, 2/3.
	if math.Abs(stats.CacheHit-(0+0.25+2.0/3)/3) > 1e-15 || stats.Unique != 9 {
		t.Errorf("AIPerf's statistics changed: cache hit rate %v, unique prefixes %d", stats.CacheHit, stats.Unique)
	}
	for _, want := range []string{
		"1 of 3 rows use a hash id after another chain of blocks than where it first came (the first at row 3)",
		"an infinite cache serves 0.11906976744186047 of the prompt tokens, against a token hit rate of 0.3572093023255814 by id",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("analyze's stderr does not say %q:\n%s", want, stderr)
		}
	}

	code, out, stderr = runCLI("analyze", docTrace, "--capacity-curve", "--format", "json")
	if code != exitOK {
		t.Fatalf("analyze --capacity-curve: exit %d: %s", code, stderr)
	}
	var curve struct {
		Limit   float64 `json:"infinite_hit_rate"`
		Reusing int     `json:"rows_reusing_ids"`
	}
	if err := json.Unmarshal([]byte(out), &curve); err != nil {
		t.Fatal(err)
	}
	if math.Abs(curve.Limit-512.0/4300) > 1e-15 || curve.Reusing != 1 {
		t.Errorf("capacity curve: limit %v (want 512/4,300 = 11.9 %%), %d rows reusing ids (want 1)", curve.Limit, curve.Reusing)
	}

	if code, _, stderr := runCLI("analyze", sharedSynthetic, "--format", "json"); code != exitOK || strings.Contains(stderr, "chain") {
		t.Errorf("analyze of a Mooncake trace: exit %d, stderr %q", code, stderr)
	}
}

// TestAnalyzeTraceDefaultsToAIPerf: analyze-trace prints AIPerf's report
// (the cache hit rate in percent) unless --format says otherwise; analyze
// keeps Dynamo datagen's table; a curve under analyze-trace, which AIPerf's
// report cannot hold, prints the curve's table.
func TestAnalyzeTraceDefaultsToAIPerf(t *testing.T) {
	path := writeTrace(t, testutil.AIPerfDocRows)
	_, aiperf, _ := runCLI("analyze", path, "--format", "aiperf")
	_, table, _ := runCLI("analyze", path, "--format", "table")
	_, curve, _ := runCLI("analyze", path, "--capacity-curve")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"analyze-trace", path, "--block-size", "512"}, aiperf},
		{[]string{"analyze-trace", "--input-file", path}, aiperf},
		{[]string{"analyze-trace", path, "--format", "table"}, table},
		{[]string{"analyze", path}, table},
		{[]string{"analyze-trace", path, "--capacity-curve"}, curve},
	} {
		code, got, stderr := runCLI(tt.args...)
		if code != exitOK || got != tt.want {
			t.Errorf("%v: exit %d, stderr %q, stdout:\n%s\nwant:\n%s", tt.args, code, stderr, got, tt.want)
		}
	}
	if !regexp.MustCompile(`(?m)^Cache hit rate: +\d+\.\d\d%$`).MatchString(aiperf) {
		t.Errorf("AIPerf's report has no cache hit rate in percent:\n%s", aiperf)
	}
	if aiperf == table {
		t.Error("the AIPerf report and the table are the same")
	}
}
