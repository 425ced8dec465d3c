package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// generatorFlags are synthesize's shared-prefix parameters; the names
// follow the workload's generate keys, and AIPerf's spellings are aliases.
type generatorFlags struct {
	prefixes, prefixTokens, turns int
	input, output                 synth.Lengths
	turnDelay                     time.Duration
	rate                          float64
	arrivals                      string
	set                           map[string]*bool // by flag name: given on the command line
}

func (g *generatorFlags) flags(cl *kingpin.CmdClause) {
	g.set = map[string]*bool{}
	flag := func(name, help string) *kingpin.FlagClause {
		g.set[name] = new(bool)
		return cl.Flag(name, help).IsSetByUser(g.set[name])
	}
	alias := func(name, of string) *kingpin.FlagClause {
		return cl.Flag(name, "AIPerf's name for --"+of+".").IsSetByUser(g.set[of])
	}
	intFlagVar(flag("prefixes", "Shared-prefix workload: the number of shared prefixes (system prompts) the requests pick from; needs no TRACE."), &g.prefixes)
	intFlagVar(alias("prefix-prompt-pool-size", "prefixes"), &g.prefixes)
	intFlagVar(flag("prefix-tokens", "Shared-prefix workload: tokens of each prefix.").Default("0"), &g.prefixTokens)
	intFlagVar(alias("prefix-prompt-length", "prefix-tokens"), &g.prefixTokens)
	flag("input-tokens-mean", "Shared-prefix workload: mean tokens of a request after its prefix (of each turn's new text).").Default("0").Float64Var(&g.input.Mean)
	alias("synthetic-input-tokens-mean", "input-tokens-mean").Float64Var(&g.input.Mean)
	flag("input-tokens-stddev", "Shared-prefix workload: their standard deviation.").Default("0").Float64Var(&g.input.StdDev)
	alias("synthetic-input-tokens-stddev", "input-tokens-stddev").Float64Var(&g.input.StdDev)
	flag("output-tokens-mean", "Shared-prefix workload: mean output tokens.").Default("0").Float64Var(&g.output.Mean)
	flag("output-tokens-stddev", "Shared-prefix workload: their standard deviation.").Default("0").Float64Var(&g.output.StdDev)
	intFlagVar(flag("turns", "Shared-prefix workload: turns per session; each turn's prompt holds the previous turn, its answer and new text (1 = no sessions).").Default("1"), &g.turns)
	flag("turn-delay", "Shared-prefix workload: think time from an answer to the next turn (the rows' delay).").Default("0s").DurationVar(&g.turnDelay)
	flag("rate", "Shared-prefix workload: new sessions a second (requests a second without turns).").Default("0").Float64Var(&g.rate)
	alias("request-rate", "rate").Float64Var(&g.rate)
	// Checked by synth.Arrivals.Validate, not as a kingpin enum, so that
	// a bad value is told under the spelling given.
	arrivals := make([]string, len(synth.ArrivalProcesses))
	for i, a := range synth.ArrivalProcesses {
		arrivals[i] = string(a)
	}
	flag("arrivals", "Shared-prefix workload: arrival process, "+strings.Join(arrivals, " or ")+".").
		Default(string(synth.ArrivalsPoisson)).PlaceHolder(strings.Join(arrivals, "|")).StringVar(&g.arrivals)
	flag("arrival", "The older spelling of --arrivals.").PlaceHolder(strings.Join(arrivals, "|")).StringVar(&g.arrivals)
}

// flagWithout names a shared-prefix flag given without --prefixes, or "".
func (g *generatorFlags) flagWithout() string {
	for _, name := range []string{"prefix-tokens", "input-tokens-mean", "input-tokens-stddev", "output-tokens-mean",
		"output-tokens-stddev", "turns", "turn-delay", "rate", "arrivals", "arrival"} {
		if *g.set[name] {
			return name
		}
	}
	return ""
}

// spec is the generator's parameters.
func (g *generatorFlags) spec(requests int, k synth.Knobs) synth.SharedPrefix {
	return synth.SharedPrefix{
		Prefixes: g.prefixes, PrefixTokens: g.prefixTokens, Requests: requests,
		InputTokens: g.input, OutputTokens: g.output, Turns: g.turns,
		TurnDelay: float64(g.turnDelay) / float64(time.Millisecond),
		Rate:      g.rate, Arrivals: synth.Arrivals(g.arrivals),
		BlockSize: k.BlockSize, Seed: k.Seed,
	}
}

// runSharedPrefix is synthesize --prefixes: a trace from parameters alone.
func runSharedPrefix(ctx context.Context, s streams, o synthesizeOptions) error {
	if o.trace != "" || o.inputFile != "" {
		return badInput(errors.New("synthesize: --prefixes makes a workload from parameters; it reads no TRACE"))
	}
	if o.knobs.Rewrites() || o.knobs.MaxISL != 0 || o.knobs.MaxOSL != 0 {
		return badInput(errors.New("synthesize: the synthesis multipliers, --max-isl and --max-osl reshape a TRACE; with --prefixes, set the lengths instead"))
	}
	if *o.gen.set["arrivals"] && *o.gen.set["arrival"] {
		return badInput(errors.New("synthesize: --arrival cannot be given with --arrivals: it is the older spelling of the same flag"))
	}
	spec := o.gen.spec(o.numRequests, o.knobs)
	err := spec.Validate(func(key string) string {
		if key == "arrivals" && *o.gen.set["arrival"] {
			return "--arrival" // the spelling given
		}
		return "--" + sharedPrefixFlag(key)
	})
	if err != nil {
		return badInput(fmt.Errorf("synthesize: %w", err))
	}
	if w := spec.UnsharedPrefixWarning("--block-size"); w != "" {
		fmt.Fprintf(s.stderr, "synthesize: warning: %s\n", w)
	}
	rows := 0
	write := func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<16)
		var line []byte
		err := synth.GenerateSharedPrefix(spec, func(r *trace.Record) error {
			if rows++; rows%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			line = append(r.AppendJSON(line[:0]), '\n')
			_, err := bw.Write(line)
			return err
		})
		if err != nil {
			return err
		}
		return bw.Flush()
	}
	if err := writeAtomically(o.output, s.stdout, write); err != nil {
		return fmt.Errorf("synthesize: %w", err)
	}
	fmt.Fprintf(s.stderr, "synthesize: generated %d rows of a shared-prefix workload (%d prefixes of %d tokens) to %s\n",
		rows, spec.Prefixes, spec.PrefixTokens, destName(o.output))
	return nil
}

// sharedPrefixFlag is the flag of a generator parameter's key.
func sharedPrefixFlag(key string) string {
	switch key {
	case "requests":
		return "num-requests"
	case "input_tokens.mean":
		return "input-tokens-mean"
	case "input_tokens.stddev":
		return "input-tokens-stddev"
	case "output_tokens.mean":
		return "output-tokens-mean"
	case "output_tokens.stddev":
		return "output-tokens-stddev"
	case "prefix_tokens":
		return "prefix-tokens"
	case "turn_delay":
		return "turn-delay"
	case "block_size":
		return "block-size"
	}
	return key
}

// writeAtomically writes with write to path, or to stdout for "-". A file
// is written under a temporary name in the same directory and renamed when
// complete, so a failure never leaves a half-written trace behind; a
// device, pipe or socket (/dev/stdout, a FIFO) is written in place, as
// renaming over it would replace the device node.
func writeAtomically(path string, stdout io.Writer, write func(io.Writer) error) (err error) {
	if path == "-" {
		return write(stdout)
	}
	if fi, serr := os.Stat(path); serr == nil && !fi.Mode().IsRegular() {
		if fi.IsDir() {
			return badInput(fmt.Errorf("write %s: is a directory", path))
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err // *PathError names the file
		}
		if err := write(f); err != nil {
			f.Close()
			return err // a write's *PathError names the file
		}
		return f.Close()
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err // *PathError names the directory
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := write(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// CreateTemp makes the file 0600; a trace is an ordinary data file.
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.Rename(f.Name(), path)
}
