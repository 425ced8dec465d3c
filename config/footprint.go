package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// MemoryCosts are the resident bytes each structure that a configuration
// sizes costs the daemon, the garbage collector's headroom included (at
// the default GOGC a heap is resident about twice over): the one table the
// memory estimate (Footprint) multiplies out. The figures are fitted to
// measured peaks (docs/benchmarks.md, "Memory estimate"); when a
// structure's layout changes, re-measure there and change them here,
// nowhere else.
type MemoryCosts struct {
	// Process is the daemon with nothing to replay: the Go runtime, the
	// registry, the web server, the tokenizer tables.
	Process int64
	// TraceRow and TraceID are a row held and each hash id it holds: the
	// trace table's columns, the replay's plan and schedule entries.
	TraceRow int64
	TraceID  int64
	// SynthesizedRow and SynthesizedID are a row that synthesis reshaped
	// (any workloads[].synthesis key set), held beside the file's rows
	// while they are made, and each hash id it holds.
	SynthesizedRow int64
	SynthesizedID  int64
	// PromptCache is a workload's cache of prompt text at its bound, and
	// PromptToken a cached block's token while the cache is below it.
	PromptCache int64
	PromptToken int64
	// ModelBlock is a trace block held by the theoretical cache model
	// (index entry, LRU element, block record).
	ModelBlock int64
	// ProfileBlock is a trace block followed by the effective-capacity
	// profile (its stack-distance tracker), up to the model's ceiling and
	// at most replay.ProfileMaxBlocks.
	ProfileBlock int64
	// InFlight is a request in flight: its goroutine, connection and
	// buffers; InFlightToken each token of its prompt (text, body).
	// Against an emulated engine, EmulatedBodyToken is each prompt token
	// of a request's body the engine holds while the request waits, and
	// EmulatedToken each token of the prompts it decodes and tokenizes
	// at once, EmulatorEncoders of them (one per CPU).
	InFlight          int64
	InFlightToken     int64
	EmulatedBodyToken int64
	EmulatedToken     int64
	EmulatorEncoders  int64
	// EmulatorBlock and EmulatorToken are an emulated engine's cached
	// block: its node, and each token it keeps.
	EmulatorBlock int64
	EmulatorToken int64
	// KVEventStream is one KV-event stream at its bound of live and
	// removed blocks.
	KVEventStream int64
	// ChainReuseSpanID is each id of a trace's id span in the check for
	// ids reused after another chain (synth.ChainReuseOf), run at load
	// while the trace is held, where the span is dense enough for a
	// slice; ChainReuseID each hash id where it is not, in a map.
	ChainReuseSpanID int64
	ChainReuseID     int64
	// QueuedSpan is a span waiting for export, with its attributes
	// (tracing.MaxQueueSpans of them, and a batch being sent).
	QueuedSpan int64
}

// DefaultMemoryCosts are the costs measured on this release.
var DefaultMemoryCosts = MemoryCosts{
	Process:        40 << 20,
	TraceRow:       16,
	TraceID:        5,
	SynthesizedRow: 76,
	SynthesizedID:  1,
	PromptCache:    16 << 20, // lifecycle's 8 MiB bound, twice over
	PromptToken:    6,
	ModelBlock:     160,
	ProfileBlock:   160,
	InFlight:       64 << 10,
	InFlightToken:  16,
	// A body's JSON text: about 4 bytes a token, twice over.
	EmulatedBodyToken: 8,
	// tiktoken allocates about 5 MB to encode a 12,000-token prompt.
	EmulatedToken:    840,
	EmulatorEncoders: int64(runtime.GOMAXPROCS(0)),
	// The flat trie: 108 bytes a block and 3 a token (300 bytes a
	// 64-token block, emulate.TestTrieBytesPerBlock), twice over.
	EmulatorBlock: 216,
	EmulatorToken: 6,
	// 182 MiB of store with every bound reached, and 48 MiB of a message
	// being read and decoded (docs/reliability.md, the KV event rows).
	KVEventStream: 230 << 20,
	// 3.96 bytes an id of the span (idealcache.TestChainReuseBytesPerID);
	// a map entry of an id is 24 to 36 bytes as the map grows. Held only
	// while the check runs, and given back before the next trace is
	// read: no headroom.
	ChainReuseSpanID: 4,
	ChainReuseID:     36,
	// Under 2 KiB (tracing.TestExportQueueBound); the queue is a small
	// part of the heap, so no headroom is added.
	QueuedSpan: 2 << 10,
}

// TraceSize is what a trace holds: its rows and their hash ids, and the
// span of those ids (the largest less the smallest, plus one; 0 without
// ids).
type TraceSize struct {
	Rows, IDs, Span int64
}

// maxTraceLine bounds a line MeasureTrace reads; the trace reader
// refuses longer ones.
const maxTraceLine = 64 << 20

// MeasureTrace counts the rows (non-blank lines) of a JSON Lines trace
// and the hash ids they hold, without decoding them: a sizing for
// Footprint, not a check (the trace reader checks).
func MeasureTrace(path string) (TraceSize, error) {
	f, err := os.Open(path)
	if err != nil {
		return TraceSize{}, err
	}
	defer f.Close()
	return measureTrace(f)
}

func measureTrace(r io.Reader) (TraceSize, error) {
	var size TraceSize
	var ids idRange
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	key := []byte(`"hash_ids"`)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		size.Rows++
		i := bytes.Index(line, key)
		if i < 0 {
			continue
		}
		rest := line[i+len(key):]
		open := bytes.IndexByte(rest, '[')
		if open < 0 {
			continue
		}
		rest = rest[open+1:]
		if end := bytes.IndexByte(rest, ']'); end >= 0 {
			rest = rest[:end]
		}
		if len(bytes.TrimSpace(rest)) > 0 {
			size.IDs += int64(bytes.Count(rest, []byte{','})) + 1
			ids.addList(rest)
		}
	}
	size.Span = ids.span()
	if err := sc.Err(); err != nil {
		return size, fmt.Errorf("sizing the trace: %w", err)
	}
	return size, nil
}

// idRange is the smallest and the largest of the ids seen.
type idRange struct {
	lo, hi int64
	seen   bool
}

// addList adds the integers of a JSON array's body ("1, 2, 3"); what
// does not parse is left out (a sizing, not a check).
func (r *idRange) addList(list []byte) {
	for len(list) > 0 {
		field := list
		if i := bytes.IndexByte(list, ','); i >= 0 {
			field, list = list[:i], list[i+1:]
		} else {
			list = nil
		}
		id, err := strconv.ParseInt(string(bytes.TrimSpace(field)), 10, 64)
		if err != nil {
			continue
		}
		if !r.seen || id < r.lo {
			r.lo = id
		}
		if !r.seen || id > r.hi {
			r.hi = id
		}
		r.seen = true
	}
}

// span is hi − lo + 1, at most math.MaxInt64; 0 when no id was seen.
func (r *idRange) span() int64 {
	if !r.seen {
		return 0
	}
	return int64(min(uint64(r.hi)-uint64(r.lo), math.MaxInt64-1)) + 1
}

// FootprintItem is one part of a configuration's memory estimate.
type FootprintItem struct {
	Path  string // the YAML path that sizes it: "workloads[0]", "targets[1].emulate"
	What  string // what it holds, for people
	Bytes int64
	// Unbounded: the part grows with the input, without a bound from the
	// configuration; Bytes is then what it holds at the start.
	Unbounded bool
}

// Footprint is the memory a configuration needs at its bounds: the
// process, and each workload's rows, each (workload, target)'s models and
// requests in flight, each target's emulated engine and KV-event streams.
type Footprint struct {
	Items []FootprintItem
}

// Total is the sum of the items.
func (f Footprint) Total() int64 {
	var t int64
	for _, it := range f.Items {
		t += it.Bytes
	}
	return t
}

// Unbounded lists the paths of the items without a bound.
func (f Footprint) Unbounded() []string {
	var paths []string
	for _, it := range f.Items {
		if it.Unbounded {
			paths = append(paths, it.Path)
		}
	}
	return paths
}

// Largest is the path of the largest workload or target item, to name
// in a refusal.
func (f Footprint) Largest() string {
	best := FootprintItem{Path: "workloads"}
	for _, it := range f.Items {
		if it.Path != "" && it.Bytes > best.Bytes {
			best = it
		}
	}
	return best.Path
}

// Footprint estimates the memory c needs at its bounds, with costs per
// structure. traces gives each trace workload's size by name
// (MeasureTrace); a workload missing from it counts no rows.
func (c *Config) Footprint(costs MemoryCosts, traces map[string]TraceSize) Footprint {
	var f Footprint
	f.Items = append(f.Items, FootprintItem{What: "the process", Bytes: costs.Process})
	// The chain-reuse check runs at load, one trace at a time, and gives
	// its memory back: the largest counts.
	var reuse FootprintItem
	for i := range c.Workloads {
		w := &c.Workloads[i]
		p := fmt.Sprintf("workloads[%d]", i)
		size, rowsPath, what := traces[w.Name], p, "trace rows"
		if g := w.SharedPrefix(); g != nil {
			size = TraceSize{Rows: int64(g.Requests), IDs: int64(g.MeanIDs())}
			// The prefixes' ids are numbered first, drawn or not, then
			// the others in order of first use.
			size.Span = int64(g.Prefixes)*int64(g.PrefixTokens/max(g.BlockSize, 1)) + size.IDs
			rowsPath, what = p+".generate", "generated rows"
		}
		rowBytes := size.Rows*costs.TraceRow + size.IDs*costs.TraceID
		ids, span := size.IDs, size.Span
		if w.synthesized() {
			// A prefix multiplier stretches every shared prefix, a
			// prompt multiplier the rest: the ids scale with the larger,
			// and so does their span.
			stretch := max(w.Synthesis.PrefixLenMultiplier, w.Synthesis.PromptLenMultiplier, 1)
			ids, span = int64(float64(size.IDs)*stretch), int64(min(float64(size.Span)*stretch, 1<<62))
			rowBytes += size.Rows*costs.SynthesizedRow + ids*costs.SynthesizedID
			what = "rows reshaped by synthesis from " + what
		}
		if it := chainReuseFootprint(costs, TraceSize{Rows: size.Rows, IDs: ids, Span: span}, rowBytes); it.Bytes > reuse.Bytes {
			reuse = it
			reuse.Path = rowsPath
		}
		traceBlock := int64(max(w.BlockSize, 1))
		promptCache := min(costs.PromptCache, ids*traceBlock*costs.PromptToken)
		f.Items = append(f.Items, FootprintItem{
			Path:  rowsPath,
			What:  fmt.Sprintf("%d %s, %d hash ids, prompt-text cache of %s", size.Rows, what, ids, FormatBytes(promptCache)),
			Bytes: rowBytes + promptCache,
		})
		// A prompt's tokens, for what a request in flight holds: its
		// blocks, at most max_isl.
		var promptTokens int64
		if size.Rows > 0 {
			promptTokens = ids * traceBlock / size.Rows
		}
		if m := int64(w.Synthesis.MaxISL); m > 0 {
			promptTokens = min(promptTokens, m)
		}
		for j, name := range w.Targets {
			t, ok := c.Target(name)
			if !ok {
				continue
			}
			it := unitFootprint(costs, w, t, ids, promptTokens)
			it.Path = fmt.Sprintf("%s.targets[%d]", p, j)
			f.Items = append(f.Items, it)
		}
	}
	if reuse.Bytes > 0 {
		f.Items = append(f.Items, reuse)
	}
	if c.Tracing.Endpoint != "" {
		n := int64(tracing.MaxQueueSpans + tracing.MaxExportBatch)
		f.Items = append(f.Items, FootprintItem{Path: "tracing", What: fmt.Sprintf("%d spans waiting for export or being sent", n),
			Bytes: n * costs.QueuedSpan})
	}
	for i := range c.Targets {
		t := &c.Targets[i]
		p := fmt.Sprintf("targets[%d]", i)
		if e := t.Emulate; e != nil {
			f.Items = append(f.Items, emulatorFootprint(costs, e, p+".emulate"))
		}
		if n := int64(len(t.Cache.KVEvents)); n > 0 {
			f.Items = append(f.Items, FootprintItem{
				Path:  p + ".cache.kv_events",
				What:  fmt.Sprintf("%d KV-event streams at their bound of live blocks", n),
				Bytes: n * costs.KVEventStream,
			})
		}
	}
	return f
}

// chainReuseFootprint is the check for ids reused after another chain
// over a trace of size, held at load as rowBytes: a slice over the id
// span where that is at most half the table's bytes and a MiB (the
// table's bytes being about half of rowBytes, which are twice over), as
// synth.ChainReuseOf decides, else a map of the ids (at most as many
// distinct as held).
func chainReuseFootprint(costs MemoryCosts, size TraceSize, rowBytes int64) FootprintItem {
	if size.IDs == 0 {
		return FootprintItem{}
	}
	if size.Span <= rowBytes/4+1<<20 {
		return FootprintItem{What: fmt.Sprintf("the check for ids reused after another chain, at load: a slice over an id span of %d", size.Span),
			Bytes: size.Span * costs.ChainReuseSpanID}
	}
	return FootprintItem{What: fmt.Sprintf("the check for ids reused after another chain, at load: a map of up to %d ids", size.IDs),
		Bytes: size.IDs * costs.ChainReuseID}
}

// synthesized tells whether w's rows are reshaped by synthesis.
func (w *Workload) synthesized() bool {
	s := w.Synthesis
	return s.SpeedupRatio != 1 || s.PrefixLenMultiplier != 1 || s.PrefixRootMultiplier != 1 ||
		s.PromptLenMultiplier != 1 || s.OutputLenMultiplier != 1 || s.MaxISL != 0 || s.MaxOSL != 0
}

// unitFootprint is one (workload, target)'s theoretical cache model at
// its capacity, its effective-capacity profile at its ceiling, and its
// requests in flight.
func unitFootprint(costs MemoryCosts, w *Workload, t *Target, ids, promptTokens int64) FootprintItem {
	serverBlock, capacity := serverCache(t)
	traceBlock := int64(max(w.BlockSize, 1))
	// The model holds the capacity's tokens in trace blocks; without a
	// capacity, every block sent: the trace's once, more every pass of a
	// loop.
	modelBlocks, unbounded := ids, false
	switch {
	case capacity > 0:
		modelBlocks = max(capacity*serverBlock/traceBlock, 1)
	case w.Loop != replay.LoopOnce:
		unbounded = true
	}
	ceiling := t.Cache.ModelCeilingTokens
	if ceiling == 0 {
		ceiling = replay.DefaultModelCeilingTokens
	}
	ceiling = min(max(ceiling, 2*capacity*serverBlock), replay.MaxModelCeilingTokens)
	profileBlocks := min(ceiling/traceBlock, replay.ProfileMaxBlocks)
	inFlight := int64(w.MaxInFlight)
	perRequest := costs.InFlight + promptTokens*costs.InFlightToken
	var encoding int64
	if t.Emulate != nil {
		// Every request waits with its body; only a few are tokenized.
		perRequest += promptTokens * costs.EmulatedBodyToken
		encoding = min(inFlight, costs.EmulatorEncoders) * promptTokens * costs.EmulatedToken
	}
	return FootprintItem{
		What: fmt.Sprintf("target %s: model of %d blocks, capacity profile of %d blocks, %d requests in flight of %d prompt tokens",
			t.Name, modelBlocks, profileBlocks, inFlight, promptTokens),
		Bytes:     modelBlocks*costs.ModelBlock + profileBlocks*costs.ProfileBlock + inFlight*perRequest + encoding,
		Unbounded: unbounded,
	}
}

// serverCache is a target's KV block size and capacity in blocks, as far
// as the configuration tells them: an emulated engine's, or the cache
// keys', else vLLM's default block and a capacity as large as the
// model's default ceiling (an auto capacity is read from the engine,
// and may be larger).
func serverCache(t *Target) (block, capacity int64) {
	block, capacity = 16, replay.DefaultModelCeilingTokens/16
	if e := t.Emulate; e != nil {
		if e.BlockSize > 0 {
			block = int64(e.BlockSize)
		}
		capacity = int64(e.CapacityBlocks)
	}
	if !t.Cache.BlockSize.Auto() {
		block = int64(max(t.Cache.BlockSize.N, 1))
	}
	if !t.Cache.CapacityBlocks.Auto() {
		capacity = int64(t.Cache.CapacityBlocks.N)
	}
	return block, capacity
}

// emulatorFootprint is an emulated engine's prefix cache at its capacity.
func emulatorFootprint(costs MemoryCosts, e *Emulate, p string) FootprintItem {
	block := int64(e.BlockSize)
	if block <= 0 {
		block = 16 // the vLLM personality's default
	}
	if e.Engine == emulate.PersonalityLlamaCpp {
		tokens := int64(max(e.Slots, 1)*max(e.MaxModelLen, 0) + max(e.CacheRAMTokens, 0))
		return FootprintItem{Path: p, What: fmt.Sprintf("llama.cpp slots and host cache, %d tokens", tokens),
			Bytes: tokens * costs.EmulatorToken}
	}
	if e.CapacityBlocks <= 0 || e.DisablePrefixCache {
		return FootprintItem{Path: p + ".capacity_blocks", What: "an emulated cache without a capacity, which grows with every new prompt",
			Unbounded: !e.DisablePrefixCache}
	}
	n := int64(e.CapacityBlocks)
	return FootprintItem{
		Path:  p,
		What:  fmt.Sprintf("emulated cache of %d blocks of %d tokens", n, block),
		Bytes: n * (costs.EmulatorBlock + block*costs.EmulatorToken),
	}
}

// ErrOverMemoryLimit is a configuration whose estimate exceeds the
// memory limit.
var ErrOverMemoryLimit = errors.New("the configuration's memory estimate exceeds the memory limit")

// CheckMemory refuses f when its total exceeds limit bytes (0: no limit),
// naming the largest part's YAML path.
func (c *Config) CheckMemory(f Footprint, limit int64) error {
	if limit <= 0 || f.Total() <= limit {
		return nil
	}
	return c.KeyError(f.Largest(), fmt.Errorf("%w: %s needed at the configuration's bounds, the limit is %s (--memory.limit); the largest part is here",
		ErrOverMemoryLimit, FormatBytes(f.Total()), FormatBytes(limit)))
}

// FormatBytes is n in MiB or GiB, for people.
func FormatBytes(n int64) string {
	if n >= 10<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// EstimateFile loads the configuration at path and estimates its
// footprint with costs (Estimate).
func EstimateFile(path string, costs MemoryCosts) (*Config, Footprint, error) {
	c, err := Load(path)
	if err != nil {
		return nil, Footprint{}, err
	}
	f, err := c.Estimate(costs)
	if err != nil {
		return nil, Footprint{}, err
	}
	return c, f, nil
}

// Estimate is c's footprint with costs, sizing each trace by reading it
// (MeasureTrace): the start and every reload check the same figure.
func (c *Config) Estimate(costs MemoryCosts) (Footprint, error) {
	traces := map[string]TraceSize{}
	for i := range c.Workloads {
		w := &c.Workloads[i]
		if w.Trace == "" {
			continue
		}
		size, err := MeasureTrace(c.TracePath(w))
		if err != nil {
			return Footprint{}, c.TraceError(w, err)
		}
		traces[w.Name] = size
	}
	return c.Footprint(costs, traces), nil
}

// String is the estimate as a table: one line an item, then the total.
func (f Footprint) String() string {
	var b strings.Builder
	b.WriteString("memory at the configuration's bounds (estimate):\n")
	for _, it := range f.Items {
		path := it.Path
		if path == "" {
			path = "-"
		}
		size := FormatBytes(it.Bytes)
		if it.Unbounded {
			size = "unbounded"
		}
		fmt.Fprintf(&b, "  %-40s %12s  %s\n", path, size, it.What)
	}
	fmt.Fprintf(&b, "  %-40s %12s\n", "total", FormatBytes(f.Total()))
	return b.String()
}
