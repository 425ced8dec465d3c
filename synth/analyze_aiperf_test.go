package synth

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// TestAnalyzeIDsToSpare: rows with more hash_ids than their input_length
// fills are counted as AIPerf's analyze-trace counts them, with all their
// ids: Context Length is 512 tokens per repeated (position, id), more than
// the row's length if so, and Unique Prompt Length below 0. The expected
// numbers are worked out by hand from AIPerf's definitions.
func TestAnalyzeIDsToSpare(t *testing.T) {
	rows := `{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 1200, "output_length": 52, "hash_ids": [0, 1, 2]}
{"timestamp": 105, "input_length": 1800, "output_length": 26, "hash_ids": [0, 3, 4, 5]}
{"timestamp": 274, "input_length": 1300, "output_length": 52, "hash_ids": [1, 4, 6]}
{"timestamp": 300, "input_length": 600, "output_length": 8, "hash_ids": [0, 1, 2, 9]}
`
	recs, err := trace.ReadAll(strings.NewReader(rows), "doc.jsonl", trace.ReadOptions{BlockSize: 512})
	if err != nil {
		t.Fatal(err)
	}
	an := Analyze(recs, 512)
	// Repeated (position, id): (0,0) ×4, (1,1) ×3, (2,2) ×3. Row 5 repeats
	// three of its four: 3·512 = 1536 tokens of context in a 600-token row.
	wantContext := []float64{655, 1200, 512, 0, 1536}
	ctx := []float64{}
	uniq := []float64{}
	for i, c := range wantContext {
		ctx = append(ctx, c)
		uniq = append(uniq, float64(recs[i].ISL())-c)
	}
	want := map[string]float64{
		"unique prefixes":      10, // [0] [0,1] [0,1,2] [0,3] [0,3,4] [0,3,4,5] [1] [1,4] [1,4,6] [0,1,2,9]
		"prefix groups":        1,
		"cache hit rate":       (0 + 1 + 0.25 + 2.0/3 + 0.75) / 5,
		"prefix reuse ratio":   (4 + 3 + 3) / 17.0, // 17 prefix occurrences, 10 of them of prefixes seen twice or more
		"context mean":         NumpyMean(ctx),
		"unique min":           600 - 1536,
		"unique mean":          NumpyMean(uniq),
		"token hit rate":       float64(0+1200+512+1024+600) / (655 + 1200 + 1800 + 1300 + 600), // hits bounded by the row
		"context max":          1536,
		"hit rate median":      2.0 / 3,
		"input length average": (655 + 1200 + 1800 + 1300 + 600) / 5.0,
	}
	got := map[string]float64{
		"unique prefixes":      float64(an.UniquePrefixes),
		"prefix groups":        float64(an.PrefixGroups),
		"cache hit rate":       an.CacheHitRate,
		"prefix reuse ratio":   an.PrefixReuseRatio,
		"context mean":         an.ContextLength.Mean,
		"unique min":           an.UniquePromptLength.Min,
		"unique mean":          an.UniquePromptLength.Mean,
		"token hit rate":       an.TokenHitRate,
		"context max":          an.ContextLength.Max,
		"hit rate median":      an.HitRate.Median,
		"input length average": an.AvgISL,
	}
	for k, w := range want {
		if math.Abs(got[k]-w) > 1e-12 {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
}

// TestWriteAIPerfGolden: the report in AIPerf's console form, on the
// shared synthetic trace.
func TestWriteAIPerfGolden(t *testing.T) {
	an := analyzeSharedTrace(t, "synthetic_trace.jsonl")
	var out bytes.Buffer
	if err := an.WriteAIPerf(&out); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, filepath.Join("testdata", "analyze", "synthetic.aiperf.txt"), out.Bytes())
	for _, line := range []string{"Cache hit rate:        42.32%", "Prefix reuse ratio:    78.94%", "  Mean:    15,325.48"} {
		if !strings.Contains(out.String(), line+"\n") {
			t.Errorf("no line %q in:\n%s", line, out.String())
		}
	}
}

// TestPythonFormats: Python's "{:,.2f}" and "{:.2%}", as printed by
// CPython 3.11.
func TestPythonFormats(t *testing.T) {
	fixed := []struct {
		x    float64
		want string
	}{
		{0, "0.00"}, {0.125, "0.12"}, {0.375, "0.38"}, {1234.565, "1,234.57"}, {999.999, "1,000.00"},
		{-1234567.891, "-1,234,567.89"}, {15325.476584022039, "15,325.48"}, {-0.001, "-0.00"},
	}
	for _, f := range fixed {
		if got := pyFixed2(f.x); got != f.want {
			t.Errorf("pyFixed2(%v) = %q, want %q", f.x, got, f.want)
		}
	}
	percent := []struct {
		x    float64
		want string
	}{
		{0.42323532378348516, "42.32%"}, {0.005, "0.50%"}, {1, "100.00%"}, {0, "0.00%"}, {0.12345, "12.35%"},
	}
	for _, p := range percent {
		if got := pyPercent(p.x); got != p.want {
			t.Errorf("pyPercent(%v) = %q, want %q", p.x, got, p.want)
		}
	}
}
