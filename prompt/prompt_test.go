package prompt

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/tokenizer/tokenizertest"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// sharedTrace is the path of one of the shared Mooncake traces.
func sharedTrace(name string) string {
	return filepath.Join("..", "testdata", "mooncake", name)
}

var sharedTraceNames = []string{"conversation_trace.jsonl", "synthetic_trace.jsonl"}

// raceEnabled lets the slowest tests sample less under the race detector,
// which slows tokenizing about tenfold.
const raceEnabled = testutil.RaceEnabled

func newTestBuilder(t testing.TB, o Options) *Builder {
	t.Helper()
	if o.BlockSize == 0 {
		o.BlockSize = 512
	}
	b, err := NewBuilder(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wordCount counts the builder's words: each starts with the only space.
func wordCount(text []byte) int { return bytes.Count(text, []byte{' '}) }

func TestPromptWordList(t *testing.T) {
	seen := make(map[string]bool, len(promptWords))
	for _, w := range promptWords {
		if len(w) < 3 || w[0] != ' ' || strings.Trim(w[1:], "abcdefghijklmnopqrstuvwxyz") != "" {
			t.Errorf("word %q is not a space and lowercase ASCII letters", w)
		}
		if seen[w] {
			t.Errorf("word %q appears twice", w)
		}
		seen[w] = true
	}
}

// TestPromptWordsOneToken: every word is exactly one token in each of the
// four tokenizers, and NewBuilder accepts each of them.
func TestPromptWordsOneToken(t *testing.T) {
	for _, name := range tokenizertest.Names {
		t.Run(name, func(t *testing.T) {
			// NewBuilder encodes every word and fails on the first
			// that is not exactly one token.
			newTestBuilder(t, Options{Tokenizer: tokenizertest.Load(t, name)})
		})
	}
}

// TestPromptNoCrossWordMerges tokenizes long random word sequences, the
// whole list in order and reversed, and checks the ids are exactly one per
// word: no merge ever spans two words.
func TestPromptNoCrossWordMerges(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	seqs := [][]int{make([]int, len(promptWords)), make([]int, len(promptWords))}
	for i := range promptWords {
		seqs[0][i] = i
		seqs[1][i] = len(promptWords) - 1 - i
	}
	for range 4 {
		s := make([]int, 8000)
		for i := range s {
			s[i] = r.IntN(len(promptWords))
		}
		seqs = append(seqs, s)
	}
	for _, name := range tokenizertest.Names {
		t.Run(name, func(t *testing.T) {
			tok := tokenizertest.Load(t, name)
			b := newTestBuilder(t, Options{Tokenizer: tok})
			for si, s := range seqs {
				var text []byte
				want := make([]int, len(s))
				for i, w := range s {
					text = append(text, promptWords[w]...)
					want[i] = b.wordIDs[w]
				}
				got, err := tok.Encode(string(text))
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					i := 0
					for i < min(len(got), len(want)) && got[i] == want[i] {
						i++
					}
					t.Errorf("sequence %d: %d tokens for %d words; first difference at token %d", si, len(got), len(want), i)
				}
			}
		})
	}
}

func TestPromptBlocks(t *testing.T) {
	const B = 16
	b := newTestBuilder(t, Options{BlockSize: B, Seed: 7})
	text := func(ids []int64, isl int, ns uint64) []byte {
		t.Helper()
		out, err := b.AppendText(nil, &trace.Record{InputLength: trace.Ptr(isl), HashIDs: ids}, ns, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := wordCount(out); got != isl {
			t.Fatalf("ids %v isl %d: %d words", ids, isl, got)
		}
		return out
	}
	// Length: full blocks then the remainder.
	for _, tc := range []struct {
		ids []int64
		isl int
	}{{[]int64{1}, 1}, {[]int64{1}, B}, {[]int64{1, 2}, B + 1}, {[]int64{1, 2, 3}, 3 * B}, {[]int64{9, 8, 7, 6}, 3*B + 5}} {
		text(tc.ids, tc.isl, 0)
	}
	// A partial block is a prefix of the full block of the same id.
	full := text([]int64{5}, B, 0)
	for n := 1; n < B; n++ {
		if p := text([]int64{5}, n, 0); !bytes.HasPrefix(full, p) {
			t.Fatalf("partial block of %d words is not a prefix of the full block", n)
		}
	}
	// Equal hash-id prefixes give byte-identical prompt prefixes; the first
	// differing block differs.
	a := text([]int64{1, 2, 3, 4}, 4*B, 0)
	c := text([]int64{1, 2, 30}, 2*B+3, 0)
	p := text([]int64{1, 2}, 2*B, 0)
	if !bytes.HasPrefix(a, p) || !bytes.HasPrefix(c, p) {
		t.Fatal("rows sharing hash ids 1, 2 do not share the prompt prefix")
	}
	if bytes.Equal(a[len(p):len(p)+10], c[len(p):len(p)+10]) {
		t.Fatal("different third blocks start alike")
	}
	// Another namespace gives another prompt.
	if bytes.Equal(text([]int64{1}, B, 0), text([]int64{1}, B, 1)) {
		t.Fatal("namespace does not change the block")
	}
	// Another seed gives another prompt; the same seed the same, whatever
	// was built before (order independence).
	b2 := newTestBuilder(t, Options{BlockSize: B, Seed: 8})
	b3 := newTestBuilder(t, Options{BlockSize: B, Seed: 7, CacheBytes: 1 << 20})
	r := &trace.Record{InputLength: trace.Ptr(4 * B), HashIDs: []int64{1, 2, 3, 4}}
	if o, _ := b2.AppendText(nil, r, 0, 0); bytes.Equal(o, a) {
		t.Fatal("seed does not change the prompt")
	}
	for range 2 { // the second time from the cache
		if o, _ := b3.AppendText(nil, r, 0, 0); !bytes.Equal(o, a) {
			t.Fatal("same seed, other builder: different prompt")
		}
	}
}

func TestPromptFreshRows(t *testing.T) {
	b := newTestBuilder(t, Options{Seed: 3})
	build := func(isl int, ns, key uint64) []byte {
		out, err := b.AppendText(nil, &trace.Record{InputLength: trace.Ptr(isl)}, ns, key)
		if err != nil {
			t.Fatal(err)
		}
		if wordCount(out) != isl {
			t.Fatalf("fresh row: %d words, want %d", wordCount(out), isl)
		}
		return out
	}
	x := build(1000, 0, 1)
	if !bytes.Equal(x, build(1000, 0, 1)) {
		t.Fatal("fresh text is not deterministic")
	}
	if bytes.Equal(x[:50], build(1000, 0, 2)[:50]) || bytes.Equal(x[:50], build(1000, 1, 1)[:50]) {
		t.Fatal("fresh text does not depend on row key and namespace")
	}
	// A row key must not reproduce the block of the equal hash id.
	blk, _ := b.AppendText(nil, &trace.Record{InputLength: trace.Ptr(512), HashIDs: []int64{1}}, 0, 0)
	if bytes.Equal(blk, build(512, 0, 1)) {
		t.Fatal("fresh row equals the hash-id block of the same number")
	}
}

func TestPromptErrors(t *testing.T) {
	b := newTestBuilder(t, Options{BlockSize: 512})
	tests := []struct {
		name string
		rec  trace.Record
		want string
		is   error
	}{
		{"last block too long", trace.Record{InputLength: trace.Ptr(1025), HashIDs: []int64{1, 2}}, "leaves 513 tokens", ErrInconsistentLength},
		{"last block empty", trace.Record{InputLength: trace.Ptr(512), HashIDs: []int64{1, 2}}, "leaves 0 tokens", ErrInconsistentLength},
		{"no input_length", trace.Record{HashIDs: []int64{1}}, "no input_length", nil},
		{"zero length fresh", trace.Record{InputLength: trace.Ptr(0)}, "must be positive", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.AppendText(nil, &tc.rec, 0, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("error = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := b.AppendTokenIDs(nil, &trace.Record{InputLength: trace.Ptr(3)}, 0, 0); err == nil {
		t.Fatal("AppendTokenIDs without a tokenizer: no error")
	}
	for _, o := range []Options{{BlockSize: 0}, {BlockSize: 16, CacheBytes: -1}} {
		if _, err := NewBuilder(o); err == nil {
			t.Errorf("NewBuilder(%+v): no error", o)
		}
	}
}

// TestPromptTokenIDs: the ids equal the tokenization of the text, and decode
// back to it, with and without the cache.
func TestPromptTokenIDs(t *testing.T) {
	recs := []trace.Record{
		{InputLength: trace.Ptr(1300), HashIDs: []int64{0, 1, 2}},
		{InputLength: trace.Ptr(700), HashIDs: []int64{0, 5}},
		{InputLength: trace.Ptr(77)},
	}
	for _, name := range tokenizertest.Names {
		t.Run(name, func(t *testing.T) {
			tok := tokenizertest.Load(t, name)
			for _, cache := range []int64{0, 1 << 20} {
				b := newTestBuilder(t, Options{Tokenizer: tok, CacheBytes: cache, Seed: 11})
				for i := range recs {
					for range 2 {
						text, err := b.AppendText(nil, &recs[i], 4, uint64(i))
						if err != nil {
							t.Fatal(err)
						}
						ids, err := b.AppendTokenIDs(nil, &recs[i], 4, uint64(i))
						if err != nil {
							t.Fatal(err)
						}
						enc, err := tok.Encode(string(text))
						if err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(ids, enc) || len(ids) != recs[i].ISL() {
							t.Fatalf("row %d: ids (%d) differ from Encode(text) (%d), isl %d", i, len(ids), len(enc), recs[i].ISL())
						}
						dec, err := tok.Decode(ids)
						if err != nil || dec != string(text) {
							t.Fatalf("row %d: Decode(ids) differs from text (err %v)", i, err)
						}
					}
				}
			}
		})
	}
}

// TestPromptCacheConcurrent builds from many goroutines through a cache far
// smaller than the working set (run with -race) and compares with uncached
// prompts; the cache stays within its bound.
func TestPromptCacheConcurrent(t *testing.T) {
	const limit = 64 << 10
	cached := newTestBuilder(t, Options{BlockSize: 64, Seed: 5, CacheBytes: limit})
	plain := newTestBuilder(t, Options{BlockSize: 64, Seed: 5})
	var recs []trace.Record
	for i := range 200 {
		ids := []int64{int64(i % 7), int64(i % 13), int64(i)}
		recs = append(recs, trace.Record{InputLength: trace.Ptr(2*64 + 1 + i%64), HashIDs: ids})
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for k := range 400 {
				i := (k*7 + g) % len(recs)
				got, err := cached.AppendText(nil, &recs[i], uint64(k%2), 0)
				want, _ := plain.AppendText(nil, &recs[i], uint64(k%2), 0)
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("row %d: cached prompt differs (err %v)", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := cached.cache.cachedBytes(); n > limit || n == 0 {
		t.Fatalf("cache holds %d bytes, limit %d", n, limit)
	}
}

// TestPromptCacheHeapWithinBound fills a block cache with far more 512-token
// blocks than it holds and measures the live heap it keeps: its bound is
// in bytes of memory, not of text.
func TestPromptCacheHeapWithinBound(t *testing.T) {
	const limit = 8 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b := newTestBuilder(t, Options{Seed: 3, CacheBytes: limit})
	var buf []byte
	for h := range int64(4 * limit / 3000) {
		// Twice: a block is stored the second time it is built.
		buf = b.AppendBlockText(buf[:0], 0, h, 512)
		buf = b.AppendBlockText(buf[:0], 0, h, 512)
	}
	buf = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("a cache of %d bytes holds %d bytes of heap (%d accounted)", limit, held, b.cache.cachedBytes())
	if held > limit*21/20 {
		t.Fatalf("a cache bounded at %d bytes holds %d bytes of heap", limit, held)
	}
	runtime.KeepAlive(b)
}

// TestPromptCacheAdmitsReusedBlocks: blocks built once, as the partial
// last block of most rows is, are not stored and do not push out the
// shared blocks, which a plain LRU of this size would lose between two
// uses: 100 shared blocks, each used again after 1,100 other ones, in a
// cache that holds about 280 of them.
func TestPromptCacheAdmitsReusedBlocks(t *testing.T) {
	const (
		shared  = 100
		between = 10 // single-use blocks after each shared one
		tokens  = 64
	)
	b := newTestBuilder(t, Options{Seed: 9, CacheBytes: 160 << 10})
	plain := newTestBuilder(t, Options{Seed: 9})
	var buf []byte
	unique := int64(1 << 40)
	for round := range 8 {
		for h := range int64(shared) {
			buf = b.AppendBlockText(buf[:0], 0, h, tokens)
			if want := plain.AppendBlockText(nil, 0, h, tokens); !bytes.Equal(buf, want) {
				t.Fatalf("round %d, block %d: the text differs from an uncached builder's", round, h)
			}
			for range between {
				b.AppendBlockText(buf[:0], 0, unique, tokens)
				unique++
			}
		}
	}
	stored := 0
	for h := range int64(shared) {
		if _, ok, _ := b.cache.get(cacheKey{h: h, n: tokens}); ok {
			stored++
		}
	}
	if stored < shared*95/100 {
		t.Errorf("%d of the %d shared blocks are in the cache, want at least 95 %%", stored, shared)
	}
	// The doorkeeper's false positives (1 %) let a few in.
	single := 0
	for u := int64(1 << 40); u < unique; u++ {
		if _, ok, _ := b.cache.get(cacheKey{h: u, n: tokens}); ok {
			single++
		}
	}
	t.Logf("in the cache: %d of %d shared blocks, %d of %d single-use ones", stored, shared, single, unique-1<<40)
	if single > 100 {
		t.Errorf("%d single-use blocks are in the cache, want at most 100", single)
	}
	if n := b.cache.cachedBytes(); n > 160<<10 {
		t.Errorf("the cache holds %d bytes, over its bound", n)
	}
}

// TestEveryTraceRowPromptLength builds the prompt of every row of both
// shared traces and checks it has exactly input_length words, which the
// tests above show are exactly input_length tokens in all four tokenizers.
func TestEveryTraceRowPromptLength(t *testing.T) {
	for _, name := range sharedTraceNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			recs, err := trace.ReadFile(sharedTrace(name), trace.ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			b := newTestBuilder(t, Options{Seed: 42, CacheBytes: 64 << 20})
			var buf []byte
			for i := range recs {
				buf, err = b.AppendText(buf[:0], &recs[i], 0, uint64(i))
				if err != nil {
					t.Fatalf("line %d: %v", recs[i].Line, err)
				}
				if n := wordCount(buf); n != recs[i].ISL() {
					t.Fatalf("line %d: %d words, input_length %d", recs[i].Line, n, recs[i].ISL())
				}
			}
		})
	}
}

// TestSampledTracePromptsTokenize really tokenizes the prompts of sampled
// rows of both traces with all four tokenizers and requires the exact
// input_length (the acceptance bar is 1%). 300 rows per trace take about
// 35 s on two cores; under -race (make test) a 12-row sample keeps the
// run short, the every-row word count and the tests above carrying the rest.
func TestSampledTracePromptsTokenize(t *testing.T) {
	perTrace := 300
	if raceEnabled {
		perTrace = 12
	}
	for _, name := range sharedTraceNames {
		recs, err := trace.ReadFile(sharedTrace(name), trace.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(len(recs)), 9))
		rows := []int{0, len(recs) - 1}
		for len(rows) < perTrace {
			rows = append(rows, r.IntN(len(recs)))
		}
		b := newTestBuilder(t, Options{Seed: 42})
		for _, tn := range tokenizertest.Names {
			tok := tokenizertest.Load(t, tn)
			t.Run(name+"/"+tn, func(t *testing.T) {
				t.Parallel()
				for _, i := range rows {
					text, err := b.AppendText(nil, &recs[i], 0, uint64(i))
					if err != nil {
						t.Fatal(err)
					}
					ids, err := tok.Encode(string(text))
					if err != nil {
						t.Fatal(err)
					}
					if len(ids) != recs[i].ISL() {
						t.Errorf("line %d: %d tokens, input_length %d", recs[i].Line, len(ids), recs[i].ISL())
					}
				}
			})
		}
	}
}

func BenchmarkBuildBlock(b *testing.B) {
	pb := newTestBuilder(b, Options{Seed: 1})
	var buf []byte
	h := int64(0)
	for b.Loop() {
		buf = pb.AppendBlockText(buf[:0], 0, h, 512)
		h++
	}
	b.SetBytes(int64(len(buf)))
	b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkAssembleCached assembles 16k-token prompts from 32 blocks that
// are all in the cache: the steady state of a replay with a warm cache.
func BenchmarkAssembleCached(b *testing.B) {
	pb := newTestBuilder(b, Options{Seed: 1, CacheBytes: 256 << 20})
	rec := &trace.Record{InputLength: trace.Ptr(32 * 512), HashIDs: make([]int64, 32)}
	for i := range rec.HashIDs {
		rec.HashIDs[i] = int64(i)
	}
	buf, err := pb.AppendText(nil, rec, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.RunParallel(func(p *testing.PB) {
		var buf []byte
		for p.Next() {
			buf, _ = pb.AppendText(buf[:0], rec, 0, 0)
		}
	})
}

// TestEveryTracePromptTokenizes is the acceptance check taken literally:
// the prompt of every row of both shared traces, tokenized by each of the
// four tokenizers, has input_length tokens (within 1%; in fact exactly).
// It tokenizes about 800M tokens, several minutes of CPU, so it does not
// run under -race; `make test` runs it on its own (target test-prompts).
func TestEveryTracePromptTokenizes(t *testing.T) {
	if raceEnabled {
		t.Skip("too slow under -race; make test runs it without (make test-prompts)")
	}
	for _, name := range sharedTraceNames {
		recs, err := trace.ReadFile(sharedTrace(name), trace.ReadOptions{BlockSize: trace.DefaultBlockSize})
		if err != nil {
			t.Fatal(err)
		}
		b := newTestBuilder(t, Options{Seed: 42, CacheBytes: 256 << 20})
		for _, tn := range tokenizertest.Names {
			tok := tokenizertest.Load(t, tn)
			t.Run(name+"/"+tn, func(t *testing.T) {
				t.Parallel()
				// Every core takes rows from the same counter, so that
				// the last subtest to finish does not leave a core idle.
				var next, exact atomic.Int64
				var wg sync.WaitGroup
				for range runtime.GOMAXPROCS(0) {
					wg.Go(func() {
						var text []byte
						for {
							i := int(next.Add(1) - 1)
							if i >= len(recs) {
								return
							}
							var err error
							text, err = b.AppendText(text[:0], &recs[i], 0, uint64(i))
							if err != nil {
								t.Error(err)
								return
							}
							ids, err := tok.Encode(string(text))
							if err != nil {
								t.Error(err)
								return
							}
							isl := recs[i].ISL()
							if diff := len(ids) - isl; diff*100 > isl || -diff*100 > isl {
								t.Errorf("line %d: %d tokens, input_length %d: more than 1%% off", recs[i].Line, len(ids), isl)
							} else if diff == 0 {
								exact.Add(1)
							}
						}
					})
				}
				wg.Wait()
				t.Logf("%d of %d prompts have exactly input_length tokens", exact.Load(), len(recs))
			})
		}
	}
}

// TestPromptTextRoom: room for a server's template comes off the end of
// the last block, which keeps a token: the prompt is the built count of
// words and a byte prefix of the whole prompt.
func TestPromptTextRoom(t *testing.T) {
	const B = 16
	b := newTestBuilder(t, Options{BlockSize: B, Seed: 7})
	for _, tt := range []struct {
		rec        *trace.Record
		room, want int
	}{
		{&trace.Record{InputLength: trace.Ptr(3*B + 5), HashIDs: []int64{9, 8, 7, 6}}, 0, 3*B + 5},
		{&trace.Record{InputLength: trace.Ptr(3*B + 5), HashIDs: []int64{9, 8, 7, 6}}, 3, 3*B + 2},
		{&trace.Record{InputLength: trace.Ptr(3*B + 5), HashIDs: []int64{9, 8, 7, 6}}, 20, 3*B + 1}, // a token of the last block stays
		{&trace.Record{InputLength: trace.Ptr(2 * B), HashIDs: []int64{1, 2}}, 7, 2*B - 7},
		{&trace.Record{InputLength: trace.Ptr(40)}, 12, 28},
		{&trace.Record{InputLength: trace.Ptr(40)}, 100, 1},
		{&trace.Record{InputLength: trace.Ptr(40)}, -5, 40},
	} {
		full, err := b.AppendText(nil, tt.rec, 3, 11)
		if err != nil {
			t.Fatal(err)
		}
		p, n, err := b.AppendTextRoom(nil, tt.rec, 3, 11, tt.room)
		if err != nil {
			t.Fatalf("isl %d, room %d: %v", tt.rec.ISL(), tt.room, err)
		}
		if n != tt.want || wordCount(p) != n || !bytes.HasPrefix(full, p) {
			t.Errorf("isl %d, room %d: built %d (%d words, prefix %v), want %d", tt.rec.ISL(), tt.room, n, wordCount(p), bytes.HasPrefix(full, p), tt.want)
		}
	}
}

// BenchmarkTokenizerEncode reports each tokenizer's speed on prompt-builder
// text (what the tests tokenize most) and on mixed prose and code.
func BenchmarkTokenizerEncode(b *testing.B) {
	pb, err := NewBuilder(Options{BlockSize: 512, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	words, err := pb.AppendText(nil, &trace.Record{InputLength: trace.Ptr(8192)}, 0, 1)
	if err != nil {
		b.Fatal(err)
	}
	mixed := strings.Repeat("The server returned 503 after 2.5s; retry with `curl -sS http://host:8000/v1/completions`.\n\tif err != nil { return fmt.Errorf(\"x: %w\", err) }\n", 60)
	for _, name := range tokenizertest.Names {
		tok := tokenizertest.Load(b, name)
		for _, in := range []struct{ kind, text string }{{"words", string(words)}, {"mixed", mixed}} {
			b.Run(name+"/"+in.kind, func(b *testing.B) {
				b.SetBytes(int64(len(in.text)))
				tokens := 0
				for b.Loop() {
					ids, err := tok.Encode(in.text)
					if err != nil {
						b.Fatal(err)
					}
					tokens += len(ids)
				}
				b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
