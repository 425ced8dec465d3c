package synth

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// WriteTable writes the curve for people: what was modelled, the capacities
// that reach 50, 90 and 99 % of the infinite-cache hit rate, then the curve.
func (c *CapacityCurve) WriteTable(w io.Writer) error {
	var buf bytes.Buffer
	tok := func(blocks int64) string { return groupThousands64(blocks * int64(c.ServerBlock)) }
	fmt.Fprintf(&buf, "Capacity curve: token hit rate by KV capacity, LRU in replay order\n")
	fmt.Fprintf(&buf, "Rows:                     %s\n", groupThousands(c.Rows))
	fmt.Fprintf(&buf, "Prompt tokens:            %s\n", groupThousands64(c.PromptTokens))
	fmt.Fprintf(&buf, "Trace block:              %d tokens\n", c.TraceBlock)
	fmt.Fprintf(&buf, "Server block:             %d tokens (hits in whole blocks, the last prompt token recomputed)\n", c.ServerBlock)
	fmt.Fprintf(&buf, "Distinct trace blocks:    %s\n", groupThousands(c.DistinctBlocks))
	fmt.Fprintf(&buf, "Footprint:                %s tokens (%s blocks): holds every block\n", tok(c.FootprintBlocks), groupThousands64(c.FootprintBlocks))
	fmt.Fprintf(&buf, "Largest capacity:         %s tokens\n", groupThousands64(c.MaxCapacity))
	fmt.Fprintf(&buf, "Infinite-cache hit rate:  %s (%s tokens): the curve's limit\n", percent(c.HitRate(c.InfiniteHitTokens)), groupThousands64(c.InfiniteHitTokens))
	if c.WeightChanges > 0 {
		fmt.Fprintf(&buf, "Weight changes:           %s (blocks used with another weight than at first: approximate)\n", groupThousands64(c.WeightChanges))
	}
	if c.SampleScale > 1 {
		fmt.Fprintf(&buf, "Sampled:                  1 block in %d, by a hash of the block (more blocks than the stack holds): the hits are an estimate\n", c.SampleScale)
	}
	if c.ReusingRows > 0 {
		fmt.Fprintf(&buf, "Rows reusing ids:         %s (a hash id after another chain of blocks than where it first came: another block to an engine, whose prefix cache keys a block by its whole prefix, as this curve does)\n", groupThousands(c.ReusingRows))
	}

	fmt.Fprintf(&buf, "\nKV capacity for a share of the infinite-cache hit rate (found within 0.1 %%)\n")
	cells := [][]string{{"Share", "Capacity (tokens)", "Blocks", "Hit rate"}}
	for _, t := range c.Targets {
		if !t.Reached {
			cells = append(cells, []string{fmt.Sprintf("%d %%", t.Percent), "not reached", "-", "-"})
			continue
		}
		cells = append(cells, []string{fmt.Sprintf("%d %%", t.Percent), tok(t.CapacityBlocks),
			groupThousands64(t.CapacityBlocks), percent(c.HitRate(t.HitTokens))})
	}
	writeCells(&buf, cells)

	fmt.Fprintf(&buf, "\nCurve\n")
	cells = [][]string{{"Capacity (tokens)", "Blocks", "Hit tokens", "Hit rate", "Of limit", ""}}
	end := c.EndBlocks()
	for _, p := range c.Points {
		note := ""
		switch {
		case p.Requested:
			note = "asked"
		case p.CapacityBlocks == end && end == c.FootprintBlocks:
			note = "footprint"
		case p.CapacityBlocks == end:
			note = "largest capacity"
		}
		cells = append(cells, []string{tok(p.CapacityBlocks), groupThousands64(p.CapacityBlocks),
			groupThousands64(p.HitTokens), percent(c.HitRate(p.HitTokens)), percent(c.ShareOfLimit(p.HitTokens)), note})
	}
	writeCells(&buf, cells)
	_, err := w.Write(buf.Bytes())
	return err
}

// writeCells writes rows of cells two spaces apart, right-aligned but for
// a column with no header (notes), with no space at the end.
func writeCells(buf *bytes.Buffer, cells [][]string) {
	width := make([]int, len(cells[0]))
	for _, row := range cells {
		for i, cell := range row {
			width[i] = max(width[i], len([]rune(cell)))
		}
	}
	for _, row := range cells {
		var line bytes.Buffer
		for i, cell := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			if cells[0][i] == "" {
				fmt.Fprintf(&line, "%-*s", width[i], cell)
			} else {
				fmt.Fprintf(&line, "%*s", width[i], cell)
			}
		}
		buf.Write(bytes.TrimRight(line.Bytes(), " "))
		buf.WriteByte('\n')
	}
}

func percent(f float64) string { return fmt.Sprintf("%.2f %%", 100*f) }

func groupThousands64(n int64) string { return groupThousands(int(n)) }

// curveJSON is the JSON form of a curve; its keys are the interface, in
// this order (docs/tools.md).
type curveJSON struct {
	TraceBlockTokens    int             `json:"trace_block_tokens"`
	ServerBlockTokens   int             `json:"server_block_tokens"`
	Granularity         string          `json:"granularity"`
	Rows                int             `json:"rows"`
	PromptTokens        int64           `json:"prompt_tokens"`
	DistinctTraceBlocks int             `json:"distinct_trace_blocks"`
	FootprintTokens     int64           `json:"footprint_tokens"`
	FootprintBlocks     int64           `json:"footprint_blocks"`
	MaxCapacityTokens   int64           `json:"max_capacity_tokens"`
	EndTokens           int64           `json:"end_tokens"`
	InfiniteHitTokens   int64           `json:"infinite_hit_tokens"`
	InfiniteHitRate     float64         `json:"infinite_hit_rate"`
	WeightChanges       int64           `json:"weight_changes"`
	RowsReusingIDs      int             `json:"rows_reusing_ids"`
	SampleScale         int64           `json:"sample_scale,omitempty"`
	Targets             []curveTargetJS `json:"targets"`
	Points              []curvePointJS  `json:"points"`
}

type curveTargetJS struct {
	Percent        int      `json:"percent"`
	CapacityTokens *int64   `json:"capacity_tokens"`
	CapacityBlocks *int64   `json:"capacity_blocks"`
	BelowTokens    *int64   `json:"below_tokens"`
	HitTokens      *int64   `json:"hit_tokens"`
	HitRate        *float64 `json:"hit_rate"`
}

type curvePointJS struct {
	CapacityTokens int64   `json:"capacity_tokens"`
	CapacityBlocks int64   `json:"capacity_blocks"`
	HitTokens      int64   `json:"hit_tokens"`
	HitRate        float64 `json:"hit_rate"`
	ShareOfLimit   float64 `json:"share_of_limit"`
	Requested      bool    `json:"requested"`
}

// AppendJSON appends the curve as JSON, indented by two spaces, with a
// newline at the end. A target not reached has null numbers.
func (c *CapacityCurve) AppendJSON(b []byte) []byte {
	s := int64(c.ServerBlock)
	v := curveJSON{
		TraceBlockTokens: c.TraceBlock, ServerBlockTokens: c.ServerBlock, Granularity: "block",
		Rows: c.Rows, PromptTokens: c.PromptTokens, DistinctTraceBlocks: c.DistinctBlocks,
		FootprintTokens: c.FootprintBlocks * s, FootprintBlocks: c.FootprintBlocks,
		MaxCapacityTokens: c.MaxCapacity, EndTokens: c.EndBlocks() * s,
		InfiniteHitTokens: c.InfiniteHitTokens, InfiniteHitRate: c.HitRate(c.InfiniteHitTokens),
		WeightChanges: c.WeightChanges, RowsReusingIDs: c.ReusingRows,
		Targets: []curveTargetJS{}, Points: []curvePointJS{},
	}
	if c.SampleScale > 1 {
		v.SampleScale = c.SampleScale
	}
	for _, t := range c.Targets {
		js := curveTargetJS{Percent: t.Percent}
		if t.Reached {
			tokens, below, rate := t.CapacityBlocks*s, t.BelowBlocks*s, c.HitRate(t.HitTokens)
			js.CapacityTokens, js.CapacityBlocks, js.BelowTokens = &tokens, &t.CapacityBlocks, &below
			js.HitTokens, js.HitRate = &t.HitTokens, &rate
		}
		v.Targets = append(v.Targets, js)
	}
	for _, p := range c.Points {
		v.Points = append(v.Points, curvePointJS{
			CapacityTokens: p.CapacityBlocks * s, CapacityBlocks: p.CapacityBlocks, HitTokens: p.HitTokens,
			HitRate: c.HitRate(p.HitTokens), ShareOfLimit: c.ShareOfLimit(p.HitTokens), Requested: p.Requested,
		})
	}
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err) // plain numbers, strings and slices always marshal
	}
	b = append(b, js...)
	return append(b, '\n')
}
