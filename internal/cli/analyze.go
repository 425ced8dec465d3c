package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// analyzeOptions are the analyze command's arguments.
type analyzeOptions struct {
	trace      string
	inputFile  string // AIPerf's name for the trace
	blockSize  int
	format     string // table | json | aiperf: what goes to stdout
	formatSet  bool   // --format was given
	outputFile string // if set, the JSON report is also written here
	curve      curveOptions
}

// analyzeCommand is analyze, whose report is Dynamo datagen's table by
// default.
func analyzeCommand(app *kingpin.Application) command {
	cl := app.Command("analyze", "Print a trace's statistics: the numbers of AIPerf analyze-trace and Dynamo datagen analyze, in full precision, as a table (Dynamo datagen's form); or, with --capacity-curve, its hit rate by KV capacity. analyze-trace prints AIPerf's report instead.")
	return analyzeClause(cl, "table")
}

// analyzeTraceCommand is analyze under AIPerf's name, printing AIPerf's
// report (its labels, percentages and order) by default, as a user coming
// from AIPerf expects.
func analyzeTraceCommand(app *kingpin.Application) command {
	cl := app.Command("analyze-trace", "Print a trace's statistics as AIPerf's analyze-trace does (its labels, rates in percent); --format table prints analyze's table. With --capacity-curve, the trace's hit rate by KV capacity.")
	return analyzeClause(cl, "aiperf")
}

// analyzeClause adds analyze's arguments and flags to cl, printing
// defaultFormat unless --format says otherwise.
func analyzeClause(cl *kingpin.CmdClause, defaultFormat string) command {
	var o analyzeOptions
	cl.Arg("trace", "Mooncake trace file (JSON lines).").StringVar(&o.trace)
	cl.Flag("input-file", "The trace, as AIPerf's analyze-trace names it (instead of the TRACE argument).").
		PlaceHolder("FILE").StringVar(&o.inputFile)
	cl.Flag("block-size", "Tokens per hash block of the trace; used for Context Length and the capacity curve.").
		Default("512").IntVar(&o.blockSize)
	cl.Flag("format", "What to print on stdout: table, json (AIPerf's AnalysisStats keys; with --capacity-curve, the curve's), or aiperf (the report as AIPerf's analyze-trace prints it, rates in percent).").
		Default(defaultFormat).IsSetByUser(&o.formatSet).EnumVar(&o.format, "table", "json", "aiperf")
	cl.Flag("output-file", "Also write the JSON report to this file, creating its directory.").
		PlaceHolder("FILE").StringVar(&o.outputFile)
	o.curve.flags(cl)
	return command{clause: cl, run: func(ctx context.Context, s streams) error {
		if o.curve.enabled && !o.formatSet && o.format == "aiperf" {
			o.format = "table" // AIPerf's report has no curve: the curve's own table
		}
		return runAnalyze(ctx, s, o, time.Now)
	}}
}

// tracePath settles the trace from the argument and --input-file, which
// may each name it, but not differently.
func tracePath(arg, inputFile string) (string, error) {
	switch {
	case arg == "" && inputFile == "":
		return "", errors.New("a trace is required: give TRACE or --input-file")
	case arg != "" && inputFile != "" && arg != inputFile:
		return "", fmt.Errorf("TRACE %q and --input-file %q disagree; give one", arg, inputFile)
	}
	return cmp.Or(arg, inputFile), nil
}

// runAnalyze is the analyze command; now is the clock of the progress
// lines, a parameter so that tests need not sleep.
func runAnalyze(ctx context.Context, s streams, o analyzeOptions, now func() time.Time) error {
	path, err := tracePath(o.trace, o.inputFile)
	if err != nil {
		return badInput(err)
	}
	o.trace = path
	if o.blockSize <= 0 {
		return badInput(fmt.Errorf("--block-size must be positive, got %d", o.blockSize))
	}
	if o.curve.enabled {
		if o.format == "aiperf" {
			return badInput(errors.New("--format aiperf is AIPerf's report, which has no capacity curve: use table or json"))
		}
		return runCapacityCurve(ctx, s, o, now)
	}
	if flag := o.curve.flagWithout(); flag != "" {
		return badInput(fmt.Errorf("--%s needs --capacity-curve", flag))
	}
	an, surplus, err := analyzeTrace(ctx, o.trace, o.blockSize, newProgress(s.stderr, now))
	if err != nil {
		return err
	}
	if surplus.Rows > 0 {
		fmt.Fprintf(s.stderr, "analyze: %s: %s; counted with all their ids, as AIPerf counts them\n", o.trace, surplus)
	}
	if an.ReusingRows > 0 {
		fmt.Fprintf(s.stderr, "analyze: %s: %s. With blocks keyed so, an infinite cache serves %s of the prompt tokens, against a token hit rate of %s by id\n",
			o.trace, synth.ChainReuseNote(an.ReusingRows, an.TotalRequests, fmt.Sprintf("row %d", an.FirstReusingRow)),
			synth.FormatPyFloat(an.ChainTokenHitRate), synth.FormatPyFloat(an.TokenHitRate))
	}
	writeTable := an.WriteTable
	if o.format == "aiperf" {
		writeTable = an.WriteAIPerf
	}
	return writeReport(s, o, an.AppendJSON, writeTable)
}

// writeReport writes a report to stdout as a table or JSON, and as JSON to
// --output-file when one is given.
func writeReport(s streams, o analyzeOptions, appendJSON func([]byte) []byte, writeTable func(io.Writer) error) error {
	var js []byte
	if o.format == "json" || o.outputFile != "" {
		js = appendJSON(nil)
	}
	if o.outputFile != "" {
		if err := writeFileAll(o.outputFile, js); err != nil {
			return err
		}
	}
	var err error
	if o.format == "json" {
		_, err = s.stdout.Write(js)
	} else {
		err = writeTable(s.stdout)
	}
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// ctxCheckRows is how often (in rows) reading checks for cancellation; a
// row takes well under a microsecond, so this is prompt enough.
const ctxCheckRows = 4096

// analyzeTrace streams the trace at path into an Analyzer, so that only the
// compact per-row data the analysis needs is held in memory.
// Rows whose hash_ids run past their input_length are analysed with all
// their ids, as AIPerf does, and counted in the Surplus.
func analyzeTrace(ctx context.Context, path string, blockSize int, p *progress) (synth.Analysis, trace.Surplus, error) {
	surplus := trace.Surplus{BlockSize: blockSize}
	f, err := os.Open(path)
	if err != nil {
		return synth.Analysis{}, surplus, err // *PathError names the file
	}
	defer f.Close()

	rd := trace.NewReader(f, path, trace.ReadOptions{BlockSize: blockSize})
	a := synth.NewAnalyzer(blockSize)
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return synth.Analysis{}, surplus, err // a *LineError says file:line: reason
		}
		surplus.Count(&rec)
		a.Add(&rec)
		rows := a.Rows()
		if rows%ctxCheckRows == 0 {
			if err := ctx.Err(); err != nil {
				return synth.Analysis{}, surplus, fmt.Errorf("reading %s: %w", path, err)
			}
		}
		p.tick(rows)
	}
	if a.Rows() == 0 {
		return synth.Analysis{}, surplus, fmt.Errorf("%s: %w", path, trace.ErrEmpty)
	}
	p.done(a.Rows())
	return a.Result(), surplus, nil
}

// writeFileAll writes data to path, creating missing parent directories as
// AIPerf does for --output-file.
func writeFileAll(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating the directory of --output-file: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing --output-file: %w", err)
	}
	return nil
}

// progressInterval is both the delay before the first progress line and the
// least time between two of them: quick runs print none.
const progressInterval = time.Second

// progress reports on a slow read with lines on w.
type progress struct {
	w     io.Writer
	now   func() time.Time
	start time.Time
	last  time.Time // when the last line was printed
	shown bool
}

func newProgress(w io.Writer, now func() time.Time) *progress {
	return &progress{w: w, now: now, start: now()}
}

// tick is called after each row with the number of rows read so far.
func (p *progress) tick(rows int) {
	t := p.now()
	if t.Sub(p.start) < progressInterval || (p.shown && t.Sub(p.last) < progressInterval) {
		return
	}
	fmt.Fprintf(p.w, "analyze: read %d rows...\n", rows)
	p.last, p.shown = t, true
}

// done closes a run of progress lines with the final count.
func (p *progress) done(rows int) {
	if p.shown {
		fmt.Fprintf(p.w, "analyze: read %d rows, computing statistics\n", rows)
	}
}
