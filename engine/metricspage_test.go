package engine

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

// smallSeriesPage is a page of about size bytes of small series of
// families no read asks for, with a vLLM's cached-token counter in the
// middle: a page the exporter must read without holding it whole.
func smallSeriesPage(size int) []byte {
	var b bytes.Buffer
	b.Grow(size + 1024)
	for i := 0; b.Len() < size; i++ {
		if i == 1000 {
			b.WriteString(vllmHits(4242))
		}
		fmt.Fprintf(&b, "app_requests_total{route=\"/r%d\",code=\"200\"} %d\n", i, i)
	}
	return b.Bytes()
}

// parseHeap is the bytes allocated by one parse of page for the
// scraper's families.
func parseHeap(t testing.TB, page []byte) uint64 {
	t.Helper()
	families := (&ServerScraper{Dialect: DialectVLLM}).families()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	mfs, err := parseFamilies(bytes.NewReader(page), families)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if _, v, ok := firstPresent(mfs, For(DialectVLLM).Metrics.CachedTokens); !ok || v.sum() != 4242 {
		t.Fatalf("counter read as %v (found %v), want 4242", v, ok)
	}
	return after.TotalAlloc - before.TotalAlloc
}

// TestParseFamiliesMemory: a 30 MiB page of small series costs the parse
// of the few lines read, not of the page. (Parsed whole, such a page took
// the exporter from 189 MiB to 1.4 GiB, and the parse alone allocates
// over 1 GiB.)
func TestParseFamiliesMemory(t *testing.T) {
	page := smallSeriesPage(30 << 20)
	alloc := parseHeap(t, page)
	t.Logf("%d bytes allocated parsing a %d-byte page", alloc, len(page))
	if alloc > 1<<20 {
		t.Errorf("%d bytes allocated parsing a %d MiB page, want under 1 MiB", alloc, len(page)>>20)
	}
}

// BenchmarkParseFamilies parses a 30 MiB page of small series for a
// scrape: -benchmem shows the bytes one parse allocates.
func BenchmarkParseFamilies(b *testing.B) {
	page := smallSeriesPage(30 << 20)
	families := (&ServerScraper{Dialect: DialectVLLM}).families()
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseFamilies(bytes.NewReader(page), families); err != nil {
			b.Fatal(err)
		}
	}
}

// fuzzFamilies are the families FuzzParseFamilies reads: a counter, a
// histogram, and a name that holds a colon.
var fuzzFamilies = []string{"a_total", "h", "vllm:x"}

// FuzzParseFamilies: wherever the whole page parses, the families read
// through the filter are exactly the whole parse's, and a refusal as a
// duplicate is one the whole parse holds.
func FuzzParseFamilies(f *testing.F) {
	for _, seed := range []string{
		"# HELP a_total A counter.\n# TYPE a_total counter\na_total{x=\"1\"} 3\na_total{x=\"2\"} 4\nother 1\n",
		"# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3.5\nh_count 2\n# TYPE g gauge\ng 1\n",
		"{\"vllm:x\", a=\"b\"} 7\nvllm:x_created 1\n  vllm:x{a=\"c\"} 2\n",
		"a_total 1\na_total 2\n",
		"# TYPE \"vllm:x\" counter\n{\"vllm:x\"} 1\n",
		vllmInfo,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		whole, werr := parser.TextToMetricFamilies(bytes.NewReader(page))
		got, err := parseFamilies(bytes.NewReader(page), fuzzFamilies)
		if werr != nil {
			return
		}
		if errors.Is(err, ErrDuplicateSeries) {
			for _, name := range fuzzFamilies {
				if noDuplicates(whole[name]) != nil {
					return
				}
			}
			t.Fatalf("refused as a duplicate (%v), which the whole parse does not hold", err)
		}
		if err != nil {
			t.Fatalf("the whole page parses, the filtered one fails: %v", err)
		}
		for _, name := range fuzzFamilies {
			if !proto.Equal(whole[name], got[name]) {
				t.Fatalf("family %s: filtered %v, whole %v", name, got[name], whole[name])
			}
		}
	})
}
