package cli

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// sessionRows is a trace whose replay order is not its file order: turns
// of sessions placed by their delays, a timed later turn held back by its
// predecessor, and ties between conversations.
const sessionRows = `{"timestamp": 50, "input_length": 1100, "hash_ids": [1, 2, 3], "session_id": "a"}
{"timestamp": 10, "input_length": 600, "hash_ids": [1, 4]}
{"input_length": 1600, "hash_ids": [1, 2, 12, 5], "session_id": "a", "delay": 5}
{"timestamp": 10, "input_length": 1030, "hash_ids": [1, 13, 6], "session_id": "b"}
{"timestamp": 0, "input_length": 1600, "hash_ids": [1, 13, 14, 7], "session_id": "b"}
{"timestamp": 55, "input_length": 700, "hash_ids": [1, 15]}
{"timestamp": 54, "input_length": 20, "hash_ids": [9]}
{"timestamp": 54, "input_length": 20, "hash_ids": [9]}
{"input_length": 2100, "hash_ids": [1, 2, 12, 16, 11], "session_id": "a"}
{"timestamp": 56, "input_length": 400}
{"timestamp": 57, "input_length": 1030, "hash_ids": [1, 13, 6]}
{"timestamp": 58, "input_length": 600, "hash_ids": [1, 4]}
`

// replayHits is what the exporter's own cache model, replay.CacheModel,
// gives one pass of rows with a cache of capacity server blocks (0:
// unbounded): the theoretical cached tokens of every row, added up.
func replayHits(t *testing.T, rows *trace.Table, serverBlock, capacity int) int64 {
	t.Helper()
	plan, err := replay.NewPlan(rows, 1, "trace")
	if err != nil {
		t.Fatal(err)
	}
	pacer, err := plan.NewPacer(replay.PacerOptions{Loop: replay.LoopOnce})
	if err != nil {
		t.Fatal(err)
	}
	model := replay.NewCacheModel(pacer, replay.CacheParams{
		TraceBlock: 512, ServerBlock: serverBlock, CapacityBlocks: capacity, Granularity: engine.GranularityBlock,
	})
	var sum int64
	for r := range rows.Len() {
		tokens, known := model.Accept(replay.PacerItem{Pass: 0, Index: r})
		if !known {
			t.Fatalf("row %d: the model does not know its hit", r)
		}
		sum += int64(tokens)
	}
	return sum
}

// TestCapacityCurveMatchesReplayModel holds the curve, as analyze
// --capacity-curve computes it, to the model the exporter judges engines
// by, at ten capacities of each shared trace: the same hit tokens exactly.
// The two share the order and the rounding (idealcache) but not the cache:
// the curve's one pass of stack distances, with its bound on the blocks
// held, must give what replay's LRU of each size gives. The capacities
// include ones off the grid, one below a trace block and the footprint.
func TestCapacityCurveMatchesReplayModel(t *testing.T) {
	tests := []struct {
		name        string
		path        string // or text
		text        string
		serverBlock int
		capacities  []int64 // tokens
	}{
		{name: "conversation", path: "../../testdata/mooncake/conversation_trace.jsonl", serverBlock: 16,
			capacities: []int64{16, 512, 8_000, 100_000, 1_000_000, 2_500_016, 4_194_304, 15_630_320, 40_000_000, 90_606_656}},
		{name: "synthetic", path: "../../testdata/mooncake/synthetic_trace.jsonl", serverBlock: 16,
			capacities: []int64{32, 1_024, 20_000, 250_000, 999_984, 3_108_848, 5_000_000, 10_100_720, 16_646_128, 21_313_728}},
		{name: "synthetic, blocks of 32", path: "../../testdata/mooncake/synthetic_trace.jsonl", serverBlock: 32,
			capacities: []int64{32, 4_096, 65_536, 1_000_000, 6_000_000}},
		{name: "sessions", text: sessionRows, serverBlock: 16,
			capacities: []int64{16, 64, 512, 1_024, 1_536, 2_048, 3_072, 4_096}},
		{name: "sessions, blocks larger than the trace's", text: sessionRows, serverBlock: 1024,
			capacities: []int64{1_024, 2_048, 3_072, 4_096, 8_192}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.path
			if path == "" {
				path = writeTrace(t, tt.text)
			}
			rows, err := readTraceTable(testutil.NeedShared(t, path), 512)
			if err != nil {
				t.Fatal(err)
			}
			plan, err := replay.NewPlan(rows, 1, path)
			if err != nil {
				t.Fatal(err)
			}
			curve, err := synth.CapacityCurveOf(context.Background(), rows, plan.FleetOrder(), path, synth.CurveOptions{
				TraceBlock: 512, ServerBlock: tt.serverBlock, MaxCapacity: synth.DefaultMaxCapacity, Capacities: tt.capacities,
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := replayHits(t, rows, tt.serverBlock, 0); curve.InfiniteHitTokens != want {
				t.Errorf("infinite cache: %d hit tokens, the replay's model %d", curve.InfiniteHitTokens, want)
			}
			asked := 0
			for _, p := range curve.Points {
				if !p.Requested {
					continue
				}
				asked++
				if want := replayHits(t, rows, tt.serverBlock, int(p.CapacityBlocks)); p.HitTokens != want {
					t.Errorf("capacity %d blocks: %d hit tokens, the replay's model %d", p.CapacityBlocks, p.HitTokens, want)
				}
			}
			if asked != len(tt.capacities) {
				t.Errorf("%d of the %d capacities asked for are in the curve", asked, len(tt.capacities))
			}
		})
	}
}

// curveDir holds the golden reports of a small trace, in package synth.
const curveDir = "../../synth/testdata/capacity/"

// TestCapacityCurveOutputs runs analyze --capacity-curve and checks stdout
// and --output-file against synth's golden reports, and that --plot draws
// an SVG image.
func TestCapacityCurveOutputs(t *testing.T) {
	table, js := readFile(t, curveDir+"small.txt"), readFile(t, curveDir+"small.json")
	trace := curveDir + "small.jsonl"
	flags := []string{"--capacity-curve", "--capacities", "2k,3Ki,10000"}
	tests := []struct {
		name       string
		flags      []string
		wantStdout string
		wantFile   string
	}{
		{"table by default", nil, table, ""},
		{"json", []string{"--format=json"}, js, ""},
		{"table and a JSON file", []string{"--output-file", "OUT"}, table, js},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "new", "curve.json")
			args := append([]string{"analyze", trace}, flags...)
			for _, f := range tt.flags {
				args = append(args, strings.ReplaceAll(f, "OUT", out))
			}
			code, stdout, stderr := runCLI(args...)
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
			case tt.wantFile != "" && string(got) != tt.wantFile:
				t.Errorf("output file:\n%s\nwant:\n%s (err %v)", got, tt.wantFile, err)
			}
		})
	}
	if !json.Valid([]byte(js)) {
		t.Errorf("the golden JSON does not parse")
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// svgElements counts the elements of an SVG document by name, and keeps
// its text.
func svgElements(t *testing.T, doc []byte) (map[string]int, string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(string(doc)))
	count := map[string]int{}
	var text strings.Builder
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the plot is not XML: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = e.Name.Local
			}
			count[e.Name.Local]++
		case xml.CharData:
			text.Write(e)
			text.WriteByte('\n')
		}
	}
	if root != "svg" {
		t.Fatalf("the plot's root element is %q, want svg", root)
	}
	return count, text.String()
}

// TestCapacityCurvePlot draws the curve of the shared synthetic trace and
// reads the SVG back: the axes' labels, the limit and the three targets.
func TestCapacityCurvePlot(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "plots", "curve.svg")
	code, _, stderr := runCLI("analyze", testutil.NeedShared(t, sharedSynthetic), "--capacity-curve", "--plot", plot)
	if code != exitOK || withoutProgress(stderr) != "" {
		t.Fatalf("exit code %d, stderr %q", code, stderr)
	}
	doc, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	count, text := svgElements(t, doc)
	if count["path"] < 10 || count["text"] < 10 {
		t.Errorf("elements %v: want the curve's paths and the axes' texts", count)
	}
	// The figures of the golden table of synth's shared-trace test.
	for _, want := range []string{
		"KV capacity, tokens (blocks of 16)", "token hit rate, %", "infinite cache, 65.12 %",
		"50 %: 3.1M", "90 %: 10.1M", "99 %: 16.6M", "1M", "10k",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the plot has no text %q; its texts:\n%s", want, text)
		}
	}
}

func TestCapacityCurveBadInput(t *testing.T) {
	const good = `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}` + "\n"
	tests := []struct {
		name    string
		content string
		flags   []string
		want    string
	}{
		{"server block without the curve", good, []string{"--server-block-size", "32"}, "--server-block-size needs --capacity-curve"},
		{"plot without the curve", good, []string{"--plot", "x.svg"}, "--plot needs --capacity-curve"},
		{"capacities without the curve", good, []string{"--capacities", "1M"}, "--capacities needs --capacity-curve"},
		{"zero server block", good, []string{"--capacity-curve", "--server-block-size", "0"}, "--server-block-size must be positive, got 0"},
		{"bad capacity", good, []string{"--capacity-curve", "--capacities", "1M,lots"}, `--capacities: "lots" is not a token count such as 4096, 512k or 4Mi`},
		{"capacity above the largest", good, []string{"--capacity-curve", "--capacities", "2M", "--max-capacity", "1M"}, "capacity 2000000 tokens is outside [16, 1000000]"},
		{"capacity below a block", good, []string{"--capacity-curve", "--capacities", "8"}, "capacity 8 tokens is outside [16, 256000000]"},
		{"largest capacity too large", good, []string{"--capacity-curve", "--max-capacity", "100G", "--server-block-size", "1"}, "the largest capacity, 100000000000 tokens, is more than"},
		{"bad largest capacity", good, []string{"--capacity-curve", "--max-capacity=-1"}, `--max-capacity: "-1" is not a token count`},
		{"no timestamp", `{"input_length": 600, "hash_ids": [0, 1]}` + "\n", []string{"--capacity-curve"}, "FILE:1: row has no timestamp"},
		{"bad row", good + `{"input_length": 2000, "hash_ids": [7]}` + "\n", []string{"--capacity-curve"}, "FILE:2: input_length 2000 does not fit 1 hash_ids"},
		{"empty", "", []string{"--capacity-curve"}, "FILE: trace has no rows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeTrace(t, tt.content)
			code, stdout, stderr := runCLI(append([]string{"analyze", path}, tt.flags...)...)
			if code != exitBadInput {
				t.Errorf("exit code %d, want %d; stderr %q", code, exitBadInput, stderr)
			}
			if want := strings.ReplaceAll(tt.want, "FILE", path); !strings.Contains(stderr, want) {
				t.Errorf("stderr %q does not contain %q", stderr, want)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}
}

func TestParseTokenCount(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "4096", want: 4096},
		{in: " 512k ", want: 512_000},
		{in: "1M", want: 1_000_000},
		{in: "2G", want: 2_000_000_000},
		{in: "3Ki", want: 3 << 10},
		{in: "4Mi", want: 4 << 20},
		{in: "1Gi", want: 1 << 30},
		{in: "", wantErr: "is not a token count"},
		{in: "M", wantErr: "is not a token count"},
		{in: "1.5M", wantErr: "is not a token count"},
		{in: "+5", wantErr: "is not a token count"},
		{in: "-5", wantErr: "is not a token count"},
		{in: "1m", wantErr: "is not a token count"},
		{in: "0", wantErr: "must be positive"},
		{in: "10000000000G", wantErr: "too many tokens"},
	}
	for _, tt := range tests {
		got, err := parseTokenCount(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseTokenCount(%q) = %d, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseTokenCount(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	if got, err := parseTokenCounts("1k, 2Ki,3"); err != nil || len(got) != 3 || got[0] != 1000 || got[1] != 2048 || got[2] != 3 {
		t.Errorf("parseTokenCounts = %v, %v", got, err)
	}
	if got, err := parseTokenCount(defaultMaxCapacity); err != nil || got != synth.DefaultMaxCapacity {
		t.Errorf("the flag's default %q is %d (%v), not synth.DefaultMaxCapacity", defaultMaxCapacity, got, err)
	}
	if got, err := parseTokenCounts(" "); err != nil || got != nil {
		t.Errorf("parseTokenCounts of nothing = %v, %v", got, err)
	}
}

// FuzzParseTokenCount: any input gives a positive count or an error, and
// a count prints back to itself.
func FuzzParseTokenCount(f *testing.F) {
	for _, s := range []string{"4096", "512k", "4Mi", "1G", "", "-1", "9223372036854775807", "9Gi"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseTokenCount(s)
		if err != nil {
			return
		}
		if n <= 0 {
			t.Fatalf("parseTokenCount(%q) = %d", s, n)
		}
		if again, err := parseTokenCount(strconv.FormatInt(n, 10)); err != nil || again != n {
			t.Fatalf("%d does not parse back: %d, %v", n, again, err)
		}
	})
}
