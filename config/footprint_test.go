package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// unitCosts prices each structure at a distinct power of two, so that a
// total tells which terms it holds.
var unitCosts = MemoryCosts{
	Process: 1 << 20, TraceRow: 10, TraceID: 1, SynthesizedRow: 20, SynthesizedID: 4, PromptCache: 1 << 40, PromptToken: 2,
	ModelBlock: 100, ProfileBlock: 1000, InFlight: 10000, InFlightToken: 3, EmulatedBodyToken: 1, EmulatedToken: 5, EmulatorEncoders: 1,
	EmulatorBlock: 7, EmulatorToken: 3, KVEventStream: 1 << 30, ChainReuseSpanID: 1 << 11, ChainReuseID: 1 << 12, QueuedSpan: 1 << 16,
}

func TestFootprint(t *testing.T) {
	const remote = "targets:\n  - {name: r, url: http://r:8000, model: m, cache: {block_size: 16, capacity_blocks: 65536}}\n"
	defaultProfile := int64(replay.DefaultModelCeilingTokens / 512)
	for _, tc := range []struct {
		name   string
		yaml   string
		traces map[string]TraceSize
		want   []FootprintItem // Path and Bytes compared, in order
		total  int64
	}{
		{
			name:   "trace against a remote target",
			yaml:   remote + "workloads:\n  - {name: w, trace: t.jsonl, targets: [r], max_in_flight: 8}\n",
			traces: map[string]TraceSize{"w": {Rows: 1000, IDs: 20000, Span: 30000}},
			want: []FootprintItem{
				{Path: "", Bytes: 1 << 20},
				// 20,000 ids of 512 tokens in the prompt cache.
				{Path: "workloads[0]", Bytes: 1000*10 + 20000 + 20000*512*2},
				// 65536 blocks of 16 tokens are 2048 trace blocks of 512;
				// a prompt is 20 blocks of 512 tokens.
				{Path: "workloads[0].targets[0]", Bytes: 2048*100 + defaultProfile*1000 + 8*(10000+10240*3)},
				// The chain-reuse check: a slice over the span.
				{Path: "workloads[0]", Bytes: 30000 << 11},
			},
		},
		{
			name:   "synthesis: a prefix multiplier doubles the ids",
			yaml:   remote + "workloads:\n  - {name: w, trace: t.jsonl, targets: [r], max_in_flight: 8, synthesis: {prefix_len_multiplier: 2}}\n",
			traces: map[string]TraceSize{"w": {Rows: 1000, IDs: 20000, Span: 30000}},
			want: []FootprintItem{
				{Path: "", Bytes: 1 << 20},
				// The file's rows, and the reshaped ones beside them.
				{Path: "workloads[0]", Bytes: 1000*10 + 20000 + 1000*20 + 40000*4 + 40000*512*2},
				{Path: "workloads[0].targets[0]", Bytes: 2048*100 + defaultProfile*1000 + 8*(10000+20480*3)},
				// The span stretched as the ids.
				{Path: "workloads[0]", Bytes: 60000 << 11},
			},
		},
		{
			name: "generated rows against an emulated engine with KV events",
			yaml: "targets:\n  - {name: e, emulate: {block_size: 64, capacity_blocks: 1000}, cache: {kv_events: [tcp://a:5557, tcp://b:5557]}}\n" +
				"workloads:\n  - name: g\n    targets: [e]\n    block_size: 16\n    max_in_flight: 2\n" +
				"    generate: {prefixes: 2, prefix_tokens: 160, requests: 10, input_tokens: {mean: 32}, output_tokens: {mean: 8}, rate: 1}\n",
			want: []FootprintItem{
				{Path: "", Bytes: 1 << 20},
				// 10 rows of 192 tokens in 16-token blocks: 12 ids each,
				// counted as 192/16 + 1.
				{Path: "workloads[0].generate", Bytes: 10*10 + 130 + 130*16*2},
				// 1000 blocks of 64 tokens are 4000 trace blocks of 16;
				// a prompt of 13 blocks, tokenized by the emulated engine.
				// The profile's 2M blocks of 16 tokens are sampled down
				// to its bound.
				{Path: "workloads[0].targets[0]", Bytes: 4000*100 + replay.ProfileMaxBlocks*1000 + 2*(10000+208*(3+1)) + 1*208*5},
				// The span: 2 prefixes of 10 blocks, then the 130 ids.
				{Path: "workloads[0].generate", Bytes: (2*10 + 130) << 11},
				{Path: "targets[0].emulate", Bytes: 1000 * (7 + 64*3)},
				{Path: "targets[0].cache.kv_events", Bytes: 2 << 30},
			},
		},
		{
			name:   "an unbounded emulated cache",
			yaml:   "targets:\n  - {name: e, emulate: {block_size: 16}}\nworkloads:\n  - {name: w, trace: t.jsonl, targets: [e], max_in_flight: 1, loop: once}\n",
			traces: map[string]TraceSize{"w": {Rows: 10, IDs: 30}},
			want: []FootprintItem{
				{Path: "", Bytes: 1 << 20},
				{Path: "workloads[0]", Bytes: 10*10 + 30 + 30*512*2},
				// No capacity: the model holds the trace's blocks, once.
				{Path: "workloads[0].targets[0]", Bytes: 30*100 + defaultProfile*1000 + (10000 + 1536*(3+1)) + 1*1536*5},
				{Path: "targets[0].emulate.capacity_blocks", Bytes: 0},
			},
		},
		{
			name: "chain-reuse check of sparse ids in a map, the largest of two traces; tracing's span queue",
			yaml: remote + "tracing: {endpoint: http://c:4318/v1/traces}\nworkloads:\n" +
				"  - {name: a, trace: a.jsonl, targets: [r], max_in_flight: 1}\n  - {name: b, trace: b.jsonl, targets: [r], max_in_flight: 1}\n",
			traces: map[string]TraceSize{"a": {Rows: 10, IDs: 30, Span: 1 << 40}, "b": {Rows: 10, IDs: 20, Span: 20}},
			want: []FootprintItem{
				{Path: "", Bytes: 1 << 20},
				{Path: "workloads[0]", Bytes: 10*10 + 30 + 30*512*2},
				{Path: "workloads[0].targets[0]", Bytes: 2048*100 + defaultProfile*1000 + (10000 + 1536*3)},
				{Path: "workloads[1]", Bytes: 10*10 + 20 + 20*512*2},
				{Path: "workloads[1].targets[0]", Bytes: 2048*100 + defaultProfile*1000 + (10000 + 1024*3)},
				// a's 30 ids in a map (30 << 12) outweigh b's span of 20
				// in a slice (20 << 11); one check runs at a time.
				{Path: "workloads[0]", Bytes: 30 << 12},
				// 2,048 spans queued and 512 being sent.
				{Path: "tracing", Bytes: 2560 << 16},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml), "")
			if err != nil {
				t.Fatal(err)
			}
			f := c.Footprint(unitCosts, tc.traces)
			if len(f.Items) != len(tc.want) {
				t.Fatalf("%d items, want %d:\n%v", len(f.Items), len(tc.want), f)
			}
			var total int64
			for i, w := range tc.want {
				got := f.Items[i]
				if got.Path != w.Path || got.Bytes != w.Bytes {
					t.Errorf("item %d: %s %d bytes, want %s %d bytes (%s)", i, got.Path, got.Bytes, w.Path, w.Bytes, got.What)
				}
				total += w.Bytes
			}
			if f.Total() != total {
				t.Errorf("total %d, want %d", f.Total(), total)
			}
		})
	}
}

func TestFootprintUnbounded(t *testing.T) {
	c, err := Parse([]byte("targets:\n  - {name: e, emulate: {block_size: 16}}\nworkloads:\n  - {name: w, trace: t.jsonl, targets: [e]}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(c.Footprint(unitCosts, nil).Unbounded(), " ")
	if want := "workloads[0].targets[0] targets[0].emulate.capacity_blocks"; got != want {
		t.Errorf("unbounded %q, want %q", got, want)
	}
}

func TestCheckMemory(t *testing.T) {
	c, err := Parse([]byte("targets:\n  - {name: e, emulate: {block_size: 64, capacity_blocks: 1000000}}\nworkloads:\n  - {name: w, trace: t.jsonl, targets: [e]}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	costs := unitCosts
	costs.ProfileBlock = 1 // the emulated cache is the largest part
	f := c.Footprint(costs, map[string]TraceSize{"w": {Rows: 10, IDs: 10}})
	for _, tc := range []struct {
		limit int64
		fails bool
	}{{0, false}, {f.Total(), false}, {f.Total() - 1, true}} {
		err := c.CheckMemory(f, tc.limit)
		if (err != nil) != tc.fails {
			t.Errorf("limit %d of %d: %v", tc.limit, f.Total(), err)
		}
		if err != nil && (!errors.Is(err, ErrOverMemoryLimit) || !strings.HasPrefix(err.Error(), "targets[0].emulate: ")) {
			t.Errorf("error does not name the emulated cache: %v", err)
		}
	}
}

func TestMeasureTrace(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     TraceSize
	}{
		{"empty", "", TraceSize{}},
		{"rows with ids", `{"timestamp": 0, "hash_ids": [1, 2, 3]}` + "\n" + `{"hash_ids":[4]}` + "\n", TraceSize{Rows: 2, IDs: 4, Span: 4}},
		{"blank lines and empty ids", "\n  \n" + `{"hash_ids": []}` + "\n" + `{"input_length": 5}`, TraceSize{Rows: 2}},
		{"ids before other keys", `{"hash_ids": [1,2], "output_length": 3}`, TraceSize{Rows: 1, IDs: 2, Span: 2}},
		{"the span over rows", `{"hash_ids": [7, 9]}` + "\n" + `{"hash_ids": [3]}` + "\n" + `{"hash_ids": [ 12 ]}`, TraceSize{Rows: 3, IDs: 4, Span: 10}},
		{"ids that do not parse are left out of the span", `{"hash_ids": [5, "x", 1.5, 6]}`, TraceSize{Rows: 1, IDs: 4, Span: 2}},
		{"the widest span", `{"hash_ids": [-9223372036854775808, 9223372036854775807]}`, TraceSize{Rows: 1, IDs: 2, Span: 1<<63 - 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := measureTrace(strings.NewReader(tc.in))
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzMeasureTrace(f *testing.F) {
	f.Add([]byte(`{"hash_ids": [1, 2, 3]}` + "\n"))
	f.Add([]byte(`{"hash_ids": [` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		size, err := measureTrace(strings.NewReader(string(data)))
		if err != nil {
			return
		}
		if lines := int64(strings.Count(string(data), "\n") + 1); size.Rows > lines || size.IDs < 0 || size.IDs > int64(len(data)) ||
			size.Span < 0 || size.Span > 0 && size.IDs == 0 {
			t.Fatalf("%+v from %d lines of %d bytes", size, lines, len(data))
		}
	})
}
