package synth

import (
	"bytes"
	"cmp"
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// bruteLRU is the reference the curve is checked against: one LRU cache of
// a fixed capacity, simulated block by block with a map and a list, as
// idealcache.Cache does with block granularity. It shares nothing with
// the curve's code, not even idealcache's rounding, nor the order
// (timestampOrder).
type bruteLRU struct {
	traceBlock, serverBlock int
	capacity                int64                    // server blocks; 0 for unbounded
	maxEntries              int                      // trace blocks held at most
	index                   map[string]*list.Element // by the block's whole prefix, written out
	lru                     *list.List               // front = most recently used; values are bruteBlock
	used                    int64
}

type bruteBlock struct {
	prefix string
	weight int64
}

// brutePrefixes names each block of ids by the ids up to it, written out:
// an engine's key.
func brutePrefixes(ids []int64) []string {
	out := make([]string, len(ids))
	var b strings.Builder
	for i, id := range ids {
		fmt.Fprintf(&b, "%d,", id)
		out[i] = b.String()
	}
	return out
}

func newBruteLRU(traceBlock, serverBlock int, capacity int64) *bruteLRU {
	per := (serverBlock + traceBlock - 1) / traceBlock
	return &bruteLRU{traceBlock: traceBlock, serverBlock: serverBlock, capacity: capacity,
		maxEntries: int(capacity) * max(per, 1), index: map[string]*list.Element{}, lru: list.New()}
}

// visit returns the hit tokens of one request and then caches its blocks.
func (c *bruteLRU) visit(ids []int64, isl int) int64 {
	prefixes := brutePrefixes(ids)
	k := 0
	for k < len(ids) && c.index[prefixes[k]] != nil {
		k++
	}
	hit := min(k*c.traceBlock, isl-1)
	hit = max(hit, 0) / c.serverBlock * c.serverBlock
	for i := len(ids) - 1; i >= 0; i-- {
		if e := c.index[prefixes[i]]; e != nil {
			c.lru.MoveToFront(e)
			continue
		}
		tokens := c.traceBlock
		if i == len(ids)-1 {
			tokens = isl - i*c.traceBlock
		}
		w := int64(tokens / c.serverBlock)
		c.index[prefixes[i]] = c.lru.PushFront(bruteBlock{prefixes[i], w})
		c.used += w
	}
	for c.capacity > 0 && (c.used > c.capacity || c.lru.Len() > c.maxEntries) && c.lru.Len() > 0 {
		b := c.lru.Remove(c.lru.Back()).(bruteBlock)
		delete(c.index, b.prefix)
		c.used -= b.weight
	}
	return int64(hit)
}

// bruteHits is the hit tokens of rows, in order, with a cache of capacity
// server blocks (0: unbounded).
func bruteHits(rows *trace.Table, order []int32, traceBlock, serverBlock int, capacity int64) int64 {
	c := newBruteLRU(traceBlock, serverBlock, capacity)
	var sum int64
	var ids []int64
	for _, r := range order {
		ids, _ = rows.AppendHashIDs(ids[:0], int(r))
		sum += c.visit(ids, rows.ISL(int(r)))
	}
	return sum
}

func readTable(t testing.TB, path string) *trace.Table {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := trace.ReadTable(f, path, trace.ReadOptions{BlockSize: 512}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func tableOf(t testing.TB, text string) *trace.Table {
	t.Helper()
	recs, err := trace.ReadAll(strings.NewReader(text), "x", trace.ReadOptions{BlockSize: 512})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := trace.TableOf(recs)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// timestampOrder is the replay's order of a trace without sessions (by
// timestamp, ties in file order), found apart from it: the tests' traces
// have no sessions, and the replay's order of sessions is tested in
// idealcache and replay.
func timestampOrder(t testing.TB, rows *trace.Table) []int32 {
	t.Helper()
	order := make([]int32, rows.Len())
	for i := range order {
		if _, ok := rows.SessionID(i); ok {
			t.Fatalf("row %d has a session: the order of sessions is the replay's", i)
		}
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int {
		ta, _ := rows.Timestamp(int(a))
		tb, _ := rows.Timestamp(int(b))
		return cmp.Compare(ta, tb)
	})
	return order
}

func curveOf(t testing.TB, rows *trace.Table, o CurveOptions) *CapacityCurve {
	t.Helper()
	c, err := CapacityCurveOf(context.Background(), rows, timestampOrder(t, rows), "x", o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCapacityCurveMatchesBruteForce: on both shared traces, the curve's
// hit tokens at ten capacities are those of an LRU cache simulated at each,
// exactly; so are its limit, and its targets lie where the simulation says.
func TestCapacityCurveMatchesBruteForce(t *testing.T) {
	tests := []struct {
		file       string
		capacities []int64 // tokens
	}{
		{"conversation_trace.jsonl", []int64{16, 512, 8_000, 100_000, 1_000_000, 2_500_016, 4_194_304, 15_630_320, 40_000_000, 90_606_656}},
		{"synthetic_trace.jsonl", []int64{32, 1_024, 20_000, 250_000, 999_984, 3_108_848, 5_000_000, 10_100_720, 16_646_128, 21_313_728}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			rows := readTable(t, sharedTraces+tt.file)
			order := timestampOrder(t, rows)
			c := curveOf(t, rows, CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: DefaultMaxCapacity, Capacities: tt.capacities})
			if c.WeightChanges != 0 {
				t.Fatalf("%d weight changes: the curve is exact only without", c.WeightChanges)
			}
			checked := 0
			for _, p := range c.Points {
				if !p.Requested {
					continue
				}
				checked++
				if want := bruteHits(rows, order, 512, 16, p.CapacityBlocks); p.HitTokens != want {
					t.Errorf("capacity %d blocks: curve %d hit tokens, LRU %d", p.CapacityBlocks, p.HitTokens, want)
				}
			}
			if checked != len(tt.capacities) {
				t.Errorf("%d of %d capacities in the curve", checked, len(tt.capacities))
			}
			inf := bruteHits(rows, order, 512, 16, 0)
			if c.InfiniteHitTokens != inf {
				t.Errorf("limit: curve %d, unbounded LRU %d", c.InfiniteHitTokens, inf)
			}
			for _, tg := range c.Targets {
				at := bruteHits(rows, order, 512, 16, tg.CapacityBlocks)
				below := bruteHits(rows, order, 512, 16, tg.BelowBlocks)
				share := int64(tg.Percent) * inf
				if !tg.Reached || at != tg.HitTokens || at*100 < share || below*100 >= share ||
					tg.CapacityBlocks-tg.BelowBlocks > tg.CapacityBlocks>>fineBits+1 {
					t.Errorf("target %+v: LRU %d at its capacity and %d below, of a limit of %d", tg, at, below, inf)
				}
			}
		})
	}
}

// randomRows makes a trace whose blocks keep their weights: shared chains
// of full blocks (one with a block twice), then a tail block of its own
// length, a few tails reused; rows without ids and one-block rows too.
func randomRows(r *rand.Rand, n int) *trace.Table {
	chains := [][]int64{{1, 2, 3, 4, 5, 6}, {1, 2, 7, 8}, {9, 10, 11}, {12, 13, 12, 14}, {15}}
	tailLen := map[int64]int{}
	next := int64(100)
	recs := make([]trace.Record, n)
	for i := range recs {
		ts := float64(r.IntN(50))
		recs[i].Timestamp = &ts
		if r.IntN(20) == 0 {
			isl := 1 + r.IntN(300)
			recs[i].InputLength = &isl
			continue
		}
		chain := chains[r.IntN(len(chains))]
		ids := append([]int64(nil), chain[:r.IntN(len(chain)+1)]...)
		tail := next
		if r.IntN(3) == 0 && next > 100 {
			tail = 100 + r.Int64N(next-100)
		} else {
			next++
			tailLen[tail] = 1 + r.IntN(512)
		}
		ids = append(ids, tail)
		isl := (len(ids)-1)*512 + tailLen[tail]
		recs[i].InputLength, recs[i].HashIDs = &isl, ids
	}
	rows, err := trace.TableOf(recs)
	if err != nil {
		panic(err)
	}
	return rows
}

// TestCapacityCurveRandom checks every point of random traces' curves
// against the simulation, for server blocks smaller than, equal to and
// larger than the trace's (where blocks weigh nothing and only the bound
// on their number evicts), and with a ceiling below the footprint.
func TestCapacityCurveRandom(t *testing.T) {
	for _, serverBlock := range []int{1, 16, 100, 512, 1024, 2000} {
		for seed := range uint64(4) {
			r := rand.New(rand.NewPCG(seed, uint64(serverBlock)))
			rows := randomRows(r, 300)
			order := timestampOrder(t, rows)
			maxCap := int64(serverBlock) * (1 + r.Int64N(3000/int64(serverBlock)+40))
			var asked []int64
			for range 10 {
				asked = append(asked, int64(serverBlock)*(1+r.Int64N(maxCap/int64(serverBlock))))
			}
			c := curveOf(t, rows, CurveOptions{TraceBlock: 512, ServerBlock: serverBlock, MaxCapacity: maxCap, Capacities: asked})
			if c.WeightChanges != 0 {
				t.Fatalf("%d weight changes in a trace made without", c.WeightChanges)
			}
			for _, p := range c.Points {
				if want := bruteHits(rows, order, 512, serverBlock, p.CapacityBlocks); p.HitTokens != want {
					t.Errorf("server block %d, seed %d, ceiling %d: capacity %d blocks: curve %d, LRU %d",
						serverBlock, seed, maxCap, p.CapacityBlocks, p.HitTokens, want)
				}
			}
			for _, p := range c.FinePoints(64) {
				if want := bruteHits(rows, order, 512, serverBlock, p.CapacityBlocks); p.HitTokens != want {
					t.Errorf("server block %d, seed %d: fine point at %d blocks: curve %d, LRU %d",
						serverBlock, seed, p.CapacityBlocks, p.HitTokens, want)
				}
			}
			if want := bruteHits(rows, order, 512, serverBlock, 0); c.InfiniteHitTokens != want {
				t.Errorf("server block %d, seed %d: limit %d, LRU %d", serverBlock, seed, c.InfiniteHitTokens, want)
			}
		}
	}
}

// TestCapacityCurveBigWeights: blocks too heavy for the dense weight
// table (70,000 one-token server blocks) give the same curve as the LRU.
func TestCapacityCurveBigWeights(t *testing.T) {
	const traceBlock = 70_000
	var recs []trace.Record
	for i, ids := range [][]int64{{1, 2}, {1, 3}, {1, 2}, {4}, {1, 3}, {1, 2}} {
		ts, isl := float64(i), (len(ids)-1)*traceBlock+500*int(ids[len(ids)-1])
		recs = append(recs, trace.Record{Timestamp: &ts, InputLength: &isl, HashIDs: ids})
	}
	rows, err := trace.TableOf(recs)
	if err != nil {
		t.Fatal(err)
	}
	order := timestampOrder(t, rows)
	c := curveOf(t, rows, CurveOptions{TraceBlock: traceBlock, ServerBlock: 1, MaxCapacity: 1 << 20,
		Capacities: []int64{1000, 70_999, 71_000, 71_500, 141_500, 142_500, 143_500}})
	if c.DistinctBlocks != 4 || c.FootprintBlocks != traceBlock+1000+1500+2000 || c.WeightChanges != 0 {
		t.Errorf("blocks %d, footprint %d, weight changes %d", c.DistinctBlocks, c.FootprintBlocks, c.WeightChanges)
	}
	for _, p := range c.Points {
		if want := bruteHits(rows, order, traceBlock, 1, p.CapacityBlocks); p.HitTokens != want {
			t.Errorf("capacity %d: curve %d, LRU %d", p.CapacityBlocks, p.HitTokens, want)
		}
	}
}

// byHand is three requests whose curve is worked out in the test below.
const byHand = `{"timestamp": 0, "input_length": 1100, "hash_ids": [1, 2, 3]}
{"timestamp": 5, "input_length": 600, "hash_ids": [1, 4]}
{"timestamp": 5, "input_length": 1100, "hash_ids": [1, 2, 3]}
{"timestamp": 9, "input_length": 300}
`

// TestCapacityCurveByHand: blocks 1 and 2 weigh 32 server blocks, 3 (76
// tokens) 4 and 4 (88 tokens) 5. The second row finds block 1 at distance
// 32 (512 tokens). Before the third, the stack is 1, 4, 2, 3: its blocks
// need 32, 32+5+32 = 69 and 73 blocks, for 512, 1024 and 1088 tokens (the
// last token recomputed, whole blocks of 16).
func TestCapacityCurveByHand(t *testing.T) {
	c := curveOf(t, tableOf(t, byHand), CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: 10_000, Capacities: []int64{496, 512, 1088, 1104, 1168}})
	want := &CapacityCurve{
		TraceBlock: 512, ServerBlock: 16, MaxCapacity: 10_000, Rows: 4, PromptTokens: 3100,
		DistinctBlocks: 4, FootprintBlocks: 73, InfiniteHitTokens: 1600,
		Points: []CurvePoint{
			{CapacityBlocks: 31, HitTokens: 0, Requested: true},
			{CapacityBlocks: 32, HitTokens: 1024, Requested: true},
			{CapacityBlocks: 45, HitTokens: 1024},
			{CapacityBlocks: 64, HitTokens: 1024},
			{CapacityBlocks: 68, HitTokens: 1024, Requested: true},
			{CapacityBlocks: 69, HitTokens: 1536, Requested: true},
			{CapacityBlocks: 73, HitTokens: 1600, Requested: true},
		},
		Targets: []CurveTarget{
			{Percent: 50, Reached: true, CapacityBlocks: 32, BelowBlocks: 31, HitTokens: 1024},
			{Percent: 90, Reached: true, CapacityBlocks: 69, BelowBlocks: 68, HitTokens: 1536},
			{Percent: 99, Reached: true, CapacityBlocks: 73, BelowBlocks: 72, HitTokens: 1600},
		},
	}
	c.fine = nil
	if !reflect.DeepEqual(c, want) {
		t.Errorf("curve\n%+v\nwant\n%+v", c, want)
	}
}

// TestCapacityCurveCeiling: below a ceiling smaller than the footprint the
// curve is exact, it ends at the ceiling, and a share it cannot reach is
// said so.
func TestCapacityCurveCeiling(t *testing.T) {
	rows := tableOf(t, byHand)
	c := curveOf(t, rows, CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: 70 * 16})
	if got := c.Points[len(c.Points)-1]; got.CapacityBlocks != 70 || got.HitTokens != 1536 {
		t.Errorf("last point %+v, want 1536 tokens at the ceiling, 70 blocks", got)
	}
	if c.InfiniteHitTokens != 1600 || c.EndBlocks() != 70 {
		t.Errorf("limit %d, end %d; want 1600 and 70", c.InfiniteHitTokens, c.EndBlocks())
	}
	if tg := c.Targets[2]; tg.Reached {
		t.Errorf("99 %% is reached only at 73 blocks, above the ceiling: %+v", tg)
	}
	if tg := c.Targets[1]; !tg.Reached || tg.CapacityBlocks != 69 {
		t.Errorf("90 %%: %+v", tg)
	}
}

// TestCapacityCurveWeightChanges: a block seen as a short last block and
// later as a full one is counted.
func TestCapacityCurveWeightChanges(t *testing.T) {
	rows := tableOf(t, `{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": 1100, "hash_ids": [1, 2, 3]}
`)
	c := curveOf(t, rows, CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: 10_000})
	if c.WeightChanges != 1 {
		t.Errorf("%d weight changes, want 1", c.WeightChanges)
	}
	var b strings.Builder
	if err := c.WriteTable(&b); err != nil || !strings.Contains(b.String(), "Weight changes:           1") {
		t.Errorf("the table does not say so (%v):\n%s", err, b.String())
	}
}

// TestCapacityCurveChained: AIPerf's documentation trace reuses ids 1 and
// 4 after other blocks. An engine serves its second row's first block
// only: 512 of 4,300 tokens, 11.9 %, where a count by id says 35.7 %.
func TestCapacityCurveChained(t *testing.T) {
	rows := readTable(t, "../testdata/aiperf/custom_trace.jsonl")
	c := curveOf(t, rows, CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: DefaultMaxCapacity})
	if c.InfiniteHitTokens != 512 || c.PromptTokens != 4300 || c.DistinctBlocks != 9 || c.ReusingRows != 1 {
		t.Errorf("limit %d of %d tokens, %d blocks, %d rows reusing ids; want 512 of 4,300, 9 and 1",
			c.InfiniteHitTokens, c.PromptTokens, c.DistinctBlocks, c.ReusingRows)
	}
	var b strings.Builder
	if err := c.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Infinite-cache hit rate:  11.91 % (512 tokens)", "Rows reusing ids:         1 "} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table does not say %q:\n%s", want, b.String())
		}
	}
	// The shared Mooncake traces are prefix-consistent: no row reuses an id.
	for _, file := range []string{"conversation_trace.jsonl", "synthetic_trace.jsonl"} {
		if r := ChainReuseOf(readTable(t, sharedTraces+file)); r.Reusing != 0 || r.Rows == 0 {
			t.Errorf("%s: %d of %d rows reuse an id after another chain, want none", file, r.Reusing, r.Rows)
		}
	}
}

func TestCurveOptionsCheck(t *testing.T) {
	ok := CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: DefaultMaxCapacity}
	with := func(f func(*CurveOptions)) CurveOptions { o := ok; f(&o); return o }
	tests := []struct {
		name string
		o    CurveOptions
		want string // "" for none
	}{
		{"defaults", ok, ""},
		{"no trace block", with(func(o *CurveOptions) { o.TraceBlock = 0 }), "the trace block size must be in [1, 1073741823] tokens, got 0"},
		{"no server block", with(func(o *CurveOptions) { o.ServerBlock = -1 }), "the server block size must be in"},
		{"ceiling below a block", with(func(o *CurveOptions) { o.MaxCapacity = 15 }), "at least one server block (16 tokens), got 15"},
		{"ceiling too high", with(func(o *CurveOptions) { o.ServerBlock, o.MaxCapacity = 1, 1<<30 }), "is more than the 1073741823 server blocks of 1 tokens"},
		{"too many blocks held", with(func(o *CurveOptions) { o.TraceBlock, o.MaxCapacity = 1, 1<<31 }), "is more than the 134217727 server blocks of 16 tokens"},
		{"capacity below a block", with(func(o *CurveOptions) { o.Capacities = []int64{16, 8} }), "capacity 8 tokens is outside [16, 256000000]"},
		{"capacity above the ceiling", with(func(o *CurveOptions) { o.Capacities = []int64{256_000_016} }), "capacity 256000016 tokens is outside"},
		{"largest trace block", with(func(o *CurveOptions) { o.TraceBlock = 1<<30 - 1 }), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.o.Check()
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("Check() = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestFineHistogram: every value falls in a bucket whose upper edge is at
// or above it, within 1/1024 of it, and above the edge of the bucket
// before; edges grow.
func TestFineHistogram(t *testing.T) {
	h := newFineHistogram(1 << 40)
	r := rand.New(rand.NewPCG(3, 4))
	values := []int64{0, 1, 2047, 2048, 2049, 4095, 4096, 1<<40 - 1, 1 << 40}
	for range 100000 {
		values = append(values, r.Int64N(1<<uint(1+r.IntN(40))))
	}
	for _, v := range values {
		i := h.index(v)
		if i >= len(h.sum) && v < 1<<40 {
			t.Fatalf("value %d: bucket %d beyond the %d allocated", v, i, len(h.sum))
		}
		hi := h.upper(i)
		if hi < v || (i > 0 && h.upper(i-1) >= v) || float64(hi-v) > float64(v)/1024 {
			t.Fatalf("value %d: bucket %d, edges (%d, %d]", v, i, h.upper(i-1), hi)
		}
	}
	for i := 1; i < h.index(1<<40); i++ {
		if h.upper(i) <= h.upper(i-1) {
			t.Fatalf("edge %d (%d) not above the one before (%d)", i, h.upper(i), h.upper(i-1))
		}
	}
}

// TestCapacityCurveGolden checks the table and the JSON of a small trace
// against testdata/capacity (rewrite them with -update).
func TestCapacityCurveGolden(t *testing.T) {
	rows := readTable(t, "testdata/capacity/small.jsonl")
	c := curveOf(t, rows, CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: DefaultMaxCapacity, Capacities: []int64{2000, 3072, 10000}})
	var table strings.Builder
	if err := c.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]string{"small.txt": table.String(), "small.json": string(c.AppendJSON(nil))} {
		path := filepath.Join("testdata", "capacity", name)
		if *update {
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Errorf("%s:\n%s\nwant:\n%s", name, got, want)
		}
	}
}

func TestCapacityCurveCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rows := readTable(t, sharedTraces+"synthetic_trace.jsonl")
	_, err := CapacityCurveOf(ctx, rows, timestampOrder(t, rows), "x", CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: DefaultMaxCapacity})
	if err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("err %v, want the cancellation", err)
	}
}

// TestCapacityCurveBadOrder: an order that is not one of the trace's rows
// is refused, not run into.
func TestCapacityCurveBadOrder(t *testing.T) {
	rows := tableOf(t, byHand)
	o := CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: 10_000}
	for _, tt := range []struct {
		order []int32
		want  string
	}{
		{[]int32{0, 1, 2}, "x: an order of 3 rows for a trace of 4"},
		{[]int32{0, 1, 2, 4}, "x: the order names row 4, outside the trace's 4"},
		{[]int32{0, -1, 2, 3}, "x: the order names row -1, outside the trace's 4"},
	} {
		if _, err := CapacityCurveOf(context.Background(), rows, tt.order, "x", o); err == nil || err.Error() != tt.want {
			t.Errorf("order %v: err %v, want %q", tt.order, err, tt.want)
		}
	}
}

// splitTrace reads the first n rows of a shared trace with each 512-token
// block split into parts blocks of its own, prefix-consistent as the trace
// is: the trace as an engine of smaller blocks would key it.
func splitTrace(t testing.TB, name string, parts, n int) *trace.Table {
	t.Helper()
	data, err := os.ReadFile(sharedTraces + name)
	if err != nil {
		t.Fatal(err)
	}
	block := 512 / parts
	var out bytes.Buffer
	for line := range bytes.Lines(data) {
		if n--; n < 0 {
			break
		}
		var row map[string]any
		if err := json.Unmarshal(line, &row); err != nil {
			t.Fatal(err)
		}
		isl := int(row["input_length"].(float64))
		var ids []int64
		for _, id := range row["hash_ids"].([]any) {
			for j := range parts {
				ids = append(ids, int64(id.(float64))*int64(parts)+int64(j))
			}
		}
		row["hash_ids"] = ids[:min(len(ids), (isl+block-1)/block)]
		js, err := json.Marshal(row)
		if err != nil {
			t.Fatal(err)
		}
		out.Write(append(js, '\n'))
	}
	rows, err := trace.ReadTable(&out, name, trace.ReadOptions{BlockSize: block}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestCapacityCurveSampled: on the shared conversation trace, a curve whose
// stack holds all its blocks is the exact one. On the same trace in blocks
// of 64 tokens (its first 6,000 rows), curves whose stack
// holds 8 to 16 times fewer blocks, and so samples them, are within 0.01
// of the exact hit rate at every capacity of at least twice SampleScale
// trace blocks: a sampled block stands for SampleScale blocks, and no
// capacity near what one stands for can be told apart.
func TestCapacityCurveSampled(t *testing.T) {
	t.Run("a bound that holds the trace", func(t *testing.T) {
		rows := readTable(t, sharedTraces+"conversation_trace.jsonl")
		o := CurveOptions{TraceBlock: 512, ServerBlock: 16, MaxCapacity: DefaultMaxCapacity}
		exact := curveOf(t, rows, o)
		o.MaxBlocks = 200_000 // the trace has 182,790 blocks
		c := curveOf(t, rows, o)
		if exact.SampleScale != 0 || c.SampleScale != 0 || !reflect.DeepEqual(c.Points, exact.Points) || !reflect.DeepEqual(c.Targets, exact.Targets) {
			t.Errorf("scales %d and %d: a bound that holds every block changed the curve", exact.SampleScale, c.SampleScale)
		}
	})
	const parts = 8
	rows := splitTrace(t, "conversation_trace.jsonl", parts, 6000)
	o := CurveOptions{TraceBlock: 512 / parts, ServerBlock: 16, MaxCapacity: DefaultMaxCapacity, MaxBlocks: 1 << 22}
	exact := curveOf(t, rows, o)
	if exact.SampleScale != 0 {
		t.Fatalf("the exact curve sampled (scale %d)", exact.SampleScale)
	}
	for _, maxBlocks := range []int{1 << 16, 1 << 15} {
		t.Run(fmt.Sprint(maxBlocks), func(t *testing.T) {
			o.MaxBlocks = maxBlocks
			c := curveOf(t, rows, o)
			if c.SampleScale < 8 {
				t.Fatalf("scale %d: the case samples too little to test anything", c.SampleScale)
			}
			if len(c.Points) != len(exact.Points) {
				t.Fatalf("%d points, the exact curve %d", len(c.Points), len(exact.Points))
			}
			from := 2 * c.SampleScale * int64(o.TraceBlock/o.ServerBlock)
			worst := 0.0
			for i, p := range c.Points {
				e := exact.Points[i]
				if p.CapacityBlocks < from {
					continue
				}
				diff := math.Abs(c.HitRate(p.HitTokens) - exact.HitRate(e.HitTokens))
				worst = max(worst, diff)
				if diff > 0.01 {
					t.Errorf("capacity %d blocks: hit rate %.4f, exact %.4f", p.CapacityBlocks, c.HitRate(p.HitTokens), exact.HitRate(e.HitTokens))
				}
			}
			t.Logf("scale %d: from %d blocks on, the hit rate is at most %.4f from the exact one", c.SampleScale, from, worst)
		})
	}
}
