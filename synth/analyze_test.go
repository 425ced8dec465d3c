package synth

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// update rewrites the golden files: go test ./synth -run TestAnalyzeGolden
// -update. (Same convention as the collector and config packages; other
// golden tests of this package should share it.)
var update = flag.Bool("update", false, "rewrite golden files")

// sharedTraces is where the project's reference traces live, relative to
// this package's directory. They are read, never written.
const sharedTraces = "../testdata/mooncake/"

func row(isl, osl int, ids ...int64) trace.Record {
	r := trace.Record{InputLength: &isl, OutputLength: &osl}
	if ids != nil {
		r.HashIDs = ids
	}
	return r
}

func TestAnalyzeByHand(t *testing.T) {
	// Block 512. Prefixes: (1)×3, (1,2)×2, (1,2,3)×1, (1,4)×1 → 4 unique,
	// 5 of 7 occurrences reused. Repeated (pos,id): (0,1), (1,2).
	rows := []trace.Record{
		row(1300, 10, 1, 2, 3), // context 2 blocks = 1024, unique 276; hit 0/3
		row(1024, 20, 1, 2),    // every pair repeated: context = isl; hit 2/2
		row(700, 5, 1, 4),      // context 512, unique 188; hit 1/2
		row(100, 1),            // no ids: context 0, no hit rate
	}
	want := Analysis{
		BlockSize:        512,
		TotalRequests:    4,
		UniquePrefixes:   4,
		PrefixGroups:     1,
		CacheHitRate:     0.5,
		PrefixReuseRatio: 5.0 / 7,
		// hit tokens 0 + 1024 + 512 of the 3024 in rows with ids.
		TokenHitRate: 1536.0 / 3024,
		// The ids are prefix-consistent: keyed by chains, the same.
		ChainTokenHitRate: 1536.0 / 3024,
		MinISL:            100, MaxISL: 1300, AvgISL: 781,
		MinOSL: 1, MaxOSL: 20, AvgOSL: 9,
		// isl deviations 519, 243, −81, −681: squares sum to 798732.
		ISL: &MetricStats{Mean: 781, StdDev: math.Sqrt(798732.0 / 4), Min: 100, P25: 550, Median: 862, P75: 1093, Max: 1300},
		// osl 10, 20, 5, 1: deviations 1, 11, −4, −8 → 202.
		OSL: &MetricStats{Mean: 9, StdDev: math.Sqrt(202.0 / 4), Min: 1, P25: 4, Median: 7.5, P75: 12.5, Max: 20},
		// context 1024, 1024, 512, 0: deviations 384, 384, −128, −640.
		ContextLength: &MetricStats{Mean: 640, StdDev: math.Sqrt(720896.0 / 4), Min: 0, P25: 384, Median: 768, P75: 1024, Max: 1024},
		// unique 276, 0, 188, 100: deviations 135, −141, 47, −41.
		UniquePromptLength: &MetricStats{Mean: 141, StdDev: math.Sqrt(41996.0 / 4), Min: 0, P25: 75, Median: 144, P75: 210, Max: 276},
		HitRate:            &MetricStats{Mean: 0.5, StdDev: math.Sqrt(0.5 / 3), Min: 0, P25: 0.25, Median: 0.5, P75: 0.75, Max: 1},
	}
	got := Analyze(rows, 512)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Analyze =\n%s\nwant\n%s", got.AppendJSON(nil), want.AppendJSON(nil))
	}
}

// TestAnalyzeIrregularIDs covers ids that are not prefix hashes: the same
// id under several parents and at several positions, which the analyzer
// handles outside its fast path.
func TestAnalyzeIrregularIDs(t *testing.T) {
	rows := []trace.Record{
		row(1000, 1, 5, 6),    // pairs (0,5), (1,6) both recur: context 1000
		row(1000, 1, 6, 5),    // (0,6), (1,5) occur once: context 0; hit 2/2
		row(1000, 1, 5, 6),    // context 1000; hit 2/2
		row(1100, 1, 7, 6, 5), // only (1,6) recurs: context 512; hit 0/3
		row(300, 1),           // no ids
		{InputLength: trace.Ptr(200), HashIDs: []int64{}}, // empty ids are no ids
	}
	got := Analyze(rows, 512)
	// (5), (5,6), (6), (6,5), (7), (7,6), (7,6,5); (5) and (5,6) are in
	// two rows each: 4 of 9 occurrences reused.
	if got.UniquePrefixes != 7 || got.PrefixGroups != 1 || got.PrefixReuseRatio != 4.0/9 {
		t.Errorf("prefixes %d, groups %d, reuse %v; want 7, 1, 4/9", got.UniquePrefixes, got.PrefixGroups, got.PrefixReuseRatio)
	}
	if got.CacheHitRate != 0.5 || got.HitRate.Max != 1 || got.HitRate.Min != 0 {
		t.Errorf("hit rate %v, stats %+v; want 0.5 from 0, 1, 1, 0", got.CacheHitRate, *got.HitRate)
	}
	if want := (1000.0 + 0 + 1000 + 512) / 6; got.ContextLength.Mean != want {
		t.Errorf("context mean %v, want %v", got.ContextLength.Mean, want)
	}
	// Rows 2 and 4 use 5 and 6 after other blocks than where they first
	// came. Keyed by chains only row 3 hits, 1000 of the 4,100 tokens of
	// the rows with ids; by id, rows 2 and 3.
	if got.ReusingRows != 2 || got.FirstReusingRow != 2 || got.ChainTokenHitRate != 1000.0/4100 || got.TokenHitRate != 2000.0/4100 {
		t.Errorf("%d rows reusing ids, the first %d, token hit rates %v chained and %v by id; want 2, 2, 1000/4100 and 2000/4100",
			got.ReusingRows, got.FirstReusingRow, got.ChainTokenHitRate, got.TokenHitRate)
	}
	if got.MinOSL != 0 || got.TotalRequests != 6 {
		t.Errorf("min osl %d (a row without output_length counts 0), rows %d", got.MinOSL, got.TotalRequests)
	}

	// Renaming ids must change nothing, whether they stay small (used as
	// slice indexes) or become huge (numbered through a map).
	for _, rename := range []func(int64) int64{
		func(id int64) int64 { return id + 3 },
		func(id int64) int64 { return id*1_000_000_007 + 1<<40 },
	} {
		renamed := make([]trace.Record, len(rows))
		for i, r := range rows {
			renamed[i] = r.Clone()
			for j := range renamed[i].HashIDs {
				renamed[i].HashIDs[j] = rename(renamed[i].HashIDs[j])
			}
		}
		if again := Analyze(renamed, 512); !reflect.DeepEqual(again, got) {
			t.Errorf("renamed ids give\n%s\nwant\n%s", again.AppendJSON(nil), got.AppendJSON(nil))
		}
	}
}

func TestAnalyzeEmpty(t *testing.T) {
	got := Analyze(nil, 512)
	want := Analysis{BlockSize: 512}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Analyze(nil) = %+v", got)
	}
	var table bytes.Buffer
	if err := got.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(table.Bytes(), []byte("N/A")); n != 5*7 {
		t.Errorf("table of nothing has %d N/A cells, want 35:\n%s", n, table.Bytes())
	}
	if !bytes.Contains(got.AppendJSON(nil), []byte(`"hit_rate_stats": null`)) {
		t.Errorf("JSON of nothing lacks null stats:\n%s", got.AppendJSON(nil))
	}
}

func TestGroupThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 408: "408", 3993: "3,993", 182790: "182,790", 1234567: "1,234,567", -1000: "-1,000"} {
		if got := groupThousands(n); got != want {
			t.Errorf("groupThousands(%d) = %q, want %q", n, got, want)
		}
	}
}

func analyzeSharedTrace(t testing.TB, name string) Analysis {
	t.Helper()
	recs, err := trace.ReadFile(sharedTraces+name, trace.ReadOptions{BlockSize: trace.DefaultBlockSize})
	if err != nil {
		t.Fatalf("the shared traces are part of the test: %v", err)
	}
	return Analyze(recs, trace.DefaultBlockSize)
}

// TestAnalyzeAcceptance pins the numbers that AIPerf and Dynamo print for
// the FAST'25 traces (trace-semantics.md §3.2) independently of the golden
// files, so that regenerating those cannot hide a regression.
func TestAnalyzeAcceptance(t *testing.T) {
	an := analyzeSharedTrace(t, "synthetic_trace.jsonl")
	checks := []struct {
		name      string
		got, want float64
	}{
		{"rows", float64(an.TotalRequests), 3993},
		{"unique prefixes", float64(an.UniquePrefixes), 43924},
		{"prefix groups", float64(an.PrefixGroups), 408},
		{"input mean", an.ISL.Mean, 15325.476584022039},
		{"input std", an.ISL.StdDev, 18380.153822273725},
		{"context mean", an.ContextLength.Mean, 12307.656899574255},
		{"unique mean", an.UniquePromptLength.Mean, 3017.8196844477834},
		{"output mean", an.OSL.Mean, 149.11895817680943},
		{"hit mean", an.HitRate.Mean, 0.42323532378348516},
		{"hit std", an.HitRate.StdDev, 0.47406477379768286},
		{"hit median", an.HitRate.Median, 0.0},
		{"hit p75", an.HitRate.P75, 0.9666666666666667},
		{"prefix reuse ratio", an.PrefixReuseRatio, 0.7893532003577377},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("synthetic trace %s = %v, want %v", c.name, FormatPyFloat(c.got), FormatPyFloat(c.want))
		}
	}
	if conv := analyzeSharedTrace(t, "conversation_trace.jsonl"); conv.UniquePrefixes != 182790 || conv.TotalRequests != 12031 {
		t.Errorf("conversation trace: %d rows, %d unique prefixes; want 12031, 182790", conv.TotalRequests, conv.UniquePrefixes)
	}
}

// TestAnalyzeGolden compares the full table and JSON reports of both shared
// traces with testdata/analyze; any changed digit fails.
func TestAnalyzeGolden(t *testing.T) {
	for _, name := range []string{"synthetic", "conversation"} {
		t.Run(name, func(t *testing.T) {
			an := analyzeSharedTrace(t, name+"_trace.jsonl")
			var table bytes.Buffer
			if err := an.WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, filepath.Join("testdata", "analyze", name+".txt"), table.Bytes())
			checkGolden(t, filepath.Join("testdata", "analyze", name+".json"), an.AppendJSON(nil))
		})
	}
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output:\n--- got\n%s--- want\n%s", path, got, want)
	}
}

const conversationRows = 12031

func readSharedBytes(b *testing.B, name string) []byte {
	b.Helper()
	data, err := os.ReadFile(sharedTraces + name)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkAnalyzeConversation measures what `analyze` does: stream the
// conversation trace through the reader into an Analyzer and compute the
// result.
func BenchmarkAnalyzeConversation(b *testing.B) {
	data := readSharedBytes(b, "conversation_trace.jsonl")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		rd := trace.NewReader(bytes.NewReader(data), "conversation_trace.jsonl", trace.ReadOptions{BlockSize: trace.DefaultBlockSize})
		a := NewAnalyzer(trace.DefaultBlockSize)
		for {
			rec, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			a.Add(&rec)
		}
		if an := a.Result(); an.UniquePrefixes != 182790 {
			b.Fatalf("unique prefixes %d", an.UniquePrefixes)
		}
	}
	b.ReportMetric(float64(conversationRows)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// TestAnalyzeTableAligned: every number column of the statistics table is
// right-aligned to one width, so a column of short numbers (Min) reads
// like the others.
func TestAnalyzeTableAligned(t *testing.T) {
	rows := []trace.Record{row(1300, 10, 1, 2, 3), row(1024, 20, 1, 2), row(700, 5, 1, 4)}
	an := Analyze(rows, 512)
	var b strings.Builder
	if err := an.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(b.String(), "Trace Statistics\n")
	var ends [][]int
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		var e []int
		for _, m := range regexp.MustCompile(`\S+( \S+)*`).FindAllStringIndex(line, -1) {
			e = append(e, m[1])
		}
		ends = append(ends, e)
	}
	for i, e := range ends {
		if len(e) != 8 {
			t.Fatalf("line %d has %d cells: %v", i, len(e), e)
		}
		for c := 2; c < 8; c++ {
			if e[c]-e[c-1] != e[2]-e[1] || e[c] != ends[0][c] {
				t.Errorf("line %d: column %d ends at %d (header %d); cell ends %v", i, c, e[c], ends[0][c], e)
			}
		}
	}
}

// TestAnalyzeChainReuse: the rows that reuse ids after another chain are
// counted, and the token hit rate of a cache keyed by chains is given
// beside AIPerf's; on the shared Mooncake traces the two agree.
func TestAnalyzeChainReuse(t *testing.T) {
	tests := []struct {
		file           string
		reusing, first int
		chain          float64 // the chained token hit rate; NaN: equal to TokenHitRate
	}{
		{"../testdata/aiperf/custom_trace.jsonl", 1, 3, 512.0 / 4300},
		{sharedTraces + "conversation_trace.jsonl", 0, 0, math.NaN()},
		{sharedTraces + "synthetic_trace.jsonl", 0, 0, math.NaN()},
	}
	for _, tt := range tests {
		rows := readTable(t, tt.file)
		a := NewAnalyzer(512)
		for i := range rows.Len() {
			rec := rows.Record(i)
			a.Add(&rec)
		}
		an := a.Result()
		chain := tt.chain
		if math.IsNaN(chain) {
			chain = an.TokenHitRate
		}
		if an.ReusingRows != tt.reusing || an.FirstReusingRow != tt.first || an.ChainTokenHitRate != chain {
			t.Errorf("%s: %d rows reusing ids, the first %d, chained token hit rate %v; want %d, %d, %v",
				tt.file, an.ReusingRows, an.FirstReusingRow, an.ChainTokenHitRate, tt.reusing, tt.first, chain)
		}
	}
}
