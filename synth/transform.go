package synth

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/kvload-exporter/kvload-exporter/internal/rng"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// Knobs are the synthesis settings shared by the per-row transform
// (Transform) and the generative sampler (Generate): the trace's block
// size and the seed beside the reshaping itself.
type Knobs struct {
	BlockSize int // tokens per hash block of the trace
	Synthesis
	Seed uint64 // root of the named random streams
}

// Synthesis is how each row is reshaped. Its names follow AIPerf's
// --synthesis-* options, and its keys are those of a workload's synthesis
// block; Knobs.Validate checks them.
type Synthesis struct {
	SpeedupRatio         float64 `yaml:"speedup_ratio,omitempty"`          // > 0; timestamps are divided by it
	PrefixLenMultiplier  float64 `yaml:"prefix_len_multiplier,omitempty"`  // > 0; stretches or shrinks shared prefixes
	PrefixRootMultiplier int     `yaml:"prefix_root_multiplier,omitempty"` // ≥ 1; number of disjoint hash-id spaces
	PromptLenMultiplier  float64 `yaml:"prompt_len_multiplier,omitempty"`  // > 0; scales the unique (non-prefix) tokens
	OutputLenMultiplier  float64 `yaml:"output_len_multiplier,omitempty"`  // ≥ 0; scales output_length
	MaxISL               int     `yaml:"max_isl,omitempty"`                // 0 = none; rows above it are dropped, results capped
	MaxOSL               int     `yaml:"max_osl,omitempty"`                // 0 = none; output_length is capped at it
}

// DefaultKnobs returns the settings under which synthesis changes nothing.
func DefaultKnobs() Knobs {
	return Knobs{
		BlockSize: trace.DefaultBlockSize,
		Synthesis: Synthesis{
			SpeedupRatio:         1,
			PrefixLenMultiplier:  1,
			PrefixRootMultiplier: 1,
			PromptLenMultiplier:  1,
			OutputLenMultiplier:  1,
		},
	}
}

// Validate reports every knob out of range at once, naming each by its
// configuration key (speedup_ratio, ...).
func (k Knobs) Validate() error { return k.ValidateNamed(func(key string) string { return key }) }

// ValidateNamed is Validate with each knob named by name(key), so that the
// command line can say "--speedup-ratio" and a config file its YAML path.
func (k Knobs) ValidateNamed(name func(key string) string) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s", name(key), fmt.Sprintf(format, args...)))
	}
	positive := func(key string, v float64) {
		if !(v > 0) || math.IsInf(v, 0) {
			bad(key, "must be a finite number > 0, got %v", v)
		}
	}
	if k.BlockSize <= 0 {
		bad("block_size", "must be > 0, got %d", k.BlockSize)
	}
	positive("speedup_ratio", k.SpeedupRatio)
	positive("prefix_len_multiplier", k.PrefixLenMultiplier)
	positive("prompt_len_multiplier", k.PromptLenMultiplier)
	if !(k.OutputLenMultiplier >= 0) || math.IsInf(k.OutputLenMultiplier, 0) {
		bad("output_len_multiplier", "must be a finite number ≥ 0, got %v", k.OutputLenMultiplier)
	}
	if k.PrefixRootMultiplier < 1 {
		bad("prefix_root_multiplier", "must be an integer ≥ 1, got %d", k.PrefixRootMultiplier)
	}
	if k.MaxISL < 0 {
		bad("max_isl", "must be ≥ 0 (0 = no limit), got %d", k.MaxISL)
	}
	if k.MaxOSL < 0 {
		bad("max_osl", "must be ≥ 0 (0 = no limit), got %d", k.MaxOSL)
	}
	return errors.Join(errs...)
}

// multipliersSet tells whether AIPerf would run its Synthesizer: any knob
// other than max_isl/max_osl away from its default.
func (k Knobs) multipliersSet() bool {
	return k.SpeedupRatio != 1 || k.PrefixLenMultiplier != 1 || k.PrefixRootMultiplier != 1 ||
		k.PromptLenMultiplier != 1 || k.OutputLenMultiplier != 1
}

// Rewrites tells whether Transform rewrites rows (any multiplier away from
// its default) rather than only filtering, ordering and capping them; the
// seed matters only then.
func (k Knobs) Rewrites() bool { return k.multipliersSet() }

// Stats summarises one synthesis run.
type Stats struct {
	RowsIn        int // rows read
	RowsOut       int // rows written
	DroppedMaxISL int // transform: input rows over max_isl; generate: sampled requests over max_isl
}

// Transform is AIPerf's per-row synthesis (trace-semantics §1.3 steps 2–5
// and §4.1): rows with input_length > MaxISL are dropped, the rest are put
// in session order (sessions by first appearance, rows without session_id
// each their own, file order within a session), and, when any multiplier
// is non-default, every row is rewritten: timestamps divided by the speedup
// ratio and truncated, shared prefixes stretched by PrefixLenMultiplier,
// unique tokens scaled by PromptLenMultiplier, output lengths scaled, ids
// spread over PrefixRootMultiplier disjoint spaces. Fields the transform
// does not own (session_id, delay, messages, unknown keys, ...) are kept.
// With only MaxISL/MaxOSL set, rows are filtered and capped but not
// renumbered, as in AIPerf. rows is not modified.
//
// Where AIPerf crashes or emits rows whose hash_ids do not fit input_length,
// Transform defines its own behaviour so that every row with ids satisfies
// the block rule last = isl − (n−1)·B ∈ (0, B]:
//
//   - A row whose ids are all shared and whose last block is partial
//     (AIPerf: "input_len < prefix_len" ValueError) counts its last block at
//     its real size: the prefix is the whole row and the prompt part is 0.
//     The rewritten prefix ends with a block short by the same number of
//     tokens, so isl' = len(prefix')·B − (len(ids)·B − isl). When P < 1 cuts
//     the prefix before that last block, the kept blocks are all full.
//   - P < 1 on a row without a shared prefix keeps no prefix block (AIPerf
//     counts one block of tokens without an id).
//   - The post-synthesis max_isl cap also trims hash_ids to
//     ceil(max_isl/B) (AIPerf caps input_length only).
//   - A row with ids whose scaled prompt would have 0 tokens and no prefix
//     keeps one token (AIPerf writes input_length 0 and drops its ids).
func Transform(rows []trace.Record, k Knobs) ([]trace.Record, Stats, error) {
	if err := k.Validate(); err != nil {
		return nil, Stats{}, err
	}
	st := Stats{RowsIn: len(rows)}
	kept := make([]trace.Record, 0, len(rows))
	for _, r := range rows {
		if k.MaxISL > 0 && r.InputLength != nil && *r.InputLength > k.MaxISL {
			st.DroppedMaxISL++
			continue
		}
		kept = append(kept, r)
	}
	out := sessionOrder(kept)
	for i := range out {
		empty := out[i].HashIDs != nil && len(out[i].HashIDs) == 0
		out[i] = out[i].Clone()
		if empty {
			out[i].HashIDs = []int64{} // Clone turns [] into nil; keep the key
		}
	}
	if k.multipliersSet() {
		if err := applyMultipliers(out, k); err != nil {
			return nil, Stats{}, err
		}
		for i := range out {
			if r := &out[i]; r.Timestamp != nil {
				*r.Timestamp = k.timestamp(*r.Timestamp)
			}
		}
	}
	for i := range out {
		if r := &out[i]; r.OutputLength != nil {
			*r.OutputLength = k.outputLength(*r.OutputLength)
		}
	}
	st.RowsOut = len(out)
	return out, st, nil
}

// timestamp is a row's timestamp after synthesis with multipliers:
// divided by the speed-up and truncated, as AIPerf does.
func (k Knobs) timestamp(ms float64) float64 { return math.Trunc(ms / k.SpeedupRatio) }

// outputLength is a row's output_length after synthesis: scaled, rounded
// half to even and kept ≥ 1 when multipliers are set, capped at MaxOSL.
func (k Knobs) outputLength(osl int) int {
	if k.multipliersSet() {
		v := math.RoundToEven(float64(osl) * k.OutputLenMultiplier)
		if k.MaxOSL > 0 && v > float64(k.MaxOSL) {
			v = float64(k.MaxOSL)
		}
		osl = max(1, int(v))
	}
	if k.MaxOSL > 0 && osl > k.MaxOSL {
		osl = k.MaxOSL
	}
	return osl
}

// sessionOrder groups rows by session_id in order of first appearance; a
// row without session_id is a session of its own. It returns a new slice.
func sessionOrder(rows []trace.Record) []trace.Record {
	first := make(map[string]int) // session id → index in groups
	var groups [][]int
	for i, r := range rows {
		if r.SessionID == nil {
			groups = append(groups, []int{i})
			continue
		}
		g, ok := first[*r.SessionID]
		if !ok {
			g = len(groups)
			first[*r.SessionID] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	out := make([]trace.Record, 0, len(rows))
	for _, g := range groups {
		for _, i := range g {
			out = append(out, rows[i])
		}
	}
	return out
}

// idLimit keeps synthesized hash ids well inside int64.
const idLimit = 1 << 62

// applyMultipliers rewrites hash_ids and input_length of rows in place with
// the prefix, prompt and root multipliers (AIPerf's _apply_multipliers plus
// the fixes listed on Transform).
func applyMultipliers(rows []trace.Record, k Knobs) error {
	count, err := countIDs(rows, k.BlockSize)
	if err != nil {
		return err
	}
	w, err := newIDRewriter(count, count.maxShared(), k)
	if err != nil {
		return err
	}
	for i := range rows {
		r := &rows[i]
		if len(r.HashIDs) == 0 {
			continue
		}
		if r.HashIDs, *r.InputLength, err = w.rewrite(r.Line, r.HashIDs, *r.InputLength, nil); err != nil {
			return err
		}
	}
	if err := scatterPrefixRoots(rows, w.next+1, k); err != nil {
		return err
	}
	for i := range rows {
		if rows[i].HashIDs != nil && len(rows[i].HashIDs) == 0 {
			rows[i].HashIDs = nil // AIPerf drops an empty hash_ids key
		}
	}
	return nil
}

// sharedIDs tells which hash ids are shared prefix blocks: ids that occur
// more than once over the rows synthesis rewrites.
type sharedIDs interface {
	isShared(h int64) bool
}

// idCounts counts the occurrences of each id.
type idCounts map[int64]int

func (c idCounts) isShared(h int64) bool { return c[h] > 1 }

// maxShared is the largest shared id, 0 when none is.
func (c idCounts) maxShared() int64 {
	var top int64
	for h, n := range c {
		if n > 1 && h > top {
			top = h
		}
	}
	return top
}

// countIDs checks the block rule on every row with ids and counts the
// occurrences of each id: an id seen twice or more is a shared prefix block.
func countIDs(rows []trace.Record, B int) (idCounts, error) {
	count := make(idCounts)
	for i := range rows {
		r := &rows[i]
		if len(r.HashIDs) == 0 {
			continue
		}
		if err := checkBlocks(r, B); err != nil {
			return nil, err
		}
		for _, h := range r.HashIDs {
			count[h]++
		}
	}
	return count, nil
}

// idRewriter rewrites the ids and input length of one row at a time.
// Shared ids keep their meaning (scaled by m under P > 1); every other
// block gets a fresh id above them.
type idRewriter struct {
	k      Knobs
	shared sharedIDs
	m      int64 // ids each shared id becomes under P > 1
	next   int64 // the last id handed out; fresh ids follow it
}

// newIDRewriter returns a rewriter for rows whose largest shared id is
// maxShared (0 when none is).
func newIDRewriter(shared sharedIDs, maxShared int64, k Knobs) (*idRewriter, error) {
	P := k.PrefixLenMultiplier
	m := int64(1)
	if P > 1 {
		if P >= idLimit {
			return nil, fmt.Errorf("prefix_len_multiplier %v is too large", P)
		}
		m = int64(P)
	}
	if float64(maxShared+1)*float64(m) >= idLimit {
		return nil, fmt.Errorf("prefix_len_multiplier %v would push hash ids past %d", P, int64(idLimit))
	}
	return &idRewriter{k: k, shared: shared, m: m, next: (maxShared + 1) * m}, nil
}

// fresh appends n fresh ids to ids.
func (w *idRewriter) fresh(ids []int64, n int) []int64 {
	for ; n > 0; n-- {
		w.next++
		ids = append(ids, w.next)
	}
	return ids
}

// rewrite scales the shared prefix of the row on line (its ids and input
// length isl) by P and its unique prompt by Q, then caps it at MaxISL. The
// new ids are appended to dst, which must not overlap ids.
func (w *idRewriter) rewrite(line int, ids []int64, isl int, dst []int64) ([]int64, int, error) {
	B, Q := w.k.BlockSize, w.k.PromptLenMultiplier
	lp := w.sharedRun(ids)
	// short is how many tokens the row's last block lacks when the whole
	// row is prefix; it stays on the last block of the new prefix.
	short := 0
	if lp == len(ids) {
		short = lp*B - isl
	}
	prompt := isl - (lp*B - short)

	kept, short, err := w.scalePrefix(line, ids[:lp], short, dst)
	if err != nil {
		return nil, 0, err
	}
	prefix := len(kept) * B
	if len(kept) > 0 {
		prefix -= short
	}

	qf := float64(prompt) * Q
	if qf > trace.MaxCount {
		return nil, 0, fmt.Errorf("line %d: prompt_len_multiplier %v makes a %.0f-token prompt", line, Q, qf)
	}
	q := int(qf)
	if q == 0 && prefix == 0 {
		q = 1 // keep the request non-empty
	}
	kept = w.fresh(kept, ceilDiv(q, B))
	isl = prefix + q

	if w.k.MaxISL > 0 && isl > w.k.MaxISL {
		isl = w.k.MaxISL
		kept = kept[:ceilDiv(isl, B)]
	}
	return kept, isl, nil
}

// sharedRun is the length of the leading run of shared ids.
func (w *idRewriter) sharedRun(ids []int64) int {
	n := 0
	if bits, ok := w.shared.(*idBits); ok { // the common case, without a call per id
		for n < len(ids) && bits.isShared(ids[n]) {
			n++
		}
		return n
	}
	for n < len(ids) && w.shared.isShared(ids[n]) {
		n++
	}
	return n
}

// scalePrefix appends to dst the new prefix ids for the shared ids of the
// row on line, and returns the tokens its last block lacks: short, or 0
// when shrinking cut the partial last block off.
func (w *idRewriter) scalePrefix(line int, shared []int64, short int, dst []int64) ([]int64, int, error) {
	B, P := w.k.BlockSize, w.k.PrefixLenMultiplier
	lp := len(shared)
	switch {
	case P > 1:
		tf := math.Ceil(float64(lp) * P)
		if tf*float64(B) > trace.MaxCount {
			return nil, 0, fmt.Errorf("line %d: prefix_len_multiplier %v makes a %.0f-block prefix", line, P, tf)
		}
		total := int(tf)
		kept := slices.Grow(dst, total)
		for _, h := range shared {
			for j := range w.m {
				kept = append(kept, h*w.m+j)
			}
		}
		return w.fresh(kept, total-len(kept)), short, nil
	case P < 1:
		kb := 0
		if lp > 0 {
			kb = max(1, int(float64(lp)*P))
		}
		if kb < lp {
			short = 0 // the partial last block was cut off
		}
		return append(dst, shared[:kb]...), short, nil
	default:
		return append(dst, shared...), short, nil
	}
}

// scatterPrefixRoots applies the prefix-root multiplier R: each row with
// ids moves, by a draw of its own, to one of R copies of the id space, base
// ids apart (base is above every id handed out), so that R disjoint
// families of prefixes share the traffic. Rows without ids take no draw.
func scatterPrefixRoots(rows []trace.Record, base int64, k Knobs) error {
	if k.PrefixRootMultiplier <= 1 {
		return nil
	}
	if err := checkRootSpace(base, k); err != nil {
		return err
	}
	roots := newRootScatter(base, k)
	for i := range rows {
		if ids := rows[i].HashIDs; len(ids) > 0 {
			roots.move(ids)
		}
	}
	return nil
}

// checkRootSpace refuses a root multiplier whose copies of the id space,
// base ids apart, would not fit.
func checkRootSpace(base int64, k Knobs) error {
	if R := k.PrefixRootMultiplier; float64(base)*float64(R) >= idLimit {
		return fmt.Errorf("prefix_root_multiplier %d would push hash ids past %d", R, int64(idLimit))
	}
	return nil
}

// rootScatter moves rows to one of R copies of the id space, base ids
// apart, by a seeded draw per row with ids.
type rootScatter struct {
	base int64
	R    int
	rng  *rand.Rand
}

func newRootScatter(base int64, k Knobs) *rootScatter {
	return &rootScatter{base: base, R: k.PrefixRootMultiplier, rng: rng.New(k.Seed, StreamPrefixRoot)}
}

// move shifts ids in place into the copy drawn for their row.
func (s *rootScatter) move(ids []int64) {
	if t := int64(s.rng.IntN(s.R)); t > 0 {
		for j := range ids {
			ids[j] += t * s.base
		}
	}
}

// checkBlocks applies the block rule to a row read without it, so the
// transform never works on ids that cannot describe input_length.
func checkBlocks(r *trace.Record, B int) error {
	return checkBlockRule(r.Line, r.InputLength, len(r.HashIDs), B)
}

// checkBlockRule is checkBlocks for the row on line with input length isl
// (nil when absent) and n hash ids.
func checkBlockRule(line int, isl *int, n, B int) error {
	if isl == nil {
		return fmt.Errorf("line %d: hash_ids without input_length", line)
	}
	if last := *isl - (n-1)*B; last <= 0 || last > B {
		return fmt.Errorf("line %d: input_length %d does not fit %d hash_ids of %d-token blocks",
			line, *isl, n, B)
	}
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
