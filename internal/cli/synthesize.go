package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/alecthomas/kingpin/v2"

	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// synthesizeOptions are the synthesize command's arguments.
type synthesizeOptions struct {
	trace, inputFile string // the trace, as argument or as AIPerf's --input-file
	output           string
	knobs            synth.Knobs
	numRequests      int
	gen              generatorFlags
}

// synthesizeCommand writes a synthesized trace: AIPerf's per-row transform
// by default, Dynamo-style generation with --num-requests, or, with
// --prefixes, a shared-prefix workload from parameters alone.
func synthesizeCommand(app *kingpin.Application) command {
	cl := app.Command("synthesize", "Write a synthesized trace: AIPerf's per-row transform of TRACE; with --num-requests, new requests sampled from a prefix trie learned from TRACE (Dynamo datagen style); or, with --prefixes and no TRACE, a shared-prefix workload from parameters. The --synthesis-* flags are AIPerf's names, --osl-multiplier Dynamo's.")
	o := synthesizeOptions{knobs: synth.DefaultKnobs()}
	k := &o.knobs
	cl.Arg("trace", "Mooncake trace (JSONL) to read.").StringVar(&o.trace)
	cl.Flag("input-file", "The trace to read, as AIPerf and Dynamo name it (instead of the TRACE argument).").PlaceHolder("FILE").StringVar(&o.inputFile)
	cl.Flag("output-file", `Where to write the synthesized trace ("-" = stdout).`).Short('o').Required().StringVar(&o.output)
	intFlagVar(cl.Flag("block-size", "Tokens per hash block of the trace.").Default("512"), &k.BlockSize)
	floatKnob(cl, "speedup-ratio", "Divide timestamps by this (> 0).", &k.SpeedupRatio)
	floatKnob(cl, "prefix-len-multiplier", "Scale shared prefixes by this (> 0).", &k.PrefixLenMultiplier)
	intKnob(cl, "prefix-root-multiplier", "Spread requests over this many disjoint hash-id spaces (integer ≥ 1).", "1", &k.PrefixRootMultiplier)
	floatKnob(cl, "prompt-len-multiplier", "Scale unique (non-prefix) prompt tokens by this (> 0).", &k.PromptLenMultiplier)
	floatKnob(cl, "output-len-multiplier", "Scale output lengths by this (≥ 0).", &k.OutputLenMultiplier)
	cl.Flag("osl-multiplier", "Dynamo's name for --output-len-multiplier.").Float64Var(&k.OutputLenMultiplier)
	intKnob(cl, "max-isl", "Drop requests with more input tokens than this (0 = no limit).", "0", &k.MaxISL)
	intKnob(cl, "max-osl", "Cap output lengths at this (0 = no limit).", "0", &k.MaxOSL)
	intFlagVar(cl.Flag("num-requests", "Generate this many requests from a model learned from TRACE instead of transforming each row (0 = transform); with --prefixes, the number of requests.").Default("0"), &o.numRequests)
	cl.Flag("seed", "Root seed of the random streams (prefix roots; everything in generate modes).").Default("0").Uint64Var(&k.Seed)
	cl.Flag("random-seed", "AIPerf's name for --seed.").Uint64Var(&k.Seed)
	o.gen.flags(cl)
	return command{clause: cl, run: func(ctx context.Context, s streams) error {
		return runSynthesis(ctx, s, o)
	}}
}

// floatKnob registers a synthesis flag with its default of 1, and AIPerf's
// spelling of it, --synthesis-NAME, which sets the same value.
func floatKnob(cl *kingpin.CmdClause, name, help string, v *float64) {
	cl.Flag(name, help).Default("1").Float64Var(v)
	cl.Flag("synthesis-"+name, "AIPerf's name for --"+name+".").Float64Var(v)
}

// intKnob is floatKnob for an integer flag.
func intKnob(cl *kingpin.CmdClause, name, help, def string, v *int) {
	intFlagVar(cl.Flag(name, help).Default(def), v)
	intFlagVar(cl.Flag("synthesis-"+name, "AIPerf's name for --"+name+"."), v)
}

// runSynthesis is the synthesize command.
func runSynthesis(ctx context.Context, s streams, o synthesizeOptions) error {
	k := o.knobs
	if o.output == "" {
		// kingpin's lexer turns a lone "-" argument into "", so "-o -"
		// arrives here empty.
		o.output = "-"
	}
	if *o.gen.set["prefixes"] {
		return runSharedPrefix(ctx, s, o)
	}
	path, err := tracePath(o.trace, o.inputFile)
	if err != nil {
		return badInput(fmt.Errorf("synthesize: %w (or --prefixes for a shared-prefix workload)", err))
	}
	if err := checkSynthesisFlags(k, o.numRequests); err != nil {
		return badInput(fmt.Errorf("synthesize: %w", err))
	}
	if flag := o.gen.flagWithout(); flag != "" {
		return badInput(fmt.Errorf("synthesize: --%s needs --prefixes", flag))
	}
	rows, err := trace.ReadFile(path, trace.ReadOptions{BlockSize: k.BlockSize})
	if err != nil {
		return fmt.Errorf("synthesize: %w", err)
	}
	if sp := trace.FitRecords(rows, k.BlockSize); sp.Rows > 0 {
		fmt.Fprintf(s.stderr, "synthesize: %s: %s; synthesized from the ids that fit, as the replay builds its prompts\n", path, sp)
	}
	var (
		out  []trace.Record
		st   synth.Stats
		mode string
	)
	if o.numRequests > 0 {
		mode = "generated"
		out, st, err = synth.Generate(rows, o.numRequests, k)
	} else {
		mode = "transformed"
		out, st, err = synth.Transform(rows, k)
	}
	if err != nil {
		// Both fail only on what the trace or the flags hold.
		return badInput(fmt.Errorf("synthesize: %s: %w", path, err))
	}
	if err := writeSynthesized(ctx, o.output, s.stdout, out); err != nil {
		return fmt.Errorf("synthesize: %w", err)
	}
	fmt.Fprintf(s.stderr, "synthesize: read %d rows from %s; %s %d rows to %s\n", st.RowsIn, path, mode, st.RowsOut, destName(o.output))
	if k.MaxISL > 0 {
		what := "input rows"
		if o.numRequests > 0 {
			what = "sampled requests"
		}
		fmt.Fprintf(s.stderr, "synthesize: dropped %d %s with input_length > %d (--max-isl)\n", st.DroppedMaxISL, what, k.MaxISL)
	}
	return nil
}

// destName names an output for messages.
func destName(output string) string {
	if output == "-" {
		return "stdout"
	}
	return output
}

// intFlagVar parses an integer flag into v strictly: kingpin's own Int
// accepts 1.5 and truncates it.
func intFlagVar(f *kingpin.FlagClause, v *int) {
	f.SetValue((*strictInt)(v))
}

type strictInt int

func (v *strictInt) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, strconv.IntSize)
	if err != nil {
		return fmt.Errorf("want an integer, got %q", s)
	}
	*v = strictInt(n)
	return nil
}

func (v *strictInt) String() string { return strconv.Itoa(int(*v)) }

// checkSynthesisFlags reports every flag out of range, by flag name.
func checkSynthesisFlags(k synth.Knobs, numRequests int) error {
	err := k.ValidateNamed(func(key string) string { return "--" + strings.ReplaceAll(key, "_", "-") })
	if numRequests < 0 {
		err = errors.Join(err, fmt.Errorf("--num-requests must be ≥ 0 (0 = transform each row), got %d", numRequests))
	}
	return err
}

// writeSynthesized writes rows as JSONL to path, or to stdout for "-"
// (writeAtomically: never a half-written trace).
func writeSynthesized(ctx context.Context, path string, stdout io.Writer, rows []trace.Record) error {
	return writeAtomically(path, stdout, func(w io.Writer) error { return writeSynthesizedRows(ctx, w, rows) })
}

func writeSynthesizedRows(ctx context.Context, w io.Writer, rows []trace.Record) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	var line []byte
	for i := range rows {
		if i%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		line = rows[i].AppendJSON(line[:0])
		line = append(line, '\n')
		if _, err := bw.Write(line); err != nil {
			return err
		}
	}
	return bw.Flush()
}
