package synth

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/kvload-exporter/kvload-exporter/internal/rng"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// Generate samples n new requests from a model learned from rows, after
// Dynamo's `datagen synthesize` (trace-semantics §4.2): the rows' hash_ids
// form a prefix trie (ids normalised per parent); chains of nodes that every
// visitor crosses together are merged into one node of several blocks;
// nodes visited by a single row are cut off as "leaves" (unique suffixes).
// A request walks the trie from the root, choosing among the children,
// "leave with fresh unique blocks" and "stop here" in proportion to how
// often the source rows did. isl = (blocks − 1)·B + last-block size.
// Burst sizes per timestamp, gaps between timestamps and output lengths
// come from the source's empirical distributions.
//
// Every random choice draws from its own stream seeded from k.Seed (streams.go:
// StreamTrie for the walk, StreamCounts, StreamGaps, StreamLastBlock,
// StreamOutputLen, StreamLeafLen, StreamPrefixRoot), so one seed gives one
// output, and changing a knob does not reshuffle draws it does not own: the
// prefix-root multiplier changes only hash_ids, the prefix and prompt
// multipliers only hash_ids and input_length. Each sampled request consumes
// the same draws whether or not MaxISL then drops it.
//
// Output rows hold timestamp, input_length, output_length and hash_ids;
// Dynamo's context_len and unique_user_prompt_len are left out (analyze
// recomputes context lengths from the ids). Every row satisfies the block
// rule last = isl − (n−1)·B ∈ (0, B].
//
// Where Dynamo is wrong, Generate does this instead:
//   - Rows with empty or absent hash_ids stay out of the trie (Dynamo adds
//     them to the previous row's end count); they still feed the timing
//     and output-length samplers. Every row needs timestamp and
//     output_length (Dynamo also needs input_length and hash_ids).
//   - Fractional PrefixLenMultiplier > 1 scales each node's length to
//     max(1, round_half_even(L·P)) (Dynamo first rounds P up, so 1.5 acted
//     as 2). Integer P and P < 1 give Dynamo's lengths. With P ≠ 1 the trie
//     nodes get new consecutive id runs in node order; with P = 1 they keep
//     the source's (normalised) ids.
//   - A walk that stops on a shared node keeps a partial last block, drawn
//     from the last-block sizes of the rows that stopped there (Dynamo
//     makes it a full block).
//   - Timestamps are the running sum of sampled gaps divided by the speedup
//     ratio, floored once per burst (Dynamo rounds each gap, so gaps under
//     half a millisecond after speedup vanish). Gaps are taken between
//     consecutive distinct timestamps in sorted order, so unsorted traces
//     keep them all.
//   - Samplers have independent seeded streams (Dynamo's start from seed 0
//     and move in lockstep; its path and root choices are unseeded).
//   - Output lengths are at least 1 token. Fresh ids go only to kept
//     requests, so ids stay dense.
//
// Two choices go beyond Dynamo, to keep the statistics of the source:
//   - A leaf's length and last-block size are drawn together from the rows
//     that left the trie at the same node, not from all rows. Dynamo's
//     unconditioned draw pairs long shared prefixes with long unique tails;
//     on the FAST'25 conversation trace it moved the median input length
//     by −11%, against +0.1% here. The prompt multiplier scales the drawn
//     block count to max(1, round_half_even(L·Q)).
//   - Requests are generated in passes of as many requests as the source
//     has rows with ids; each pass after the first moves the trie's ids to
//     an unused range (like the replay's `loop: fresh`). One trie replayed
//     for longer only revisits the same prefixes, while real traffic keeps
//     bringing new ones: on the conversation trace 100,000 requests in one
//     namespace reach a theoretical hit rate of 0.52 against the source's
//     0.38; with passes, 0.41.
func Generate(rows []trace.Record, n int, k Knobs) ([]trace.Record, Stats, error) {
	if err := k.Validate(); err != nil {
		return nil, Stats{}, err
	}
	if n < 0 {
		return nil, Stats{}, fmt.Errorf("number of requests must be ≥ 0, got %d", n)
	}
	m, err := learn(rows, k)
	if err != nil {
		return nil, Stats{}, err
	}
	out, dropped, err := m.generate(n, k)
	if err != nil {
		return nil, Stats{}, err
	}
	return out, Stats{RowsIn: len(rows), RowsOut: len(out), DroppedMaxISL: dropped}, nil
}

// Outcomes of a walk step other than moving to a child node.
const (
	stepLeaf = -1 // continue with fresh, unshared blocks, then stop
	stepEnd  = -2 // stop on this node
)

// trieNode is a shared node of the learned trie after chain merging.
type trieNode struct {
	first  int64 // first hash id of the node's run of blocks
	length int   // blocks in the run
	// next[i] is a child index or stepLeaf/stepEnd; cum[i] the cumulative
	// weight (source rows that took it) up to and including it.
	next []int32
	cum  []int64
	// endSizes are the last-block sizes of the source rows that ended here.
	endSizes []int
	// leaves are the unique suffixes of the source rows that left the trie
	// here.
	leaves []leaf
}

// leaf is the unique tail of one source row: its blocks (scaled by the
// prompt multiplier) and the tokens in its last block.
type leaf struct{ blocks, last int }

// trieModel is everything Generate samples from.
type trieModel struct {
	blockSize  int
	nodes      []trieNode // nodes[0] is the root (no blocks)
	idSpan     int64      // ids of the trie are in [0, idSpan)
	passLen    int        // requests per pass: the source rows with ids
	burstSizes []int      // rows per distinct timestamp
	gaps       []float64  // gaps between consecutive distinct timestamps
	outputs    []int      // output_length of every row
}

// learn builds the model. Steps follow §4.2: normalise ids, count visits,
// merge chains, cut visited-once nodes, relabel for P, build transitions.
func learn(rows []trace.Record, k Knobs) (*trieModel, error) {
	m := &trieModel{blockSize: k.BlockSize}
	src, stamps, err := m.normalise(rows)
	if err != nil {
		return nil, err
	}
	ch := src.mergeChains()
	idx := m.cutLeaves(src, ch)
	m.idSpan = int64(len(src.parent))
	m.passLen = src.withIDs
	if err := m.relabel(k.PrefixLenMultiplier); err != nil {
		return nil, err
	}
	m.addTransitions(src, ch, idx)
	if err := m.orderLeaves(k.PromptLenMultiplier); err != nil {
		return nil, err
	}
	m.learnTiming(stamps)
	return m, nil
}

// sourceTrie is the prefix trie of the source rows before merging. A node
// is an id under a given parent, numbered in order of first appearance, so
// equal ids under different parents split; a child's number is always
// above its parent's.
type sourceTrie struct {
	intern  map[sourceEdge]int32
	parent  []int32  // by node; -1 under the root
	visited []int    // by node: the rows through it
	ends    []rowEnd // one per row with ids, in file order
	withIDs int      // rows with ids
}

type sourceEdge struct{ parent, id int64 }

// rowEnd is the node a source row ends on and the size of its last block.
type rowEnd struct {
	node int32
	last int
}

// normalise checks every row, collects its timestamp and output length, and
// adds the ids of those that have some to the source trie.
func (m *trieModel) normalise(rows []trace.Record) (*sourceTrie, []float64, error) {
	B := m.blockSize
	src := &sourceTrie{intern: make(map[sourceEdge]int32)}
	var stamps []float64
	for i := range rows {
		r := &rows[i]
		if r.Timestamp == nil {
			return nil, nil, fmt.Errorf("line %d: generating needs a timestamp on every row", r.Line)
		}
		if r.OutputLength == nil {
			return nil, nil, fmt.Errorf("line %d: generating needs an output_length on every row", r.Line)
		}
		stamps = append(stamps, *r.Timestamp)
		m.outputs = append(m.outputs, *r.OutputLength)
		if len(r.HashIDs) == 0 {
			continue
		}
		if err := checkBlocks(r, B); err != nil {
			return nil, nil, err
		}
		end, err := src.addRow(r.HashIDs)
		if err != nil {
			return nil, nil, err
		}
		src.ends = append(src.ends, rowEnd{end, *r.InputLength - (len(r.HashIDs)-1)*B})
	}
	if src.withIDs == 0 {
		return nil, nil, errors.New("no row has hash_ids to learn prefixes from")
	}
	return src, stamps, nil
}

// addRow counts a row's visit to each node of its prefixes, creating the
// nodes it is the first to reach, and returns the node it ends on.
func (s *sourceTrie) addRow(ids []int64) (int32, error) {
	s.withIDs++
	p := int32(-1)
	for _, h := range ids {
		e := sourceEdge{int64(p), h}
		id, ok := s.intern[e]
		if !ok {
			if len(s.parent) == math.MaxInt32 {
				return 0, errors.New("trace has too many distinct prefixes")
			}
			id = int32(len(s.parent))
			s.intern[e] = id
			s.parent = append(s.parent, p)
			s.visited = append(s.visited, 0)
		}
		s.visited[id]++
		p = id
	}
	return p, nil
}

// chains is the source trie after chain merging, by source node.
type chains struct {
	length   []int   // blocks of the merged node that ends at a node
	up       []int32 // parent after merging
	absorbed []bool  // merged into a node further down
}

// mergeChains merges the chains of nodes that every visitor crosses
// together. A head is a node with one child whose parent has a different
// visit count; it absorbs successors with its own count. The merged node
// keeps the last node's id, children and end count; its ids are
// consecutive because the first row through the head created them one
// after another.
func (s *sourceTrie) mergeChains() chains {
	K := len(s.parent)
	// Children in id order (= order of first appearance).
	nChild := make([]int32, K)
	onlyChild := make([]int32, K) // meaningful when nChild == 1
	for id := range K {
		if p := s.parent[id]; p >= 0 {
			nChild[p]++
			onlyChild[p] = int32(id)
		}
	}
	ch := chains{length: make([]int, K), up: make([]int32, K), absorbed: make([]bool, K)}
	for id := range K {
		ch.length[id] = 1
		ch.up[id] = s.parent[id]
	}
	for id := range K {
		p := s.parent[id]
		if nChild[id] != 1 || (p >= 0 && s.visited[p] == s.visited[id]) {
			continue
		}
		cur, n := int32(id), 1
		for nChild[cur] == 1 && s.visited[onlyChild[cur]] == s.visited[id] {
			ch.absorbed[cur] = true
			cur = onlyChild[cur]
			n++
		}
		ch.length[cur] = n
		ch.up[cur] = p
	}
	return ch
}

// cutLeaves cuts the visited-once nodes (each now a whole unique suffix,
// ended by its one row) and keeps them as leaves of the shared node they
// hang from; it indexes the shared ones into m.nodes, with the last-block
// sizes of the rows that end on them, and returns that index by source
// node (-1 for nodes not kept).
func (m *trieModel) cutLeaves(src *sourceTrie, ch chains) []int32 {
	K := len(src.parent)
	lastAt := make([]int, K) // last-block size of the row ending at a node
	for _, e := range src.ends {
		lastAt[e.node] = e.last
	}
	idx := make([]int32, K) // trie node id → index in m.nodes
	m.nodes = append(m.nodes, trieNode{})
	for id := range K {
		switch {
		case ch.absorbed[id]:
			idx[id] = -1
		case src.visited[id] == 1:
			idx[id] = -1
			nd := &m.nodes[parentIndex(ch.up[id], idx)]
			nd.leaves = append(nd.leaves, leaf{blocks: ch.length[id], last: lastAt[id]})
		default:
			idx[id] = int32(len(m.nodes))
			m.nodes = append(m.nodes, trieNode{first: int64(id) - int64(ch.length[id]) + 1, length: ch.length[id]})
		}
	}
	for _, e := range src.ends {
		if i := idx[e.node]; i > 0 {
			m.nodes[i].endSizes = append(m.nodes[i].endSizes, e.last)
		}
	}
	return idx
}

// relabel scales the nodes' lengths by the prefix multiplier P. With P = 1
// the trie keeps the source's (normalised) ids; otherwise each node gets a
// fresh consecutive run of its new length, in node order.
func (m *trieModel) relabel(P float64) error {
	if P == 1 {
		return nil
	}
	var next int64
	for i := 1; i < len(m.nodes); i++ {
		nd := &m.nodes[i]
		L := math.RoundToEven(float64(nd.length) * P)
		if float64(next)+L >= idLimit {
			return fmt.Errorf("prefix_len_multiplier %v would push hash ids past %d", P, int64(idLimit))
		}
		nd.length = max(1, int(L))
		nd.first = next
		next += int64(nd.length)
	}
	m.idSpan = next
	return nil
}

// addTransitions gives every node its steps: children by visits, then
// leaf, then end.
func (m *trieModel) addTransitions(src *sourceTrie, ch chains, idx []int32) {
	for id := range src.parent {
		if i := idx[id]; i > 0 {
			m.nodes[parentIndex(ch.up[id], idx)].addStep(i, int64(src.visited[id]))
		}
	}
	for i := range m.nodes {
		nd := &m.nodes[i]
		nd.addStep(stepLeaf, int64(len(nd.leaves)))
		nd.addStep(stepEnd, int64(len(nd.endSizes)))
	}
}

// addStep appends a step of weight w. Zero weights are left out so they
// can never be drawn.
func (nd *trieNode) addStep(to int32, w int64) {
	if w <= 0 {
		return
	}
	cum := w
	if c := len(nd.cum); c > 0 {
		cum += nd.cum[c-1]
	}
	nd.next = append(nd.next, to)
	nd.cum = append(nd.cum, cum)
}

// orderLeaves sorts every node's end sizes and leaves, then scales the
// leaves' block counts by the prompt multiplier Q.
func (m *trieModel) orderLeaves(Q float64) error {
	for i := range m.nodes {
		nd := &m.nodes[i]
		slices.Sort(nd.endSizes)
		// Sorted before scaling, so the prompt multiplier cannot reorder
		// them and a draw picks the same source row whatever Q is.
		slices.SortFunc(nd.leaves, func(a, b leaf) int {
			return cmp.Or(cmp.Compare(a.blocks, b.blocks), cmp.Compare(a.last, b.last))
		})
		if Q == 1 {
			continue
		}
		for j := range nd.leaves {
			l := &nd.leaves[j]
			L := math.RoundToEven(float64(l.blocks) * Q)
			if L*float64(m.blockSize) > trace.MaxCount {
				return fmt.Errorf("prompt_len_multiplier %v makes a %.0f-block prompt", Q, L)
			}
			l.blocks = max(1, int(L))
		}
	}
	return nil
}

// learnTiming takes the rows per distinct timestamp and the gaps between
// the distinct timestamps in time order, and sorts the samples.
func (m *trieModel) learnTiming(stamps []float64) {
	slices.Sort(stamps)
	for i := 0; i < len(stamps); {
		j := i + 1
		for j < len(stamps) && stamps[j] == stamps[i] {
			j++
		}
		m.burstSizes = append(m.burstSizes, j-i)
		if j < len(stamps) {
			m.gaps = append(m.gaps, stamps[j]-stamps[i])
		}
		i = j
	}
	// Sorting makes the model depend on the multisets only, not row order.
	slices.Sort(m.burstSizes)
	slices.Sort(m.gaps)
	slices.Sort(m.outputs)
}

func parentIndex(p int32, idx []int32) int32 {
	if p < 0 {
		return 0
	}
	return idx[p]
}

// maxRejectStreak bounds the search for a request under MaxISL.
const maxRejectStreak = 1_000_000

// samplers are the seeded streams of the sampling loop, one per kind of
// draw.
type samplers struct {
	trie, counts, gaps, last, out, leaf *rand.Rand
}

func newSamplers(seed uint64) *samplers {
	return &samplers{
		trie:   rng.New(seed, StreamTrie),
		counts: rng.New(seed, StreamCounts),
		gaps:   rng.New(seed, StreamGaps),
		last:   rng.New(seed, StreamLastBlock),
		out:    rng.New(seed, StreamOutputLen),
		leaf:   rng.New(seed, StreamLeafLen),
	}
}

// generate runs the sampling loop.
func (m *trieModel) generate(n int, k Knobs) ([]trace.Record, int, error) {
	rs := newSamplers(k.Seed)
	B := m.blockSize
	out := make([]trace.Record, 0, n)
	fresh := m.idSpan // next unused id
	var offset int64  // added to the trie's ids in the current pass
	dropped, streak, slot := 0, 0, 0
	var walk []int32
	var elapsed float64 // source milliseconds since the first burst
	for len(out) < n {
		burst := pick(rs.counts, m.burstSizes)
		ts := math.Floor(elapsed / k.SpeedupRatio)
		for range burst {
			if slot > 0 && slot%m.passLen == 0 {
				// A new pass: the trie's ids move to an unused range.
				if float64(fresh)+float64(m.idSpan) >= idLimit {
					return nil, 0, fmt.Errorf("%d requests need hash ids past %d", n, int64(idLimit))
				}
				offset = fresh
				fresh += m.idSpan
			}
			slot++
			var blocks, tail, last int
			walk, blocks, tail, last = m.walk(rs, walk[:0])
			blocks += tail
			isl := (blocks-1)*B + last
			osl := int(float64(pick(rs.out, m.outputs)) * k.OutputLenMultiplier)
			if k.MaxISL > 0 && isl > k.MaxISL {
				dropped++
				if streak++; streak > maxRejectStreak {
					return nil, 0, fmt.Errorf("max_isl %d rejected %d sampled requests in a row; the trace has too few short requests", k.MaxISL, streak)
				}
				continue
			}
			streak = 0
			if k.MaxOSL > 0 {
				osl = min(osl, k.MaxOSL)
			}
			var ids []int64
			ids, fresh = m.requestIDs(walk, blocks, tail, offset, fresh)
			out = append(out, trace.Record{
				Timestamp:    trace.Ptr(ts),
				InputLength:  trace.Ptr(isl),
				OutputLength: trace.Ptr(max(1, osl)),
				HashIDs:      ids,
			})
			if len(out) == n {
				break
			}
		}
		if len(m.gaps) > 0 {
			elapsed += pick(rs.gaps, m.gaps)
		}
	}
	// Every generated row has ids, so each takes one draw. fresh is one
	// above the largest id handed out.
	if err := scatterPrefixRoots(out, fresh, k); err != nil {
		return nil, 0, err
	}
	return out, dropped, nil
}

// walk draws one request's path from the root, appending the shared nodes
// it crosses to walk. blocks counts their blocks; tail is the number of
// fresh blocks of the leaf it left by (0 when it stopped on a node), and
// last the size of the request's last block.
func (m *trieModel) walk(rs *samplers, walk []int32) (_ []int32, blocks, tail, last int) {
	for cur := int32(0); ; {
		nd := &m.nodes[cur]
		u := rs.trie.Int64N(nd.cum[len(nd.cum)-1])
		next := nd.next[sort.Search(len(nd.cum), func(i int) bool { return nd.cum[i] > u })]
		if next == stepLeaf {
			l := pick(rs.leaf, nd.leaves)
			return walk, blocks, l.blocks, l.last
		}
		if next == stepEnd {
			return walk, blocks, 0, pick(rs.last, nd.endSizes)
		}
		walk = append(walk, next)
		blocks += m.nodes[next].length
		cur = next
	}
}

// requestIDs spells a kept request's hash ids: the walked nodes' runs,
// moved by the pass's offset, then tail fresh ids from fresh on. It returns
// the next unused id too. Fresh ids go only to kept requests, so ids stay
// dense.
func (m *trieModel) requestIDs(walk []int32, blocks, tail int, offset, fresh int64) ([]int64, int64) {
	ids := make([]int64, 0, blocks)
	for _, i := range walk {
		nd := &m.nodes[i]
		for j := range int64(nd.length) {
			ids = append(ids, offset+nd.first+j)
		}
	}
	for range tail {
		ids = append(ids, fresh)
		fresh++
	}
	return ids, fresh
}

// pick draws one element of an empirical sample uniformly, which is the
// same as drawing from its empirical distribution.
func pick[T any](r *rand.Rand, sample []T) T {
	return sample[r.IntN(len(sample))]
}
