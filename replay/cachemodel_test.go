package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// modelRef is the truth the model is checked against, written without the
// model's code: an unbounded cache as a plain set, walked over every row of
// the trace in timestamp order (stable on file order), pass after pass.
// ns maps a pass to its namespace.
func modelRef(recs []trace.Record, passes []int, ns func(int) uint64, serverBlock int) map[[2]int]int {
	rows := make([]int, len(recs))
	for i := range rows {
		rows[i] = i
	}
	slices.SortStableFunc(rows, func(a, b int) int { return cmp.Compare(*recs[a].Timestamp, *recs[b].Timestamp) })
	seen := map[[2]uint64]bool{}
	out := map[[2]int]int{}
	for _, pass := range passes {
		for _, r := range rows {
			k := 0
			for _, id := range recs[r].HashIDs {
				if !seen[[2]uint64{ns(pass), uint64(id)}] {
					break
				}
				k++
			}
			hit := min(k*512, recs[r].ISL()-1)
			out[[2]int{pass, r}] = max(hit, 0) / serverBlock * serverBlock
			for _, id := range recs[r].HashIDs {
				seen[[2]uint64{ns(pass), uint64(id)}] = true
			}
		}
	}
	return out
}

// ownItems lists a shard's rows of pass in its own dispatch order.
func ownItems(t *testing.T, p *Pacer, pass int) []PacerItem {
	t.Helper()
	if _, err := p.SeekTime(p.Period() * time.Duration(pass)); err != nil {
		t.Fatal(err)
	}
	var out []PacerItem
	for {
		it, ok := p.Next()
		if !ok || it.Pass != pass {
			return out
		}
		out = append(out, it)
	}
}

// TestCacheModelFleet: every replica of a sharded workload reads, for each
// of its requests, what an ideal cache fed by the whole fleet would serve,
// whatever order its own requests finish in.
func TestCacheModelFleet(t *testing.T) {
	recs := wlTestReadSlice(t, 2000)
	for _, loop := range []LoopMode{LoopFresh, LoopRepeat} {
		for _, count := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/%d shards", loop, count), func(t *testing.T) {
				ns := func(pass int) uint64 {
					if loop == LoopFresh {
						return uint64(pass)
					}
					return 0
				}
				// A replica that never stopped had sent every earlier
				// pass: for the reference, passes 0 to 6.
				want := modelRef(recs, []int{0, 1, 2, 3, 4, 5, 6}, ns, 16)
				for index := range count {
					p, err := NewPacer(recs, PacerOptions{Loop: loop, Shard: Shard{Index: index, Count: count}})
					if err != nil {
						t.Fatal(err)
					}
					// The replica started at pass 4: what it sent since is
					// known, and passes 5 and 6 are checked.
					byPass := map[int][]PacerItem{}
					for _, pass := range []int{4, 5, 6} {
						byPass[pass] = ownItems(t, p, pass)
					}
					if _, err := p.SeekTime(4 * p.Period()); err != nil {
						t.Fatal(err)
					}
					m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16})
					for _, it := range byPass[4] {
						m.Accept(it)
					}
					checked := 0
					for _, pass := range []int{5, 6} {
						items := byPass[pass]
						// Finish out of order: each run of 7 backwards.
						for i := 0; i < len(items); i += 7 {
							j := min(i+7, len(items))
							slices.Reverse(items[i:j])
						}
						for _, it := range items {
							got, known := m.Accept(it)
							if w := want[[2]int{pass, it.Index}]; !known || got != w {
								t.Fatalf("shard %d, pass %d, row %d: theoretical %d (known %v), want %d", index, pass, it.Index, got, known, w)
							}
							checked++
						}
					}
					if checked == 0 {
						t.Fatalf("shard %d checked no request", index)
					}
				}
			})
		}
	}
}

// TestCacheModelRestart: a model that starts mid-run, as after a restart of
// the exporter, claims for each request what one that ran all along
// answers, or says it cannot tell when the hit rests on blocks only its
// warm-up assumed sent; once the fleet has sent them again it can tell.
// For an unbounded cache and for one far smaller than a pass.
func TestCacheModelRestart(t *testing.T) {
	recs := wlTestReadSlice(t, 2000)
	for _, loop := range []LoopMode{LoopFresh, LoopRepeat} {
		for _, capacity := range []int{0, 4000} {
			t.Run(fmt.Sprintf("%s/capacity %d", loop, capacity), func(t *testing.T) {
				params := CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: capacity}
				// newModel is a model whose replica starts sending at item.
				newModel := func(at PacerItem) *CacheModel {
					p, err := NewPacer(recs, PacerOptions{Loop: loop})
					if err != nil {
						t.Fatal(err)
					}
					if err := p.Seek(TracePosition{Pass: at.Pass, Conv: at.Conv}); err != nil {
						t.Fatal(err)
					}
					return NewCacheModel(p, params)
				}
				p, err := NewPacer(recs, PacerOptions{Loop: loop})
				if err != nil {
					t.Fatal(err)
				}
				var items []PacerItem
				for pass := 3; pass <= 5; pass++ {
					items = append(items, ownItems(t, p, pass)...)
				}
				// The restarted replica starts halfway through pass 4.
				restart := len(items) / 2
				steady, restarted := newModel(items[0]), newModel(items[restart])
				differ, unknownLate := 0, 0
				late := len(items) - len(items)/6 // the second half of pass 5
				for i, it := range items {
					a, _ := steady.Accept(it)
					if i < restart {
						continue
					}
					b, known := restarted.Accept(it)
					switch {
					case known && a != b:
						differ++
					case !known && i >= late:
						unknownLate++
					}
				}
				if differ != 0 {
					t.Errorf("%d of %d requests after the restart read differently", differ, len(items)-restart)
				}
				if unknownLate > (len(items)-late)/10 {
					t.Errorf("%d of the last %d requests still unknown", unknownLate, len(items)-late)
				}
			})
		}
	}
}

// TestCacheModelColdStartUnknown: the rows a model only assumes sent make
// the requests that hit them unknown, not hits: a cold server and a warm one
// are told apart by nothing the exporter sees.
func TestCacheModelColdStartUnknown(t *testing.T) {
	rows := []trace.Record{
		{Timestamp: trace.Ptr(0.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(1.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(2.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(3.0), InputLength: trace.Ptr(1024), HashIDs: []int64{7, 8}},
	}
	p, err := NewPacer(rows, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	// Started at row 1 of pass 3: row 0 is assumed sent.
	if err := p.Seek(TracePosition{Pass: 3, Conv: 1}); err != nil {
		t.Fatal(err)
	}
	m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16})
	for _, tt := range []struct {
		row   int
		want  int
		known bool
	}{
		{1, 1008, false}, // rests on row 0, assumed
		{2, 1008, true},  // row 1 was really sent
		{3, 0, true},     // a miss is certain
	} {
		got, known := m.Accept(PacerItem{Pass: 3, Index: tt.row, Namespace: 3})
		if got != tt.want || known != tt.known {
			t.Errorf("row %d: %d (known %v), want %d (known %v)", tt.row, got, known, tt.want, tt.known)
		}
	}
}

// TestCacheModelReject: a request the server never got does not warm the
// model, unless a later request used its blocks since.
func TestCacheModelReject(t *testing.T) {
	rows := []trace.Record{
		{Timestamp: trace.Ptr(0.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(1.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 1}},
		{Timestamp: trace.Ptr(2.0), InputLength: trace.Ptr(1024), HashIDs: []int64{0, 2}},
	}
	params := CacheParams{TraceBlock: 512, ServerBlock: 16}
	item := func(row int) PacerItem { return PacerItem{Index: row} }
	tests := []struct {
		name  string
		steps func(m *CacheModel) []int // theoretical of the accepted rows, in order
		want  []int
	}{
		{"all accepted", func(m *CacheModel) []int {
			a, _ := m.Accept(item(0))
			b, _ := m.Accept(item(1))
			c, _ := m.Accept(item(2))
			return []int{a, b, c}
		}, []int{0, 1008, 512}},
		{"first rejected before the next", func(m *CacheModel) []int {
			m.Reject(item(0))
			b, _ := m.Accept(item(1))
			c, _ := m.Accept(item(2))
			return []int{b, c}
		}, []int{0, 512}},
		{"first rejected after the next used its blocks", func(m *CacheModel) []int {
			b, _ := m.Accept(item(1)) // simulates row 0 ahead, then hits it
			m.Reject(item(0))
			c, _ := m.Accept(item(2))
			return []int{b, c}
		}, []int{1008, 512}},
		{"first rejected after the third was simulated", func(m *CacheModel) []int {
			c, _ := m.Accept(item(2))
			m.Reject(item(0)) // row 1 touched its blocks: they stay
			b, _ := m.Accept(item(1))
			return []int{c, b}
		}, []int{512, 1008}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPacer(rows, PacerOptions{Loop: LoopOnce})
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.steps(NewCacheModel(p, params)); !slices.Equal(got, tt.want) {
				t.Errorf("theoretical %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCacheModelWarmUpHoldsNoRows: a model started deep into a big pass
// simulates the rows before its start but keeps nothing of them: no
// request can ask about them.
func TestCacheModelWarmUpHoldsNoRows(t *testing.T) {
	const n = 20000
	rows := make([]trace.Record, n)
	for i := range rows {
		rows[i] = trace.Record{Timestamp: trace.Ptr(float64(i)), InputLength: trace.Ptr(600), HashIDs: []int64{0, int64(i + 1)}}
	}
	p, err := NewPacer(rows, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Seek(TracePosition{Pass: 7, Conv: n - 100}); err != nil {
		t.Fatal(err)
	}
	m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 1 << 10})
	for k := range 3 {
		it, ok := p.Next()
		if !ok {
			t.Fatal("no row")
		}
		// Asked out of order: the rows skipped are kept, and only they.
		if k == 0 {
			if it, ok = p.Next(); !ok {
				t.Fatal("no row")
			}
		}
		m.Accept(it)
	}
	if got := len(m.ahead); got > 1 {
		t.Errorf("%d rows kept after the warm-up, want at most 1 (the one skipped)", got)
	}
	if bound := m.cache.Rounding().MaxEntries(m.cache.Params().CapacityBlocks); m.cache.Len() > bound {
		t.Errorf("%d blocks held, bound %d", m.cache.Len(), bound)
	}
}

// TestCacheModelShortWarmUpSameAnswers: a model that warms up on the last
// rows only (those whose blocks fill its capacity and its profile's
// ceiling) answers every request, and gives every profile, as one that
// warmed up on the whole pass before.
func TestCacheModelShortWarmUpSameAnswers(t *testing.T) {
	rows := wlTestReadSlice(t, 3000)
	for _, tc := range []struct {
		name   string
		params CacheParams
		loop   LoopMode
	}{
		// A ceiling of 1 token is raised to twice the capacity.
		{"vllm blocks, fresh", CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 4096, CeilingTokens: 1}, LoopFresh},
		{"vllm blocks, repeat", CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 4096, CeilingTokens: 1}, LoopRepeat},
		{"sglang tokens, repeat", CacheParams{TraceBlock: 512, ServerBlock: 1, CapacityBlocks: 200000, Granularity: engine.GranularityToken, CeilingTokens: 1}, LoopRepeat},
		{"unbounded, fresh", CacheParams{TraceBlock: 512, ServerBlock: 16}, LoopFresh},
		{"unbounded, fresh, small ceiling", CacheParams{TraceBlock: 512, ServerBlock: 16, CeilingTokens: 1 << 20}, LoopFresh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			models := make([]*CacheModel, 2)
			var items []PacerItem
			for k := range models {
				p, err := NewPacer(rows, PacerOptions{Loop: tc.loop})
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Seek(TracePosition{Pass: 4, Conv: 1500}); err != nil {
					t.Fatal(err)
				}
				models[k] = NewCacheModel(p, tc.params)
				if k == 1 {
					items = nil
					for len(items) < 800 {
						it, ok := p.Next()
						if !ok {
							t.Fatal("no row")
						}
						items = append(items, it)
					}
				}
			}
			full := models[1]
			if !(modelPos{pass: 3}).before(models[0].cur) && (models[0].cur != modelPos{pass: 4}) {
				t.Fatalf("the warm-up starts at %+v: not shortened", models[0].cur)
			}
			full.cur = modelPos{pass: 3} // the whole pass before, as before the shortcut
			hits, unknown, steps := 0, 0, 0
			for _, it := range items {
				a, ak, ap := models[0].AcceptProfile(it)
				b, bk, bp := full.AcceptProfile(it)
				if a != b || ak != bk {
					t.Fatalf("row %d of pass %d: %d (known %v) after the short warm-up, %d (known %v) after the whole one", it.Index, it.Pass, a, ak, b, bk)
				}
				if !slices.Equal(ap.Steps, bp.Steps) || ap.Known != bp.Known {
					t.Fatalf("row %d of pass %d: profile %+v after the short warm-up, %+v after the whole one", it.Index, it.Pass, ap, bp)
				}
				hits += a
				steps += len(ap.Steps)
				if !ak {
					unknown++
				}
			}
			if hits == 0 || unknown == 0 || steps == 0 {
				t.Errorf("%d tokens hit, %d answers unknown, %d profile steps: the case tests nothing", hits, unknown, steps)
			}
		})
	}
}

// TestCacheModelClosed: a closed model simulates nothing more and answers
// every question unknown.
func TestCacheModelClosed(t *testing.T) {
	rows := make([]trace.Record, 5000)
	for i := range rows {
		rows[i] = trace.Record{Timestamp: trace.Ptr(float64(i)), InputLength: trace.Ptr(600), HashIDs: []int64{0, int64(i + 1)}}
	}
	p, err := NewPacer(rows, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Seek(TracePosition{Pass: 2, Conv: 4000}); err != nil {
		t.Fatal(err)
	}
	m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16})
	it, _ := p.Next()
	m.Close()
	before := m.cur
	if got, known := m.Accept(it); got != 0 || known {
		t.Errorf("closed model answered %d (known %v)", got, known)
	}
	m.Reject(it)
	if m.cur != before || m.cache.Len() != 0 {
		t.Errorf("closed model simulated: cursor %+v → %+v, %d blocks", before, m.cur, m.cache.Len())
	}
}

// BenchmarkCacheModelAccept is the model's cost per request, as a workload
// pays it when a response is in: one Accept per row, in schedule order,
// pass after pass, on the shared traces with a bounded and an unbounded
// cache (vLLM's 16-token blocks). Besides the time per request it reports
// the process's CPU per request (cpu-ns/op, the garbage collector's
// included), which other jobs on the machine disturb less.
func BenchmarkCacheModelAccept(b *testing.B) {
	traces := []struct{ name, path string }{
		{"conversation", "../testdata/mooncake/conversation_trace.jsonl"},
		{"synthetic", "../testdata/mooncake/synthetic_trace.jsonl"},
	}
	caches := []struct {
		name   string
		params CacheParams
	}{
		{"bounded", CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: 65536}},
		{"unbounded", CacheParams{TraceBlock: 512, ServerBlock: 16}},
	}
	for _, tr := range traces {
		recs, err := trace.ReadFile(tr.path, trace.ReadOptions{BlockSize: 512})
		if err != nil {
			b.Fatalf("the Mooncake traces are missing from testdata/mooncake: %v", err)
		}
		for _, c := range caches {
			b.Run(tr.name+"/"+c.name, func(b *testing.B) {
				p, err := NewPacer(recs, PacerOptions{Loop: LoopFresh})
				if err != nil {
					b.Fatal(err)
				}
				m := NewCacheModel(p, c.params)
				b.ReportAllocs()
				cpu0, ok0 := testutil.ProcessCPUSeconds()
				n := 0
				for b.Loop() {
					it, ok := p.Next()
					if !ok {
						b.Fatal("no row")
					}
					m.Accept(it)
					n++
				}
				if cpu1, ok1 := testutil.ProcessCPUSeconds(); ok0 && ok1 && n > 0 {
					b.ReportMetric((cpu1-cpu0)*1e9/float64(n), "cpu-ns/op")
				}
			})
		}
	}
}

// BenchmarkCacheModelWarmUp: the CPU the cache model takes per request, as
// the workload asks it once a response is in, on the shared conversation
// trace's first 3,000 rows (12k prompt tokens a row on average) with loop
// repeat, from a start at the top of a pass: an unbounded cache, and one
// of 20,000 blocks of 16 tokens (about a hundredth of a pass). With
// observed, each request comes with a cached count (0, as from a cold
// server) and the model learns its warm-up from them (AcceptObserved).
func BenchmarkCacheModelWarmUp(b *testing.B) {
	recs := wlTestReadSlice(b, 3000)
	for _, tc := range []struct {
		name     string
		capacity int
		observed bool
	}{
		{"unbounded", 0, false},
		{"capacity=20000", 20000, false},
		{"unbounded/observed", 0, true},
		{"capacity=20000/observed", 20000, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Seek(TracePosition{Pass: 1}); err != nil {
				b.Fatal(err)
			}
			items := benchPassItems(p, 1)
			m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: tc.capacity})
			accept := m.Accept
			if tc.observed {
				m.LearnWarmUp(nil)
				accept = func(it PacerItem) (int, bool) { return m.AcceptObserved(it, 0) }
			}
			accept(items[0]) // the warm-up, outside the timing
			b.ReportAllocs()
			cpu0, ok0 := testutil.ProcessCPUSeconds()
			b.ResetTimer()
			for i := range b.N {
				it := items[(i+1)%len(items)]
				it.Pass += (i + 1) / len(items)
				accept(it)
			}
			b.StopTimer()
			// CPU time, which other work on a shared machine moves far
			// less than the wall time of ns/op.
			if cpu1, ok1 := testutil.ProcessCPUSeconds(); ok0 && ok1 {
				b.ReportMetric((cpu1-cpu0)/float64(b.N)*1e9, "cpu-ns/req")
			}
		})
	}
}

// benchPassItems lists every row of pass, later turns included, in the
// order a replay that sends each turn at once dispatches them.
func benchPassItems(p *Pacer, pass int) []PacerItem {
	var out []PacerItem
	for {
		it, ok := p.Next()
		if !ok || it.Pass != pass {
			return out
		}
		for ok {
			out = append(out, it)
			it, _, ok = p.NextTurn(it)
		}
	}
}

// TestCacheModelMooncakeUnchanged: the Mooncake traces' ids are
// prefix-consistent (each id always after the same ids), so keying blocks
// by their chain must answer exactly as keying them by id: every request's
// theoretical tokens, whether known, and its profile at every capacity, two
// passes of each trace, unbounded and bounded. The digests are of the
// answers of the model keyed by id.
func TestCacheModelMooncakeUnchanged(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("two passes of both traces: slow under -race, and nothing concurrent to check")
	}
	tests := []struct {
		file     string
		capacity int
		sum      int64
		digest   uint64
	}{
		{"conversation_trace", 0, 198788672, 0x1a7a3ee5e906986b},
		{"conversation_trace", 20000, 12538976, 0x13a6f072f3af6628},
		{"synthetic_trace", 0, 101011248, 0xe0f1242d13f10ec2},
		{"synthetic_trace", 20000, 7405248, 0xc4d4c1c414d75e3e},
	}
	for _, tt := range tests {
		recs, err := trace.ReadFile("../testdata/mooncake/"+tt.file+".jsonl", trace.ReadOptions{BlockSize: 512})
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
		if err != nil {
			t.Fatal(err)
		}
		m := NewCacheModel(p, CacheParams{TraceBlock: 512, ServerBlock: 16, CapacityBlocks: tt.capacity})
		h := fnv.New64a()
		var sum int64
		for range 2 * len(recs) {
			it, _ := p.Next()
			tokens, known, prof := m.AcceptProfile(it)
			sum += int64(tokens)
			fmt.Fprint(h, tokens, known, prof.Known, prof.Steps)
		}
		if sum != tt.sum || h.Sum64() != tt.digest {
			t.Errorf("%s, %d blocks: %d theoretical tokens, digest %#x; want %d and %#x", tt.file, tt.capacity, sum, h.Sum64(), tt.sum, tt.digest)
		}
	}
}

// TestWorkloadSetCache: a model set while the workload runs answers every
// request from then on, and its warm-up covers the rows sent before it;
// the model it replaced is closed. Four rows of one 100-token block each,
// looped with repeat: an unbounded model hits every row from the second
// pass on (96 tokens in 16-token blocks); one of 6 blocks, a single row,
// never does.
func TestWorkloadSetCache(t *testing.T) {
	recs := pacerTestTimestamps(0, 10, 20, 30)
	p, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
	if err != nil {
		t.Fatal(err)
	}
	params := CacheParams{TraceBlock: 512, ServerBlock: 16}
	first := NewCacheModel(p, params)
	send := &wlTestSender{do: func(ctx context.Context, req openai.Request, res *Result) { res.Outcome = openai.OutcomeSuccess }}
	obs := newWLTestObserver()
	clock := newWLTestClock(true)
	t0 := clock.Now()
	w, err := NewWorkload(WorkloadConfig{Name: "swap", Target: "fake", MaxInFlight: 16, Clock: clock, Cache: first},
		p, send, newWLTestBuilder(recs), obs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	answered := func(n int) func(*wlTestObserver) bool {
		return func(o *wlTestObserver) bool { return len(o.finished) >= n }
	}
	var second *CacheModel
	obs.onPass = func(pass int) {
		// The jumping clock would let the dispatcher run passes ahead of
		// the answers; the model forgets the rows of a pass two behind.
		obs.waitUntil(answered(4 * (pass + 1)))
		switch pass {
		case 1: // every row of passes 0 and 1 answered by the first model
			// As the daemon does: a pacer of the same trace at the
			// workload's position.
			at, err := NewPacer(recs, PacerOptions{Loop: LoopRepeat})
			if err == nil {
				err = at.Seek(w.Position())
			}
			if err != nil {
				t.Error(err)
				return
			}
			smaller := params
			smaller.CapacityBlocks = 6
			second = NewCacheModel(at, smaller)
			w.SetCache(second)
		case 2:
			cancel()
		}
	}
	if err := w.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if w.Cache() != second || second.Params().CapacityBlocks != 6 {
		t.Fatalf("the workload's model is not the one set last")
	}
	if !first.closed.Load() {
		t.Error("the replaced model is not closed")
	}
	want := []int{0, 96, 0} // theoretical cached tokens of every row, by pass
	for _, r := range obs.finished {
		pass := int(r.Scheduled.Sub(t0) / (40 * pacerTestTick)) // a pass is 40 ms
		if pass > 2 {
			continue
		}
		if !r.TheoreticalKnown || r.TheoreticalCachedTokens != want[pass] {
			t.Errorf("pass %d, row %d: theoretical %d (known %v), want %d", pass, r.TraceHashIDs[0], r.TheoreticalCachedTokens, r.TheoreticalKnown, want[pass])
		}
	}
}
