package cli

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// defaultMaxCapacity is synth.DefaultMaxCapacity as the flag shows it.
const defaultMaxCapacity = "256M"

// curveOptions are analyze's --capacity-curve and the flags that go with it.
type curveOptions struct {
	enabled     bool
	serverBlock int
	capacities  string // token counts, comma-separated
	maxCapacity string // a token count
	plot        string // SVG file to draw the curve in

	// which of the flags below were given, for a helpful error when
	// --capacity-curve was not
	setServerBlock, setCapacities, setMaxCapacity, setPlot bool
}

func (c *curveOptions) flags(cl *kingpin.CmdClause) {
	cl.Flag("capacity-curve", "Print the trace's token hit rate as a function of KV capacity (an LRU cache fed in replay order) instead of the statistics.").
		BoolVar(&c.enabled)
	cl.Flag("server-block-size", "With --capacity-curve: tokens per KV block of the engine (16 for vLLM); hits count in whole blocks.").
		Default("16").IsSetByUser(&c.setServerBlock).IntVar(&c.serverBlock)
	cl.Flag("capacities", "With --capacity-curve: capacities, in tokens, to evaluate besides the grid, comma-separated (k, M, G are 10³, 10⁶, 10⁹; Ki, Mi, Gi 2¹⁰, 2²⁰, 2³⁰).").
		PlaceHolder("1M,4Mi").IsSetByUser(&c.setCapacities).StringVar(&c.capacities)
	cl.Flag("max-capacity", "With --capacity-curve: the largest capacity modelled, in tokens; it bounds the memory, about 90 bytes per 512-token block below it.").
		Default(defaultMaxCapacity).IsSetByUser(&c.setMaxCapacity).StringVar(&c.maxCapacity)
	cl.Flag("plot", "With --capacity-curve: also draw the curve in this file, creating its directory, in the format its extension names: svg (also without one), png, jpg, pdf, eps or tiff.").
		PlaceHolder("FILE.svg").IsSetByUser(&c.setPlot).StringVar(&c.plot)
}

// flagWithout names a curve flag given without --capacity-curve, or is "".
func (c *curveOptions) flagWithout() string {
	for _, f := range []struct {
		set  bool
		name string
	}{{c.setServerBlock, "server-block-size"}, {c.setCapacities, "capacities"}, {c.setMaxCapacity, "max-capacity"}, {c.setPlot, "plot"}} {
		if f.set {
			return f.name
		}
	}
	return ""
}

// options turns the flags into the curve's options.
func (c *curveOptions) options(traceBlock int) (synth.CurveOptions, error) {
	o := synth.CurveOptions{TraceBlock: traceBlock, ServerBlock: c.serverBlock}
	if c.serverBlock <= 0 {
		return o, fmt.Errorf("--server-block-size must be positive, got %d", c.serverBlock)
	}
	var err error
	if o.MaxCapacity, err = parseTokenCount(c.maxCapacity); err != nil {
		return o, fmt.Errorf("--max-capacity: %w", err)
	}
	if o.Capacities, err = parseTokenCounts(c.capacities); err != nil {
		return o, fmt.Errorf("--capacities: %w", err)
	}
	if err := o.Check(); err != nil {
		return o, err
	}
	if c.plot != "" {
		if _, err := plotFormat(c.plot); err != nil {
			return o, err
		}
	}
	return o, nil
}

// runCapacityCurve is analyze --capacity-curve.
func runCapacityCurve(ctx context.Context, s streams, o analyzeOptions, now func() time.Time) error {
	opts, err := o.curve.options(o.blockSize)
	if err != nil {
		return badInput(err)
	}
	rows, err := readTraceTable(o.trace, o.blockSize)
	if err != nil {
		return err
	}
	// The curve is the replay's cache: the ids a prompt is built from.
	rows, surplus, err := trace.FitTable(rows, o.blockSize)
	if err != nil {
		return fmt.Errorf("%s: %w", o.trace, err)
	}
	if surplus.Rows > 0 {
		fmt.Fprintf(s.stderr, "analyze: %s: %s; the curve uses the ids that fit, as the replay does\n", o.trace, surplus)
	}
	// The order the daemon's model walks a pass in, at the trace's own
	// pace: the schedule is the replay's.
	plan, err := replay.NewPlan(rows, 1, o.trace)
	if err != nil {
		return err
	}
	p := newProgress(s.stderr, now)
	opts.Progress = func(done int) { p.modelled(done, rows.Len()) }
	curve, err := synth.CapacityCurveOf(ctx, rows, plan.FleetOrder(), o.trace, opts)
	if err != nil {
		return err
	}
	if o.curve.plot != "" {
		if err := writeCurvePlot(curve, o.curve.plot); err != nil {
			return err
		}
	}
	return writeReport(s, o, curve.AppendJSON, curve.WriteTable)
}

// readTraceTable reads the trace at path into a table, checking its rows
// with blockSize-token hash blocks.
func readTraceTable(path string, blockSize int) (*trace.Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err // *PathError names the file
	}
	defer f.Close()
	var size int64
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	rows, err := trace.ReadTable(f, path, trace.ReadOptions{BlockSize: blockSize}, size)
	if err != nil {
		return nil, err // a *LineError says file:line: reason
	}
	if rows.Len() == 0 {
		return nil, fmt.Errorf("%s: %w", path, trace.ErrEmpty)
	}
	return rows, nil
}

// modelled reports, after the first second, how far the cache model is.
func (p *progress) modelled(done, rows int) {
	t := p.now()
	if t.Sub(p.start) < progressInterval || (p.shown && t.Sub(p.last) < progressInterval) {
		return
	}
	fmt.Fprintf(p.w, "analyze: %d of %d rows through the cache model...\n", done, rows)
	p.last, p.shown = t, true
}

// parseTokenCounts parses a comma-separated list of token counts; an empty
// string is an empty list.
func parseTokenCounts(s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var counts []int64
	for _, f := range strings.Split(s, ",") {
		n, err := parseTokenCount(f)
		if err != nil {
			return nil, err
		}
		counts = append(counts, n)
	}
	return counts, nil
}

// tokenSuffixes are the multipliers a token count may end with.
var tokenSuffixes = []struct {
	suffix string
	mult   int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30},
	{"k", 1e3}, {"M", 1e6}, {"G", 1e9},
}

// parseTokenCount parses a positive whole number of tokens, such as 4096,
// 512k, 1M or 4Mi.
func parseTokenCount(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num, mult := s, int64(1)
	for _, t := range tokenSuffixes {
		if strings.HasSuffix(s, t.suffix) {
			num, mult = strings.TrimSuffix(s, t.suffix), t.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	switch {
	case err != nil || num == "" || num[0] == '+' || num[0] == '-':
		return 0, fmt.Errorf("%q is not a token count such as 4096, 512k or 4Mi", s)
	case n <= 0:
		return 0, fmt.Errorf("%q: a token count must be positive", s)
	case n > math.MaxInt64/mult:
		return 0, fmt.Errorf("%q: too many tokens", s)
	}
	return n * mult, nil
}
