package synth

import (
	"encoding/binary"
	"math"
	"math/bits"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// TransformTable is Transform on a Table, done on the columns: no row is
// ever held as a Record, so synthesizing a trace of millions of rows takes
// about the memory of a second table. It returns t itself when nothing
// changes (no multiplier, no row dropped, moved or capped).
func TransformTable(t *trace.Table, k Knobs) (*trace.Table, Stats, error) {
	if err := k.Validate(); err != nil {
		return nil, Stats{}, err
	}
	order, st := tableOrder(t, k.MaxISL)
	if !k.multipliersSet() && unchanged(t, order, k) {
		return t, st, nil
	}
	tt := tableTransform{t: t, k: k, order: order}
	out, err := tt.run()
	if err != nil {
		return nil, Stats{}, err
	}
	return out, st, nil
}

// tableOrder is Transform's filter and session order as row indices: rows
// over maxISL are left out, the rest grouped by session in order of first
// appearance, file order within a session. Each session's rows are given
// their slots when its first row is met, so no per-session list is built.
func tableOrder(t *trace.Table, maxISL int) ([]int32, Stats) {
	st := Stats{RowsIn: t.Len()}
	keep := func(i int) bool { return maxISL <= 0 || t.ISL(i) <= maxISL }
	rowsOf := make([]int32, t.Sessions()) // kept rows of each session
	kept := 0
	for i := range t.Len() {
		if !keep(i) {
			st.DroppedMaxISL++
			continue
		}
		kept++
		if s := t.SessionOrdinal(i); s >= 0 {
			rowsOf[s]++
		}
	}
	next := make([]int32, t.Sessions()) // the next slot of each session; -1 before its first row
	for s := range next {
		next[s] = -1
	}
	order := make([]int32, kept)
	pos := int32(0)
	for i := range t.Len() {
		if !keep(i) {
			continue
		}
		s := t.SessionOrdinal(i)
		if s < 0 {
			order[pos] = int32(i)
			pos++
			continue
		}
		if next[s] < 0 {
			next[s] = pos
			pos += rowsOf[s]
		}
		order[next[s]] = int32(i)
		next[s]++
	}
	st.RowsOut = kept
	return order, st
}

// unchanged tells whether order is every row of t in place and no
// output_length is over MaxOSL.
func unchanged(t *trace.Table, order []int32, k Knobs) bool {
	if len(order) != t.Len() {
		return false
	}
	for n, i := range order {
		if int(i) != n || (k.MaxOSL > 0 && t.OSL(n) > k.MaxOSL) {
			return false
		}
	}
	return true
}

// tableTransform is one TransformTable run over the rows of t in order.
type tableTransform struct {
	t      *trace.Table
	k      Knobs
	order  []int32
	ids    []int64 // a row's source ids
	newIDs []int64 // its rewritten ids
}

func (tt *tableTransform) run() (*trace.Table, error) {
	var w *idRewriter
	var roots *rootScatter
	idBytes := tt.t.HashIDBytes() // at most: rows are only dropped
	if tt.k.multipliersSet() {
		var err error
		if w, err = tt.rewriter(); err != nil {
			return nil, err
		}
		if idBytes, roots, err = tt.dryRun(w); err != nil {
			return nil, err
		}
	}
	b := trace.NewTableBuilder(len(tt.order))
	b.ReserveHashIDs(idBytes)
	for _, i := range tt.order {
		r := tt.t.Row(int(i), tt.ids)
		tt.ids = r.HashIDs
		if w != nil {
			if err := tt.rewrite(w, roots, int(i), &r); err != nil {
				return nil, err
			}
		}
		if r.OSL >= 0 {
			r.OSL = tt.k.outputLength(r.OSL)
		}
		if err := b.AppendEdited(tt.t, int(i), &r); err != nil {
			return nil, &trace.LineError{Line: tt.t.Line(int(i)), Err: err}
		}
	}
	return b.Table(), nil
}

// rewrite applies the multipliers to row i, read into r: the timestamp,
// the ids and input length, and the root of its ids.
func (tt *tableTransform) rewrite(w *idRewriter, roots *rootScatter, i int, r *trace.Row) error {
	if !math.IsNaN(r.Timestamp) { // NaN: the row has none
		r.Timestamp = tt.k.timestamp(r.Timestamp)
	}
	if len(r.HashIDs) == 0 {
		r.HashIDs, r.HasIDs = nil, false // AIPerf drops an empty hash_ids key
		return nil
	}
	ids, isl, err := w.rewrite(tt.t.Line(i), r.HashIDs, r.ISL, tt.newIDs[:0])
	if err != nil {
		return err
	}
	tt.newIDs = ids
	if roots != nil {
		roots.move(ids)
	}
	r.HashIDs, r.ISL = ids, isl
	return nil
}

// rewriter checks the block rule on every row with ids, in order, finds
// the shared ids and returns the rewriter for them. One pass over the ids
// does both when they span few enough values for bitmaps; the table knows
// their range.
func (tt *tableTransform) rewriter() (*idRewriter, error) {
	var mark func(int64)
	var shared interface {
		sharedIDs
		maxShared() int64
	}
	lo, hi, ok := tt.t.HashIDRange()
	if ok && idSpanIsDense(hi-lo, tt.t.Bytes()) {
		bits := newIDBits(lo, hi)
		mark, shared = bits.add, bits
	} else {
		count := make(idCounts)
		mark, shared = func(h int64) { count[h]++ }, count
	}
	for _, i := range tt.order {
		n := tt.t.HashIDCount(int(i))
		if n == 0 {
			continue
		}
		var isl *int
		if v, ok := tt.t.InputLength(int(i)); ok {
			isl = &v
		}
		if err := checkBlockRule(tt.t.Line(int(i)), isl, n, tt.k.BlockSize); err != nil {
			return nil, err
		}
		tt.ids, _ = tt.t.AppendHashIDs(tt.ids[:0], int(i))
		for _, h := range tt.ids {
			mark(h)
		}
	}
	return newIDRewriter(shared, shared.maxShared(), tt.k)
}

// dryRun rewrites every row's ids without keeping them, for what the
// real run needs to know beforehand: the bytes the rewritten ids take, so
// that the column is made once at its size (growing it would copy it over
// and over, trimming it would copy it once more), and the prefix-root
// scatter (nil without one), whose base lies above every id the rewriter
// hands out.
func (tt *tableTransform) dryRun(w *idRewriter) (idBytes int, roots *rootScatter, err error) {
	dry := *w
	for _, i := range tt.order {
		r := tt.t.Row(int(i), tt.ids)
		tt.ids = r.HashIDs
		if len(r.HashIDs) == 0 {
			idBytes += trace.HashIDsSize(nil, false)
			continue
		}
		if tt.newIDs, _, err = dry.rewrite(tt.t.Line(int(i)), r.HashIDs, r.ISL, tt.newIDs[:0]); err != nil {
			return 0, nil, err
		}
		idBytes += trace.HashIDsSize(tt.newIDs, true)
		if tt.k.PrefixRootMultiplier > 1 {
			idBytes += binary.MaxVarintLen64 // the first id may move far
		}
	}
	if tt.k.PrefixRootMultiplier <= 1 {
		return idBytes, nil, nil
	}
	base := dry.next + 1
	if err := checkRootSpace(base, tt.k); err != nil {
		return 0, nil, err
	}
	return idBytes, newRootScatter(base, tt.k), nil
}

// idSpanIsDense tells whether ids spread over span+1 values are counted in
// bitmaps (two bits a value) rather than in a map (tens of bytes a distinct
// id): when the bitmaps take at most twice the memory of the table that
// holds the ids. Mooncake ids count up from 0, so they nearly always are.
func idSpanIsDense(span int64, tableBytes int) bool {
	return span >= 0 && span/4 <= 2*int64(tableBytes)+1<<16
}

// idBits marks the ids seen once and those seen more than once, over the
// values lo..hi.
type idBits struct {
	lo          int64
	once, twice []uint64
}

func newIDBits(lo, hi int64) *idBits {
	words := (hi-lo)/64 + 1
	return &idBits{lo: lo, once: make([]uint64, words), twice: make([]uint64, words)}
}

func (s *idBits) add(h int64) {
	v := h - s.lo
	w, bit := v/64, uint64(1)<<(v%64)
	if s.once[w]&bit != 0 {
		s.twice[w] |= bit
	}
	s.once[w] |= bit
}

func (s *idBits) isShared(h int64) bool {
	v := h - s.lo
	if v < 0 || v/64 >= int64(len(s.twice)) {
		return false
	}
	return s.twice[v/64]&(uint64(1)<<(v%64)) != 0
}

// maxShared is the largest shared id, 0 when none is.
func (s *idBits) maxShared() int64 {
	for w := len(s.twice) - 1; w >= 0; w-- {
		if x := s.twice[w]; x != 0 {
			return max(0, s.lo+int64(w)*64+int64(63-bits.LeadingZeros64(x)))
		}
	}
	return 0
}
