package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// profileTrace has a row every 500 ms from 0 to 3500, whose output length
// (1 to 8) tells which row a request is.
func profileTrace(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for i := range 8 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 600, "output_length": %d, "hash_ids": [0, %d]}`+"\n", i*500, i+1, i+1)
	}
	return writeTrace(t, b.String())
}

// sentRows records the output length of every request a fake server
// answers: which rows were sent, and how often.
type sentRows struct {
	mu   sync.Mutex
	lens []int
}

func (s *sentRows) usage(maxTokens int) testutil.Usage {
	s.mu.Lock()
	s.lens = append(s.lens, maxTokens)
	s.mu.Unlock()
	return testutil.Usage{Prompt: 600, Completion: maxTokens}
}

func (s *sentRows) sorted() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.lens)
	slices.Sort(out)
	return out
}

// TestProfileAIPerfCommand: AIPerf's trace-replay command line, with a
// URL without a scheme and the completions API, sends every row once,
// prints the summary with TTFT, writes the JSON export and exits 0; with
// start and end offsets only the rows in that window are sent.
func TestProfileAIPerfCommand(t *testing.T) {
	trace := profileTrace(t)
	for _, tt := range []struct {
		name  string
		extra []string
		want  []int
	}{
		{"every row", nil, []int{1, 2, 3, 4, 5, 6, 7, 8}},
		{"a window", []string{"--fixed-schedule-start-offset", "1000", "--fixed-schedule-end-offset", "3000"}, []int{3, 4, 5, 6, 7}},
		{"a window and a count", []string{"--fixed-schedule-start-offset", "1000", "--request-count", "2", "--fixed-schedule-auto-offset"}, []int{3, 4}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var sent sentRows
			srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) { f.Usage = sent.usage })
			dir := t.TempDir()
			args := append([]string{"profile", "--model", "Qwen/Qwen3-0.6B", "--endpoint-type", "completions", "--streaming",
				"--url", strings.TrimPrefix(srv.URL, "http://"), "--input-file", trace, "--custom-dataset-type", "mooncake_trace",
				"--fixed-schedule", "--artifact-dir", dir}, tt.extra...)
			code, stdout, stderr := runCLI(args...)
			if code != exitOK {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			if got := sent.sorted(); !slices.Equal(got, tt.want) {
				t.Errorf("rows sent (by output length): %v, want %v", got, tt.want)
			}
			if n := srv.Count("/v1/completions"); n != len(tt.want) {
				t.Errorf("%d requests to /v1/completions, want %d", n, len(tt.want))
			}
			for _, want := range []string{"Time to First Token (ms)", "Inter Token Latency (ms)", "Request Latency (ms)",
				"Input Sequence Length (tokens)", "Output Sequence Length (tokens)", "Request Throughput (requests/sec)"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("the summary lacks %q:\n%s", want, stdout)
				}
			}
			if count := regexp.MustCompile(fmt.Sprintf(`Request Count \(requests\) │ +%d\.00 │`, len(tt.want))); !count.MatchString(stdout) {
				t.Errorf("the summary lacks %s:\n%s", count, stdout)
			}
			data, err := os.ReadFile(filepath.Join(dir, "profile_export_aiperf.json"))
			if err != nil {
				t.Fatal(err)
			}
			var export struct {
				TTFT         *struct{ Avg, P99 float64 } `json:"time_to_first_token"`
				RequestCount struct{ Avg float64 }       `json:"request_count"`
			}
			if err := json.Unmarshal(data, &export); err != nil {
				t.Fatal(err)
			}
			if export.TTFT == nil || export.TTFT.Avg <= 0 || export.RequestCount.Avg != float64(len(tt.want)) {
				t.Errorf("export: %s", data)
			}
		})
	}
}

// TestProfileRefusals: flags AIPerf refuses, or that select nothing, exit 2
// with the reason.
func TestProfileRefusals(t *testing.T) {
	trace := profileTrace(t)
	base := []string{"profile", "-m", "m", "--input-file", trace, "--artifact-dir", t.TempDir()}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--fixed-schedule", "--request-rate", "2"}, "--request-rate and --fixed-schedule exclude each other"},
		{[]string{"--fixed-schedule-start-offset", "9000"}, "no row is within the window (--fixed-schedule-start-offset 9000): all 8 rows fall outside it"},
		{[]string{"--fixed-schedule-start-offset", "3000", "--fixed-schedule-end-offset", "1000"}, "is before --fixed-schedule-start-offset"},
		{[]string{"--endpoint-type", "embeddings"}, "enum value must be one of chat,completions"},
		{[]string{"--custom-dataset-type", "single_turn"}, "enum value must be one of mooncake_trace"},
		{[]string{"--url", "localhost:8000/v1/chat/completions"}, "give the base URL, http://localhost:8000:"},
		{[]string{"--serve", "--request-count", "3"}, "--serve replays for ever"},
	} {
		code, _, stderr := runCLI(append(slices.Clone(base), tt.args...)...)
		if code != exitBadInput || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
}

// TestProfilePrintConfig: --print-config prints a configuration that
// passes --config.check, replays the trace once, and names its window.
func TestProfilePrintConfig(t *testing.T) {
	trace := profileTrace(t)
	dir := t.TempDir()
	code, stdout, stderr := runCLI("profile", "-m", "m", "--url", "127.0.0.1:1", "--input-file", trace, "--artifact-dir", dir,
		"--fixed-schedule-end-offset", "1000", "--concurrency", "4", "--random-seed", "7", "--synthesis-max-osl", "3", "--print-config")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"url: http://127.0.0.1:1", "loop: once", "max_in_flight: 4", "seed: 7", "max_osl: 3", "reproducible: true",
		"trace: " + filepath.Join(dir, "profile_input.jsonl")} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the configuration lacks %q:\n%s", want, stdout)
		}
	}
	cfg := filepath.Join(dir, "kvload.yml")
	if written, _ := os.ReadFile(cfg); string(written) != stdout {
		t.Errorf("%s differs from what was printed:\n%s", cfg, written)
	}
	if code, out, _ := runCLI("--config.file", cfg, "--config.check"); code != exitOK {
		t.Errorf("--config.check of the printed configuration: exit %d\n%s", code, out)
	}
	if window, _ := os.ReadFile(filepath.Join(dir, "profile_input.jsonl")); strings.Count(string(window), "\n") != 3 {
		t.Errorf("the window's trace holds other than the 3 rows from 0 to 1000 ms:\n%s", window)
	}
}

// TestProfileEveryRequestFails: a server that answers every request with
// an error ends the run with exit 1, naming the URL and the failure.
func TestProfileEveryRequestFails(t *testing.T) {
	srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) {
		f.Fail = func(*http.Request, int) (int, string) {
			return http.StatusNotFound, `{"error":{"message":"no such route"}}`
		}
	})
	code, stdout, stderr := runCLI("profile", "-m", "m", "--url", srv.URL, "--input-file", profileTrace(t),
		"--artifact-dir", t.TempDir(), "--request-count", "2")
	if code != exitFailure || !strings.Contains(stderr, "every request to "+srv.URL+" failed") || !strings.Contains(stderr, "404") {
		t.Errorf("exit %d, stderr %q; want 1, the URL and the 404", code, stderr)
	}
	if !strings.Contains(stdout, "Errors: 2 requests failed") {
		t.Errorf("the summary does not count the failures:\n%s", stdout)
	}
}

// TestPercentile: numpy's linear percentiles, as AIPerf computes them.
func TestPercentile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 10}
	for _, tt := range []struct{ p, want float64 }{{0, 1}, {50, 3}, {90, 7.6}, {99, 9.76}, {100, 10}, {25, 2}} {
		if got := percentile(v, tt.p); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", tt.p, got, tt.want)
		}
	}
	d := distributionOf("ms", []float64{2, 4, 4, 4, 5, 5, 7, 9})
	if d.Std != 2 || d.Avg != 5 {
		t.Errorf("std %v avg %v, want 2 and 5", d.Std, d.Avg)
	}
	if got := fixed2(1234567.891); got != "1,234,567.89" {
		t.Errorf("fixed2 = %q", got)
	}
}

// TestProfileRecordSize holds docs/reliability.md's figure for what the
// summary keeps of a request.
func TestProfileRecordSize(t *testing.T) {
	if size := unsafe.Sizeof(profileRecord{}); size > 120 {
		t.Errorf("a profile record takes %d bytes, more than the 120 docs/reliability.md says", size)
	}
}

// TestProfileServe: --serve runs the flags' configuration as the daemon,
// with the length histograms on /metrics, until it is stopped (exit 0).
func TestProfileServe(t *testing.T) {
	var sent sentRows
	srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) { f.Usage = sent.usage })
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var stdout, stderr testutil.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"profile", "-m", "m", "--url", strings.TrimPrefix(srv.URL, "http://"), "--input-file", profileTrace(t),
			"--artifact-dir", t.TempDir(), "--serve", "--web.listen-address", "127.0.0.1:0", "--log.level", "info"},
			streams{stdout: &stdout, stderr: &stderr})
	}()
	listening := regexp.MustCompile(`Listening on.*address=(127\.0\.0\.1:\d+)`)
	var base string
	testutil.Eventually(t, "the daemon listens", func() (bool, string) {
		m := listening.FindStringSubmatch(stderr.String())
		if m == nil {
			return false, stderr.String()
		}
		base = "http://" + m[1]
		return true, ""
	})
	testutil.Eventually(t, "the first row's lengths on /metrics", func() (bool, string) {
		mfs, err := testutil.TryScrape(base)
		if err != nil {
			return false, err.Error()
		}
		in, _ := mfs.Value("kvload_input_sequence_length_tokens")
		out, _ := mfs.Value("kvload_output_sequence_length_tokens")
		return in > 0 && out > 0, fmt.Sprintf("input %v, output %v", in, out)
	})
	stop()
	if code := testutil.Wait(t, "the daemon's exit", done); code != exitOK {
		t.Errorf("exit %d:\n%s", code, stderr.String())
	}
}
