package lifecycle

import (
	"testing"

	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// BenchmarkBuildRequest builds the prompt of a 3,000-token row whose six
// blocks are cached, as a replay does after its first pass: what each
// request allocates for its prompt.
func BenchmarkBuildRequest(b *testing.B) {
	pb, err := prompt.NewBuilder(prompt.Options{BlockSize: 512, Seed: 1, CacheBytes: promptCacheBytes})
	if err != nil {
		b.Fatal(err)
	}
	isl, osl := 3000, 128
	rec := &trace.Record{InputLength: &isl, OutputLength: &osl, HashIDs: []int64{1, 2, 3, 4, 5, 6}, Line: 1}
	rb := &requestBuilder{prompts: pb}
	if _, err := rb.Build(rec, 0, 0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		req, err := rb.Build(rec, 0, 0)
		if err != nil || req.BuiltTokens != isl {
			b.Fatalf("built %d tokens, %v", req.BuiltTokens, err)
		}
	}
}
