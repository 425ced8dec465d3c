package synth

import (
	"bytes"
	"fmt"
	"io"
	"strconv"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// Analysis is what `analyze` reports about a trace: the numbers of AIPerf's
// analyze-trace (AnalysisStats) and, in the five MetricStats, the table of
// Dynamo's datagen analyze. The definitions are those of §2 and §3 of the
// shared notes, trace-semantics.md.
type Analysis struct {
	BlockSize int // tokens per hash block; used for Context Length only

	TotalRequests  int
	UniquePrefixes int // distinct hash_ids[:i] over all rows and i ≥ 1
	PrefixGroups   int // distinct hash_ids[0] that start two rows or more

	// CacheHitRate is the exact mean of the per-request theoretical hit
	// rates (Python's statistics.mean); it can differ from HitRate.Mean,
	// numpy's float sum, in the last bit.
	CacheHitRate     float64
	PrefixReuseRatio float64
	// TokenHitRate is the share of all prompt tokens (rows with hash_ids)
	// an infinite prefix cache serves: cached tokens over prompt tokens,
	// as the exporter's hit rates are, so long prompts weigh more than in
	// CacheHitRate. A hit block is BlockSize tokens, bounded by the row's
	// input_length. Not in AIPerf's JSON.
	TokenHitRate float64
	// ReusingRows counts the rows that use a hash id after another chain
	// of blocks than where it first appeared (FirstReusingRow is the
	// first, 1-based among the rows): an engine's prefix cache keys a
	// block by its whole prefix, so it serves such a trace less than the
	// hit rates above, which count by id, say. ChainTokenHitRate is
	// TokenHitRate with blocks keyed so: what an engine's infinite cache
	// serves. On a prefix-consistent trace (Mooncake's) the two are
	// equal. Neither is in AIPerf's report.
	ReusingRows       int
	FirstReusingRow   int
	ChainTokenHitRate float64

	MinISL, MaxISL int
	AvgISL         float64
	MinOSL, MaxOSL int
	AvgOSL         float64

	// Each is nil when its list is empty. HitRate covers only rows with
	// hash_ids.
	ISL, OSL, ContextLength, UniquePromptLength, HitRate *MetricStats
}

// Analyzer computes an Analysis from rows given one at a time, so that a
// trace need not be held in memory as Records. Context Length depends on
// later rows too, so Add only keeps each row's lengths and ids compactly and
// Result does the work.
type Analyzer struct {
	blockSize int

	isl, osl []int
	idsEnd   []int   // ids of row r are ids[idsEnd[r-1]:idsEnd[r]]
	ids      []int64 // all rows' hash ids, concatenated
}

// NewAnalyzer returns an Analyzer using blockSize tokens per hash block for
// Context Length.
func NewAnalyzer(blockSize int) *Analyzer {
	return &Analyzer{blockSize: blockSize}
}

// Rows returns the number of rows added so far.
func (a *Analyzer) Rows() int { return len(a.isl) }

// Add adds the next row in file order.
func (a *Analyzer) Add(rec *trace.Record) {
	a.isl = append(a.isl, rec.ISL())
	a.osl = append(a.osl, rec.OSL())
	a.ids = append(a.ids, rec.HashIDs...)
	a.idsEnd = append(a.idsEnd, len(a.ids))
}

// rowIDs returns the ids of row r from a per-occurrence slice of a.ids.
func (a *Analyzer) rowIDs(all []int32, r int) []int32 {
	start := 0
	if r > 0 {
		start = a.idsEnd[r-1]
	}
	return all[start:a.idsEnd[r]]
}

// denseIDs numbers the distinct ids 0..u-1 and returns the number of every
// occurrence. This lets the analysis index slices instead of hashing: maps
// of a few hundred thousand keys cost a cache miss per access and made the
// analysis ten times slower than reading the trace. Mooncake traces number
// their blocks 0..N-1 already, and such ids are used as they are.
func (a *Analyzer) denseIDs() (idx []int32, u int) {
	idx = make([]int32, len(a.ids))
	maxID, dense := int64(-1), true
	for _, id := range a.ids {
		if id < 0 {
			dense = false
			break
		}
		maxID = max(maxID, id)
	}
	// Allow gaps, but keep the slices proportionate to the trace.
	if dense && maxID < 2*int64(len(a.ids))+1024 {
		for i, id := range a.ids {
			idx[i] = int32(id)
		}
		return idx, int(maxID + 1)
	}
	number := make(map[int64]int32)
	for i, id := range a.ids {
		v, ok := number[id]
		if !ok {
			v = int32(len(number))
			number[id] = v
		}
		idx[i] = v
	}
	return idx, len(number)
}

// trieEdge names a prefix-trie node by its parent node and its last id.
type trieEdge struct {
	parent int32 // -1 for the root
	id     int32
}

// posID is an id at a position of its row.
type posID struct {
	pos int32
	id  int32
}

// prefixTrie counts the rows through each distinct prefix ids[:i]. Node x
// < u is the first prefix seen ending in id x; in prefix-hash traces (each
// id always follows the same parent) that is every node. A prefix ending in
// an id already used under another parent gets a node ≥ u via a map.
type prefixTrie struct {
	parent []int32 // of node x < u; noParent until the node exists
	rows   []int32 // rows through each node
	extra  map[trieEdge]int32
	nodes  int     // distinct prefixes
	roots  []int32 // nodes of one-id prefixes
}

const noParent = -2

func newPrefixTrie(u int) *prefixTrie {
	t := &prefixTrie{parent: make([]int32, u), rows: make([]int32, u)}
	for i := range t.parent {
		t.parent[i] = noParent
	}
	return t
}

// addRow adds a row's prefixes. It returns whether the row uses an id
// after another parent than where the id first appeared, and how many of
// its leading prefixes earlier rows had: its hit in a cache keyed by
// prefixes, as an engine's is.
func (t *prefixTrie) addRow(ids []int32) (reuses bool, seen int) {
	parent := int32(-1)
	leading := true
	for _, x := range ids {
		node := x
		switch p := t.parent[x]; p {
		case parent:
		case noParent:
			t.parent[x] = parent
			t.newNode(parent, node)
		default:
			reuses = true
			if t.extra == nil {
				t.extra = make(map[trieEdge]int32)
			}
			e := trieEdge{parent, x}
			n, ok := t.extra[e]
			if !ok {
				n = int32(len(t.rows))
				t.rows = append(t.rows, 0)
				t.extra[e] = n
				t.newNode(parent, n)
			}
			node = n
		}
		// A row's prefixes all differ in length, so each node is counted
		// at most once per row, and one counted before was in an earlier
		// row.
		leading = leading && t.rows[node] > 0
		if leading {
			seen++
		}
		t.rows[node]++
		parent = node
	}
	return reuses, seen
}

func (t *prefixTrie) newNode(parent, node int32) {
	t.nodes++
	if parent < 0 {
		t.roots = append(t.roots, node)
	}
}

// pairCounter counts occurrences of (position, id) pairs up to 2. Like the
// trie it keeps the first position of each id in slices and any other
// position of the same id in a map.
type pairCounter struct {
	pos   []int32 // first position of id x, -1 until seen
	count []uint8
	extra map[posID]uint8
}

func newPairCounter(u int) *pairCounter {
	c := &pairCounter{pos: make([]int32, u), count: make([]uint8, u)}
	for i := range c.pos {
		c.pos[i] = -1
	}
	return c
}

func (c *pairCounter) add(pos int32, x int32) {
	switch c.pos[x] {
	case pos:
		c.count[x] = min(c.count[x]+1, 2)
	case -1:
		c.pos[x], c.count[x] = pos, 1
	default:
		if c.extra == nil {
			c.extra = make(map[posID]uint8)
		}
		k := posID{pos, x}
		c.extra[k] = min(c.extra[k]+1, 2)
	}
}

func (c *pairCounter) repeated(pos int32, x int32) bool {
	if c.pos[x] == pos {
		return c.count[x] > 1
	}
	return c.extra[posID{pos, x}] > 1
}

// Result computes the analysis of the rows added so far.
func (a *Analyzer) Result() Analysis {
	idx, u := a.denseIDs()
	sc := a.scanPrefixes(idx, u)
	an := Analysis{
		BlockSize:      a.blockSize,
		TotalRequests:  len(a.isl),
		UniquePrefixes: sc.trie.nodes,
		CacheHitRate:   ExactMean(sc.hits),
	}
	if sc.promptTokens > 0 {
		an.TokenHitRate = divide(sc.hitTokens, sc.promptTokens)
		an.ChainTokenHitRate = divide(sc.chainHitTokens, sc.promptTokens)
	}
	an.ReusingRows, an.FirstReusingRow = sc.reusingRows, sc.firstReusingRow
	an.PrefixGroups, an.PrefixReuseRatio = sc.trie.reuse()
	a.addLengths(&an, idx, sc.pairs)
	an.HitRate = ComputeStats(sc.hits)
	return an
}

// prefixScan is what the first pass over the rows learns: the prefixes and
// (position, id) pairs they share, and the theoretical hit rates. Context
// Length needs the pair counts of the whole trace, so it takes a second
// pass (addLengths).
type prefixScan struct {
	trie                    *prefixTrie
	pairs                   *pairCounter
	hits                    []float64 // one per row with ids, in file order
	hitTokens, promptTokens int64
	chainHitTokens          int64 // hitTokens in a cache keyed by prefixes
	reusingRows             int   // rows using an id after another parent
	firstReusingRow         int   // 1-based; 0 when none
}

// scanPrefixes feeds every row with ids, in file order, to the prefix trie,
// the pair counter and an infinite cache.
func (a *Analyzer) scanPrefixes(idx []int32, u int) *prefixScan {
	sc := &prefixScan{trie: newPrefixTrie(u), pairs: newPairCounter(u)}
	seen := make([]bool, u) // the infinite cache of the theoretical hit rate
	for r := range len(a.isl) {
		ids := a.rowIDs(idx, r)
		if len(ids) == 0 {
			continue
		}
		reuses, chainHit := sc.trie.addRow(ids)
		if reuses {
			sc.reusingRows++
			if sc.firstReusingRow == 0 {
				sc.firstReusingRow = r + 1
			}
		}
		sc.chainHitTokens += int64(min(chainHit*a.blockSize, a.isl[r]))
		for pos, x := range ids {
			sc.pairs.add(int32(pos), x)
		}
		// The leading run of ids already cached, before this row's ids
		// enter the cache.
		k := 0
		for k < len(ids) && seen[ids[k]] {
			k++
		}
		sc.hits = append(sc.hits, float64(k)/float64(len(ids)))
		sc.hitTokens += int64(min(k*a.blockSize, a.isl[r]))
		sc.promptTokens += int64(a.isl[r])
		for _, x := range ids[k:] {
			seen[x] = true
		}
	}
	return sc
}

// reuse returns the number of prefix groups (one-id prefixes that start two
// rows or more) and the share of prefix occurrences whose prefix recurs.
func (t *prefixTrie) reuse() (groups int, ratio float64) {
	for _, node := range t.roots {
		if t.rows[node] > 1 {
			groups++
		}
	}
	var reused, total int64
	for _, c := range t.rows {
		total += int64(c)
		if c > 1 {
			reused += int64(c)
		}
	}
	if total > 0 {
		ratio = divide(reused, total)
	}
	return groups, ratio
}

// contextLength is row r's Context Length: its blocks whose (position, id)
// recurs elsewhere in the trace, in tokens.
func (a *Analyzer) contextLength(ids []int32, pairs *pairCounter, r int) int {
	if len(ids) == 0 {
		return 0
	}
	repeated := 0
	for pos, x := range ids {
		if pairs.repeated(int32(pos), x) {
			repeated++
		}
	}
	// A row whose every block recurs elsewhere counts its exact length,
	// partial last block included.
	if repeated == len(ids) {
		return a.isl[r]
	}
	return repeated * a.blockSize
}

// addLengths sets the input, output, context and unique prompt lengths of
// an: their extremes, means and distributions.
func (a *Analyzer) addLengths(an *Analysis, idx []int32, pairs *pairCounter) {
	n := len(a.isl)
	isl := make([]float64, n)
	osl := make([]float64, n)
	ctx := make([]float64, n)
	uniq := make([]float64, n)
	var islSum, oslSum int64
	for r := range n {
		context := a.contextLength(a.rowIDs(idx, r), pairs, r)
		isl[r] = float64(a.isl[r])
		osl[r] = float64(a.osl[r])
		ctx[r] = float64(context)
		uniq[r] = float64(a.isl[r] - context)
		islSum += int64(a.isl[r])
		oslSum += int64(a.osl[r])
		if r == 0 || a.isl[r] < an.MinISL {
			an.MinISL = a.isl[r]
		}
		if r == 0 || a.isl[r] > an.MaxISL {
			an.MaxISL = a.isl[r]
		}
		if r == 0 || a.osl[r] < an.MinOSL {
			an.MinOSL = a.osl[r]
		}
		if r == 0 || a.osl[r] > an.MaxOSL {
			an.MaxOSL = a.osl[r]
		}
	}
	if n > 0 {
		an.AvgISL = divide(islSum, int64(n))
		an.AvgOSL = divide(oslSum, int64(n))
	}
	an.ISL = ComputeStats(isl)
	an.OSL = ComputeStats(osl)
	an.ContextLength = ComputeStats(ctx)
	an.UniquePromptLength = ComputeStats(uniq)
}

// Analyze analyses records in order with blockSize tokens per hash block.
func Analyze(records []trace.Record, blockSize int) Analysis {
	a := NewAnalyzer(blockSize)
	for i := range records {
		a.Add(&records[i])
	}
	return a.Result()
}

// statRows are the table's rows in the reference tools' order.
func (an *Analysis) statRows() []struct {
	name  string
	stats *MetricStats
} {
	return []struct {
		name  string
		stats *MetricStats
	}{
		{"Input Length", an.ISL},
		{"Context Length", an.ContextLength},
		{"Unique Prompt Length", an.UniquePromptLength},
		{"Output Length", an.OSL},
		{"Theoretical Hit Rates", an.HitRate},
	}
}

// WriteTable writes the human-readable report: AIPerf's header lines, the
// two ratios AIPerf keeps for its JSON, and Dynamo's table with every number
// in full precision (Python repr), so that it can be compared digit for
// digit with either tool.
func (an *Analysis) WriteTable(w io.Writer) error {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "Trace Analysis Report\n")
	fmt.Fprintf(&buf, "Total requests:      %s\n", groupThousands(an.TotalRequests))
	fmt.Fprintf(&buf, "Unique prefixes:     %s\n", groupThousands(an.UniquePrefixes))
	fmt.Fprintf(&buf, "Prefix groups:       %s\n", groupThousands(an.PrefixGroups))
	fmt.Fprintf(&buf, "Cache hit rate:      %s\n", FormatPyFloat(an.CacheHitRate))
	fmt.Fprintf(&buf, "Prefix reuse ratio:  %s\n", FormatPyFloat(an.PrefixReuseRatio))
	fmt.Fprintf(&buf, "Token hit rate:      %s\n", FormatPyFloat(an.TokenHitRate))
	fmt.Fprintf(&buf, "Block size:          %d\n", an.BlockSize)
	fmt.Fprintf(&buf, "\nTrace Statistics\n")

	// Names align left and numbers right, two spaces apart.
	header := []string{"Metric", "Mean", "Std Dev", "Min", "P25", "Median", "P75", "Max"}
	cells := [][]string{header}
	for _, r := range an.statRows() {
		row := []string{r.name}
		if r.stats == nil {
			for range 7 {
				row = append(row, "N/A")
			}
		} else {
			s := r.stats
			for _, v := range []float64{s.Mean, s.StdDev, s.Min, s.P25, s.Median, s.P75, s.Max} {
				row = append(row, FormatPyFloat(v))
			}
		}
		cells = append(cells, row)
	}
	// Every number column is as wide as the widest number, so that a
	// column of short numbers (Min) does not hug the column before it.
	width := make([]int, len(header))
	for _, row := range cells {
		for c, cell := range row {
			if c == 0 {
				width[0] = max(width[0], len(cell))
				continue
			}
			for n := 1; n < len(width); n++ {
				width[n] = max(width[n], len(cell))
			}
		}
	}
	for _, row := range cells {
		fmt.Fprintf(&buf, "%-*s", width[0], row[0])
		for c := 1; c < len(row); c++ {
			fmt.Fprintf(&buf, "  %*s", width[c], row[c])
		}
		buf.WriteByte('\n')
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// groupThousands formats n like Python's "{:,}".
func groupThousands(n int) string {
	s := strconv.Itoa(n)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var b []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, c)
	}
	if neg {
		return "-" + string(b)
	}
	return string(b)
}

// AppendJSON appends the analysis as AIPerf's AnalysisStats JSON: the same
// keys in the same order, indented by two spaces, counts as integers, null
// for an empty list's stats, and every float in Python repr form, so that
// integral floats keep their ".0" as in AIPerf's file. (Only floats below
// 1e-4 or from 1e16 up, which these statistics do not reach in practice,
// might be spelled differently by pydantic: "1e-05" here.) A newline ends
// it.
func (an *Analysis) AppendJSON(b []byte) []byte {
	b = append(b, "{\n"...)
	intField := func(key string, v int) {
		b = fmt.Appendf(b, "  %q: %d,\n", key, v)
	}
	floatField := func(key string, v float64) {
		b = fmt.Appendf(b, "  %q: ", key)
		b = AppendPyFloat(b, v)
		b = append(b, ",\n"...)
	}
	intField("total_requests", an.TotalRequests)
	intField("unique_prefixes", an.UniquePrefixes)
	intField("num_prefix_groups", an.PrefixGroups)
	floatField("cache_hit_rate", an.CacheHitRate)
	intField("min_isl", an.MinISL)
	intField("max_isl", an.MaxISL)
	floatField("avg_isl", an.AvgISL)
	intField("min_osl", an.MinOSL)
	intField("max_osl", an.MaxOSL)
	floatField("avg_osl", an.AvgOSL)
	floatField("prefix_reuse_ratio", an.PrefixReuseRatio)
	stats := []struct {
		key string
		s   *MetricStats
	}{
		{"isl_stats", an.ISL},
		{"osl_stats", an.OSL},
		{"context_length_stats", an.ContextLength},
		{"unique_prompt_length_stats", an.UniquePromptLength},
		{"hit_rate_stats", an.HitRate},
	}
	for i, st := range stats {
		b = fmt.Appendf(b, "  %q: ", st.key)
		if st.s == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, "{\n"...)
			for j, f := range []struct {
				key string
				v   float64
			}{
				{"mean", st.s.Mean}, {"std_dev", st.s.StdDev}, {"min", st.s.Min},
				{"p25", st.s.P25}, {"median", st.s.Median}, {"p75", st.s.P75}, {"max", st.s.Max},
			} {
				b = fmt.Appendf(b, "    %q: ", f.key)
				b = AppendPyFloat(b, f.v)
				if j < 6 {
					b = append(b, ',')
				}
				b = append(b, '\n')
			}
			b = append(b, "  }"...)
		}
		if i < len(stats)-1 {
			b = append(b, ',')
		}
		b = append(b, '\n')
	}
	return append(b, "}\n"...)
}
