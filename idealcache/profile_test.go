package idealcache

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// mooncakeRow is what the profile's tests read of a Mooncake trace's row.
type mooncakeRow struct {
	InputLength int     `json:"input_length"`
	HashIDs     []int64 `json:"hash_ids"`
}

// readMooncakeRows reads the first n rows of a Mooncake trace of the
// repository's testdata, in file order.
func readMooncakeRows(t testing.TB, name string, n int) []mooncakeRow {
	t.Helper()
	f, err := os.Open("../testdata/mooncake/" + name)
	if err != nil {
		t.Fatalf("the Mooncake traces are missing from testdata/mooncake: %v", err)
	}
	defer f.Close()
	var rows []mooncakeRow
	lines := bufio.NewScanner(f)
	lines.Buffer(nil, 1<<24)
	for len(rows) < n && lines.Scan() {
		var r mooncakeRow
		if err := json.Unmarshal(lines.Bytes(), &r); err != nil {
			t.Fatalf("%s row %d: %v", name, len(rows)+1, err)
		}
		rows = append(rows, r)
	}
	if err := lines.Err(); err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	return rows
}

// TestCapacityProfileBoundedWhateverBlockSize: fed fresh prompts of 8k
// tokens, the default ceiling's tokens and more, the profile's stack holds at
// most ProfileMaxBlocks blocks, and its heap stays under their bound in
// bytes, whatever the trace block size: the tokens a block holds do not
// decide its memory.
func TestCapacityProfileBoundedWhateverBlockSize(t *testing.T) {
	const prompt = 8192
	for _, traceBlock := range []int{1, 16, 512} {
		t.Run(fmt.Sprintf("block %d", traceBlock), func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			c := NewCache(Params{TraceBlock: traceBlock, ServerBlock: 16, Granularity: engine.GranularityBlock})
			cp := NewProfile(c)
			perRow := (prompt + traceBlock - 1) / traceBlock
			ids := make([]int64, perRow)
			var keys []uint64
			most := 0
			for row := range DefaultCeilingTokens/prompt + 64 {
				for i := range ids {
					ids[i] = int64(row*perRow + i)
				}
				keys = AppendChainKeys(keys[:0], ids)
				cp.Visit(1, keys, prompt, true, false, true)
				most = max(most, cp.stack.Len())
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			t.Logf("at most %d blocks held, scale %d, heap %.1f MB (%.0f bytes a block of the bound)",
				most, cp.stack.Scale(), float64(heap)/1e6, float64(heap)/ProfileMaxBlocks)
			if most > ProfileMaxBlocks {
				t.Errorf("held %d blocks, over the bound of %d", most, ProfileMaxBlocks)
			}
			if heap > ProfileMaxBlocks*ProfileBlockBytes {
				t.Errorf("heap %d bytes, over the bound's %d", heap, ProfileMaxBlocks*ProfileBlockBytes)
			}
			runtime.KeepAlive(cp)
		})
	}
}

// TestCapacityProfileSampled: the profiles of a sampled stack, added up
// over the requests as the effective capacity adds them, are within 0.015
// of the exact profiles' hit rate at every capacity of at least twice
// what a sampled block stands for (0.0116 measured, the sample reading
// high: of the blocks after the last one found, half count, and on this
// trace fewer are held). The trace is the shared conversation
// trace's first 6,000 rows cut into 64-token blocks (8 a trace block,
// prefix-consistent as the trace is), whose profile would follow some
// 500k blocks; the sample holds 2¹⁶.
func TestCapacityProfileSampled(t *testing.T) {
	const parts, block = 8, 512 / 8
	recs := readMooncakeRows(t, "conversation_trace.jsonl", 6000)
	c := NewCache(Params{TraceBlock: block, ServerBlock: 16, Granularity: engine.GranularityBlock})
	exact, sampled := NewProfile(c), NewProfile(c)
	exact.stack = NewStack[BlockKey](exact.ceiling, exact.maxKeys)
	sampled.stack = NewStack[BlockKey](sampled.ceiling, sampled.maxKeys)
	sampled.stack.Sample(1<<16, func(k BlockKey) uint64 { return SampleHash(k.NS, k.Chain) })
	var capacities []int64 // tokens, two a doubling
	for capacity := int64(1024); capacity <= DefaultCeilingTokens; capacity = capacity * 3 / 2 {
		capacities = append(capacities, capacity)
	}
	exactHits, sampledHits := make([]int64, len(capacities)), make([]int64, len(capacities))
	var prompt int64
	var ids []int64
	var keys []uint64
	for _, r := range recs {
		isl := r.InputLength
		ids = ids[:0]
		for _, id := range r.HashIDs {
			for j := range int64(parts) {
				ids = append(ids, id*parts+j)
			}
		}
		ids = ids[:min(len(ids), (isl+block-1)/block)]
		keys = AppendChainKeys(keys[:0], ids)
		pe := exact.Visit(1, keys, isl, true, false, true)
		ps := sampled.Visit(1, keys, isl, true, false, true)
		prompt += int64(isl)
		for i, capacity := range capacities {
			exactHits[i] += int64(pe.At(capacity))
			sampledHits[i] += int64(ps.At(capacity))
		}
	}
	scale := sampled.stack.Scale()
	if scale < 8 || exact.stack.Scale() != 1 {
		t.Fatalf("scales %d and %d: the case does not sample, or the exact stack did", scale, exact.stack.Scale())
	}
	from := 2 * scale * block
	worst := 0.0
	for i, capacity := range capacities {
		if capacity < from {
			continue
		}
		e, s := float64(exactHits[i])/float64(prompt), float64(sampledHits[i])/float64(prompt)
		worst = max(worst, math.Abs(s-e))
		if math.Abs(s-e) > 0.015 {
			t.Errorf("capacity %d tokens: hit rate %.4f sampled, %.4f exact", capacity, s, e)
		}
	}
	t.Logf("one block in %d: from %d tokens on, the hit rate is at most %.4f from the exact one", scale, from, worst)
}
