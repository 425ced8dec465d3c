package synth

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/idealcache"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// CurveOptions say what cache a capacity curve models and where it stops.
type CurveOptions struct {
	TraceBlock  int // tokens per trace hash block (512 for Mooncake)
	ServerBlock int // tokens per server KV block (16 for vLLM)
	// MaxCapacity is the largest capacity modelled, in tokens. Blocks
	// further down the LRU stack are forgotten, which bounds the memory
	// (about 90 bytes per trace block held): a trace whose footprint is
	// larger gets a curve that ends here.
	MaxCapacity int64
	// Capacities are evaluated exactly besides the grid, in tokens; each
	// is rounded down to whole server blocks.
	Capacities []int64
	// MaxBlocks bounds the blocks the LRU stack holds, whatever their
	// size (DefaultCurveMaxBlocks when 0): beyond it the stack keeps a
	// spatially hashed sample of them (idealcache.Stack.Sample) and the
	// curve is an estimate (CapacityCurve.SampleScale).
	MaxBlocks int
	// Progress, when set, is called every few thousand rows with the rows
	// done so far.
	Progress func(rows int)
}

// DefaultCurveMaxBlocks is the default bound of the blocks a curve's stack
// holds: 2²⁰, some 100 MB, more than the DefaultMaxCapacity holds in
// blocks of 512 tokens, so that a curve of a trace of Mooncake's block
// size is exact.
const DefaultCurveMaxBlocks = 1 << 20

// Bounds of the options: stack distances pack a block's weight and a count
// of one into one int64 (see packWeight), which these keep from
// overflowing.
const (
	maxCurveBlocks = 1<<30 - 1 // server blocks of MaxCapacity
	maxCurveKeys   = 1<<31 - 1 // trace blocks a cache of MaxCapacity may hold
)

// DefaultMaxCapacity is the default ceiling of a capacity curve, in
// tokens: far above any one engine's KV memory, and at most some 45 MB of
// tracked blocks.
const DefaultMaxCapacity = 256_000_000

// Check tells whether the options describe a curve that can be computed.
func (o *CurveOptions) Check() error {
	switch {
	case o.TraceBlock <= 0 || o.TraceBlock > maxCurveBlocks:
		return fmt.Errorf("the trace block size must be in [1, %d] tokens, got %d", maxCurveBlocks, o.TraceBlock)
	case o.ServerBlock <= 0 || o.ServerBlock > maxCurveBlocks:
		return fmt.Errorf("the server block size must be in [1, %d] tokens, got %d", maxCurveBlocks, o.ServerBlock)
	case o.MaxCapacity < int64(o.ServerBlock):
		return fmt.Errorf("the largest capacity must be at least one server block (%d tokens), got %d", o.ServerBlock, o.MaxCapacity)
	}
	per := o.rounding().EntriesPerServerBlock()
	if b := o.MaxCapacity / int64(o.ServerBlock); b > maxCurveBlocks || b*int64(per) > maxCurveKeys {
		return fmt.Errorf("the largest capacity, %d tokens, is more than the %d server blocks of %d tokens a curve supports",
			o.MaxCapacity, min(maxCurveBlocks, maxCurveKeys/per), o.ServerBlock)
	}
	for _, c := range o.Capacities {
		if c < int64(o.ServerBlock) || c > o.MaxCapacity {
			return fmt.Errorf("capacity %d tokens is outside [%d, %d]: one server block to the largest capacity", c, o.ServerBlock, o.MaxCapacity)
		}
	}
	return nil
}

// rounding is the ideal cache's rules for the curve's blocks. The curve is
// of a block-granular engine (vLLM, Dynamo, TensorRT-LLM), as docs/tools.md
// says and its JSON's "granularity" reports; a token-granular one (SGLang,
// llama.cpp) is --server-block-size 1, where the two roundings agree.
func (o *CurveOptions) rounding() idealcache.Rounding {
	return idealcache.Rounding{TraceBlock: o.TraceBlock, ServerBlock: o.ServerBlock, Granularity: engine.GranularityBlock}
}

// CapacityCurve is a trace's token hit rate as a function of the capacity
// of its engine's prefix cache: an LRU of server blocks, each keyed by its
// chain of blocks as an engine keys it, fed every row once,
// in the replay's order, as replay.CacheModel models one pass with block
// granularity, by the same rules (idealcache.Rounding). A request's k
// leading trace blocks found in the cache give it
// floor(min(k·TraceBlock, input_length−1)/ServerBlock)·ServerBlock cached
// tokens; then its blocks are used from the last to the first, so that its
// first blocks are the most recently used. A trace block weighs
// floor(tokens/ServerBlock) server blocks, a row's last block holding the
// tokens left over.
//
// The hit rate is the hit tokens over the input_length of every row, rows
// without hash_ids included.
type CapacityCurve struct {
	TraceBlock, ServerBlock int
	MaxCapacity             int64 // tokens
	Rows                    int
	PromptTokens            int64
	// DistinctBlocks counts the distinct blocks: the distinct chains of
	// hash ids up to a block (idealcache.ChainKey), which on a trace
	// whose ids are prefix-consistent are its distinct hash ids.
	DistinctBlocks int
	// ReusingRows counts the rows that reuse a hash id after another
	// chain of blocks than where it first appeared
	// (idealcache.ChainReuse): a cache keyed by chains, as engines' are,
	// serves them less than a count by id would say.
	ReusingRows       int
	FootprintBlocks   int64 // the least capacity that holds every block, in server blocks
	InfiniteHitTokens int64 // what an unbounded cache serves: the curve's limit
	// WeightChanges counts the uses of a block with a weight other than
	// the one it had when first seen (a hash id that is a row's short last
	// block and elsewhere a full one). The curve keeps the first weight;
	// replay's model takes the new one when the block re-enters its cache,
	// so the two can differ slightly where this is not 0.
	WeightChanges int64
	// SampleScale is 0 where the curve is exact; past MaxBlocks its stack
	// kept one block in SampleScale, by a hash of the block, and each hit
	// of a block kept counts SampleScale times: the hits are an estimate.
	SampleScale int64

	Points  []CurvePoint  // by capacity: the grid, the footprint and the capacities asked for
	Targets []CurveTarget // the capacities that reach 50, 90 and 99 % of the limit

	fine *fineHistogram
}

// CurvePoint is the curve at one capacity.
type CurvePoint struct {
	CapacityBlocks int64
	HitTokens      int64
	Requested      bool // asked for in CurveOptions.Capacities
}

// CurveTarget is the least capacity whose hits reach Percent % of the
// infinite-cache hits. It is found on a grid of 1024 steps per doubling,
// so the least capacity lies in (Below, Capacity], within 0.1 % of it.
type CurveTarget struct {
	Percent        int
	Reached        bool  // false when no capacity up to the ceiling reaches it, or nothing is shared
	CapacityBlocks int64 // hits reach the share here
	BelowBlocks    int64 // and not here
	HitTokens      int64 // at CapacityBlocks
}

// TargetPercents are the shares of the infinite-cache hit rate whose
// capacities a curve reports.
var TargetPercents = [...]int{50, 90, 99}

// CapacityCurveOf computes the capacity curve of rows, which are read from
// file (named in errors), fed to the cache in order: every row once, in the
// order the replay's cache model walks them (replay.Plan.FleetOrder, which
// is idealcache.FleetOrder of the trace's schedule). The order is the
// caller's because the schedule is the replay's, above this package.
func CapacityCurveOf(ctx context.Context, rows *trace.Table, order []int32, file string, o CurveOptions) (*CapacityCurve, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	if len(order) != rows.Len() {
		return nil, fmt.Errorf("%s: an order of %d rows for a trace of %d", file, len(order), rows.Len())
	}
	b := newCurveBuilder(rows, o)
	for i, r := range order {
		if i%ctxCheckRows == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("modelling the cache of %s: %w", file, err)
			}
			if o.Progress != nil && i > 0 {
				o.Progress(i)
			}
		}
		if r < 0 || int(r) >= rows.Len() {
			return nil, fmt.Errorf("%s: the order names row %d, outside the trace's %d", file, r, rows.Len())
		}
		b.visit(int(r))
	}
	return b.result(), nil
}

// ctxCheckRows is how often, in rows, the curve checks for cancellation.
const ctxCheckRows = 4096

// curveBuilder feeds rows to the LRU stack and adds up the hits.
type curveBuilder struct {
	o       CurveOptions
	round   idealcache.Rounding
	rows    *trace.Table
	stack   *idealcache.Stack[int64]
	weights *blockWeights
	per     int64 // trace blocks per server block of capacity (round.EntriesPerServerBlock)
	full    int64 // weight of a full trace block

	// Each request's hit grows by delta tokens at the least capacity that
	// holds one more of its leading blocks; the deltas are added up by
	// that capacity, exactly at the checkpoints and finely in fine.
	checkpoints []int64 // server blocks, ascending
	atCheckpt   []int64 // hit tokens whose capacity is in (checkpoints[j-1], checkpoints[j]]
	fine        *fineHistogram

	ids            []int64
	keys           []int64 // the row's blocks as the cache keys them (blockWeights.keys)
	c              CapacityCurve
	distinctWeight int64
}

func newCurveBuilder(rows *trace.Table, o CurveOptions) *curveBuilder {
	maxBlocks := o.MaxCapacity / int64(o.ServerBlock)
	round := o.rounding()
	per := int64(round.EntriesPerServerBlock())
	b := &curveBuilder{
		o:     o,
		round: round,
		rows:  rows,
		// The packed ceiling forgets a block once the weight above it
		// exceeds maxBlocks, whatever the count in the low bits.
		stack:   idealcache.NewStack[int64](maxBlocks<<countBits|countMask, int(maxBlocks*per)),
		weights: newBlockWeights(rows),
		per:     per,
		full:    int64(round.BlockWeight(o.TraceBlock)),
		fine:    newFineHistogram(maxBlocks),
	}
	sampled := o.MaxBlocks
	if sampled <= 0 {
		sampled = DefaultCurveMaxBlocks
	}
	b.stack.Sample(sampled, func(k int64) uint64 { return idealcache.SampleHash(0, uint64(k)) })
	b.checkpoints = gridBlocks(o, maxBlocks)
	for _, c := range o.Capacities {
		b.checkpoints = append(b.checkpoints, c/int64(o.ServerBlock))
	}
	slices.Sort(b.checkpoints)
	b.checkpoints = slices.Compact(b.checkpoints)
	b.atCheckpt = make([]int64, len(b.checkpoints))
	b.c = CapacityCurve{TraceBlock: o.TraceBlock, ServerBlock: o.ServerBlock, MaxCapacity: o.MaxCapacity}
	return b
}

// gridBlocks is the log-spaced grid, two points per doubling from one
// trace block (one server block where that is less) up to the ceiling; the
// result cuts it at the footprint.
func gridBlocks(o CurveOptions, maxBlocks int64) []int64 {
	first := max(int64(o.TraceBlock/o.ServerBlock), 1)
	var grid []int64
	for i := 0; ; i++ {
		c := int64(math.Round(float64(first) * math.Pow(2, float64(i)/2)))
		if c > maxBlocks {
			return grid
		}
		grid = append(grid, c)
	}
}

// Stack distances are packed: a block of weight w is used with w<<countBits
// + 1, so that one distance holds both the weight above a block and the
// number of blocks above it, and one Fenwick tree serves both bounds of
// the replay's cache (its weight and its number of blocks).
const (
	countBits = 32
	countMask = 1<<countBits - 1
)

func packWeight(w int64) int64 { return w<<countBits | 1 }

// needs is the least capacity, in server blocks, of a cache that holds a
// block at packed stack distance d: one whose weight and whose number of
// blocks both fit.
func (b *curveBuilder) needs(d int64) int64 {
	w, n := d>>countBits, d&countMask
	return max(w, (n+b.per-1)/b.per)
}

// visit looks row r up at every capacity at once, then uses its blocks.
func (b *curveBuilder) visit(r int) {
	isl := b.rows.ISL(r)
	b.c.Rows++
	b.c.PromptTokens += int64(isl)
	var ok bool
	b.ids, ok = b.rows.AppendHashIDs(b.ids[:0], r)
	if !ok || len(b.ids) == 0 {
		return
	}
	b.keys = b.weights.keys(b.keys[:0], b.ids)
	// A prefix of k blocks is held at a capacity when each of them is:
	// the need of the k-th is the running maximum of their needs. In a
	// sample, a block out of it is held where the next block in it is (a
	// block's prefix is used after it, so never needs more). Of the blocks
	// after the last one found, where the hit ends is not known: it ends
	// before the next block in the sample (never seen), or the row's end,
	// and half of them count, where the last one found is held.
	running, prev, found := int64(0), int64(0), 0
	end := len(b.keys)
	for k, key := range b.keys {
		if !b.stack.Tracks(key) {
			continue
		}
		d := b.stack.Distance(key)
		if d == idealcache.InfiniteDistance {
			end = k
			break
		}
		running = max(running, b.needs(d))
		if q := int64(b.round.CachedTokens(k+1, isl)); q > prev {
			b.add(running, q-prev)
			prev = q
		}
		found = k + 1
	}
	if found > 0 && found < end && b.stack.Scale() > 1 {
		if q := int64(b.round.CachedTokens(found+(end-found)/2, isl)); q > prev {
			b.add(running, q-prev)
		}
	}
	seen := 0
	for seen < len(b.keys) && b.weights.has(b.keys[seen]) {
		seen++
	}
	b.c.InfiniteHitTokens += int64(b.round.CachedTokens(seen, isl))
	// Used from the last block to the first, so that the first is the most
	// recently used, as in idealcache.Cache.Visit.
	last := len(b.keys) - 1
	for i := last; i >= 0; i-- {
		w := b.full
		if i == last {
			w = int64(b.round.BlockWeight(b.round.BlockTokens(i, len(b.keys), isl)))
		}
		b.stack.Use(b.keys[i], packWeight(b.weigh(b.keys[i], w)))
	}
}

// weigh returns the weight of block key, fixed when it is first seen.
func (b *curveBuilder) weigh(key, w int64) int64 {
	first, seen := b.weights.get(key)
	if !seen {
		b.weights.set(key, w)
		b.distinctWeight += w
		b.c.DistinctBlocks++
		return w
	}
	if first != w {
		b.c.WeightChanges++
	}
	return first
}

// add counts delta hit tokens for every capacity of need blocks or more.
func (b *curveBuilder) add(need, delta int64) {
	if j, _ := slices.BinarySearch(b.checkpoints, need); j < len(b.checkpoints) {
		b.atCheckpt[j] += delta
	}
	b.fine.add(need, delta)
}

func (b *curveBuilder) result() *CapacityCurve {
	c := &CapacityCurve{}
	*c = b.c // not a pointer into b, which holds the stack
	if scale := b.stack.Scale(); scale > 1 {
		c.SampleScale = scale
	}
	c.ReusingRows = b.weights.reusing
	c.FootprintBlocks = max(b.distinctWeight, (int64(c.DistinctBlocks)+b.per-1)/b.per)
	end := c.EndBlocks() // every need is at most this
	requested := map[int64]bool{}
	for _, t := range b.o.Capacities {
		requested[t/int64(b.o.ServerBlock)] = true
	}
	var sum int64
	for j, cp := range b.checkpoints {
		sum += b.atCheckpt[j]
		if cp < end || requested[cp] {
			c.Points = append(c.Points, CurvePoint{CapacityBlocks: cp, HitTokens: sum, Requested: requested[cp]})
		}
	}
	if i, found := slices.BinarySearchFunc(c.Points, end, func(p CurvePoint, v int64) int { return cmp.Compare(p.CapacityBlocks, v) }); !found && end > 0 {
		c.Points = slices.Insert(c.Points, i, CurvePoint{CapacityBlocks: end, HitTokens: b.fine.total})
	}
	c.fine = b.fine.cumulate()
	for _, pct := range TargetPercents {
		c.Targets = append(c.Targets, c.target(pct, end))
	}
	return c
}

// target finds the least capacity, up to end, whose hits reach pct % of
// the infinite-cache hits.
func (c *CapacityCurve) target(pct int, end int64) CurveTarget {
	t := CurveTarget{Percent: pct}
	if c.InfiniteHitTokens == 0 {
		return t
	}
	f := c.fine
	below := int64(0)
	for i, cum := range f.cum {
		hi := min(f.upper(i), end)
		if cum*100 >= int64(pct)*c.InfiniteHitTokens {
			t.Reached, t.CapacityBlocks, t.BelowBlocks, t.HitTokens = true, hi, below, cum
			return t
		}
		below = hi
	}
	return t
}

// EndBlocks is where the curve ends, in server blocks: the footprint, or
// the ceiling where the footprint is larger. Every hit counts by then.
func (c *CapacityCurve) EndBlocks() int64 {
	return min(c.FootprintBlocks, c.MaxCapacity/int64(c.ServerBlock))
}

// FinePoints are points of the curve on the fine grid of its targets,
// perOctave or fewer per doubling, up to its end: enough to draw it. Each
// is exact.
func (c *CapacityCurve) FinePoints(perOctave int) []CurvePoint {
	f, end := c.fine, c.EndBlocks()
	var pts []CurvePoint
	step := math.Pow(2, 1/float64(max(perOctave, 1)))
	next := 1.0
	for i, cum := range f.cum {
		e := f.upper(i)
		if e >= end {
			break
		}
		if float64(e) >= next {
			pts = append(pts, CurvePoint{CapacityBlocks: e, HitTokens: cum})
			next = float64(e) * step
		}
	}
	if end > 0 {
		pts = append(pts, CurvePoint{CapacityBlocks: end, HitTokens: f.total})
	}
	return pts
}

// HitRate is hit tokens over the prompt tokens of every row.
func (c *CapacityCurve) HitRate(hitTokens int64) float64 {
	if c.PromptTokens == 0 {
		return 0
	}
	return divide(hitTokens, c.PromptTokens)
}

// ShareOfLimit is hit tokens over the infinite-cache hit tokens.
func (c *CapacityCurve) ShareOfLimit(hitTokens int64) float64 {
	if c.InfiniteHitTokens == 0 {
		return 0
	}
	return divide(hitTokens, c.InfiniteHitTokens)
}

// fineHistogram adds up hit tokens by needed capacity in buckets exact up
// to 2047 blocks and 1024 to a doubling above, as an HDR histogram does:
// a few hundred kilobytes for any capacity, within 0.1 %.
type fineHistogram struct {
	sum   []int64
	cum   []int64 // after cumulate: hits at each bucket's upper edge
	total int64
}

const fineBits = 10 // 1024 buckets a doubling

func newFineHistogram(maxValue int64) *fineHistogram {
	h := &fineHistogram{}
	h.sum = make([]int64, h.index(max(maxValue, 1))+1)
	return h
}

// index is the bucket of v ≥ 0.
func (h *fineHistogram) index(v int64) int {
	if v < 1<<(fineBits+1) {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - 1 - fineBits
	return shift<<fineBits + int(v>>shift)
}

// upper is the largest value of bucket i.
func (h *fineHistogram) upper(i int) int64 {
	if i < 1<<(fineBits+1) {
		return int64(i)
	}
	shift := i>>fineBits - 1
	m := int64(i - shift<<fineBits)
	return (m+1)<<shift - 1
}

func (h *fineHistogram) add(v, delta int64) {
	h.sum[h.index(v)] += delta
	h.total += delta
}

// cumulate turns the sums into running totals and returns h.
func (h *fineHistogram) cumulate() *fineHistogram {
	h.cum = h.sum
	var run int64
	for i, s := range h.cum {
		run += s
		h.cum[i] = run
	}
	h.sum = nil
	return h
}

// blockWeights is the weight of every trace block seen, by the key the
// cache gives the block. On a trace whose ids are prefix-consistent (no row
// reuses an id after another chain: idealcache.ChainReuse) a block's id
// names its chain, and is its key: the weights are in a slice where the
// trace numbers its blocks densely from 0 (as Mooncake traces do), else in
// a map. The slice takes 2 bytes a block: a scale trace has tens of
// millions of them. A weight too large for it goes to the map. On another
// trace the key is the chain's (idealcache.ChainKey), and every weight is
// in the map.
type blockWeights struct {
	dense   []uint16 // weight+1; 0 for a block not seen, bigWeight for one in sparse
	sparse  map[int64]int64
	chained bool // keys are chain keys, not ids
	reusing int  // rows that reuse an id after another chain
	chain   []uint64
}

const bigWeight = math.MaxUint16

func newBlockWeights(rows *trace.Table) *blockWeights {
	w := &blockWeights{sparse: map[int64]int64{}}
	lo, hi, ok := rows.HashIDRange()
	if !ok {
		return w
	}
	reuse := newChainReuse(rows)
	occurrences := 0
	var ids []int64
	for r := range rows.Len() {
		ids, _ = rows.AppendHashIDs(ids[:0], r)
		occurrences += len(ids)
		reuse.Row(ids, rows.Line(r))
	}
	w.reusing = reuse.Reusing
	w.chained = w.reusing > 0
	// Allow gaps, but keep the slice proportionate to the trace.
	if !w.chained && lo >= 0 && hi < 2*int64(occurrences)+1024 {
		w.dense = make([]uint16, hi+1)
	}
	return w
}

// keys appends to dst the keys of a row's blocks, ids.
func (w *blockWeights) keys(dst, ids []int64) []int64 {
	if !w.chained {
		return append(dst, ids...)
	}
	w.chain = idealcache.AppendChainKeys(w.chain[:0], ids)
	for _, k := range w.chain {
		dst = append(dst, int64(k))
	}
	return dst
}

func (w *blockWeights) get(key int64) (int64, bool) {
	if w.dense != nil && w.dense[key] != bigWeight {
		v := w.dense[key]
		return int64(v) - 1, v != 0
	}
	v, ok := w.sparse[key]
	return v, ok
}

func (w *blockWeights) has(key int64) bool {
	_, ok := w.get(key)
	return ok
}

func (w *blockWeights) set(key, weight int64) {
	if w.dense == nil {
		w.sparse[key] = weight
		return
	}
	if weight+1 >= bigWeight {
		w.dense[key] = bigWeight
		w.sparse[key] = weight
		return
	}
	w.dense[key] = uint16(weight + 1)
}
