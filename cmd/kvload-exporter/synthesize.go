package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/alecthomas/kingpin/v2"

	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// synthesizeCommand writes a synthesized trace: AIPerf's per-row transform
// by default, Dynamo-style generation with --num-requests.
func synthesizeCommand(app *kingpin.Application) command {
	cl := app.Command("synthesize", "Write a synthesized trace: AIPerf's per-row transform of TRACE, or, with --num-requests, new requests sampled from a prefix trie learned from TRACE (Dynamo datagen style).")
	var (
		tracePath  = cl.Arg("trace", "Mooncake trace (JSONL) to read.").Required().String()
		output     = cl.Flag("output-file", `Where to write the synthesized trace ("-" = stdout).`).Short('o').Required().String()
		blockSize  = intFlag(cl.Flag("block-size", "Tokens per hash block of the trace.").Default("512"))
		speedup    = cl.Flag("speedup-ratio", "Divide timestamps by this (> 0).").Default("1").Float64()
		prefixLen  = cl.Flag("prefix-len-multiplier", "Scale shared prefixes by this (> 0).").Default("1").Float64()
		prefixRoot = intFlag(cl.Flag("prefix-root-multiplier", "Spread requests over this many disjoint hash-id spaces (integer ≥ 1).").Default("1"))
		promptLen  = cl.Flag("prompt-len-multiplier", "Scale unique (non-prefix) prompt tokens by this (> 0).").Default("1").Float64()
		outputLen  = cl.Flag("output-len-multiplier", "Scale output lengths by this (≥ 0).").Default("1").Float64()
		maxISL     = intFlag(cl.Flag("max-isl", "Drop requests with more input tokens than this (0 = no limit).").Default("0"))
		maxOSL     = intFlag(cl.Flag("max-osl", "Cap output lengths at this (0 = no limit).").Default("0"))
		numReqs    = intFlag(cl.Flag("num-requests", "Generate this many requests from a learned model instead of transforming each row (0 = transform).").Default("0"))
		seed       = cl.Flag("seed", "Root seed of the random streams (prefix roots; everything in generate mode).").Default("0").Uint64()
	)
	return command{clause: cl, run: func(ctx context.Context, s streams) error {
		k := synth.Knobs{
			BlockSize:            *blockSize,
			SpeedupRatio:         *speedup,
			PrefixLenMultiplier:  *prefixLen,
			PrefixRootMultiplier: *prefixRoot,
			PromptLenMultiplier:  *promptLen,
			OutputLenMultiplier:  *outputLen,
			MaxISL:               *maxISL,
			MaxOSL:               *maxOSL,
			Seed:                 *seed,
		}
		if err := checkSynthesisFlags(k, *numReqs); err != nil {
			return badInput(fmt.Errorf("synthesize: %w", err))
		}
		if *output == "" {
			// kingpin's lexer turns a lone "-" argument into "", so
			// "-o -" arrives here empty.
			*output = "-"
		}
		rows, err := trace.ReadFile(*tracePath, trace.ReadOptions{BlockSize: k.BlockSize})
		if err != nil {
			return fmt.Errorf("synthesize: %w", err)
		}
		var (
			out  []trace.Record
			st   synth.Stats
			mode string
		)
		if *numReqs > 0 {
			mode = "generated"
			out, st, err = synth.Generate(rows, *numReqs, k)
		} else {
			mode = "transformed"
			out, st, err = synth.Transform(rows, k)
		}
		if err != nil {
			// Both fail only on what the trace or the flags hold.
			return badInput(fmt.Errorf("synthesize: %s: %w", *tracePath, err))
		}
		if err := writeSynthesized(ctx, *output, s.stdout, out); err != nil {
			return fmt.Errorf("synthesize: %w", err)
		}
		dest := *output
		if dest == "-" {
			dest = "stdout"
		}
		fmt.Fprintf(s.stderr, "synthesize: read %d rows from %s; %s %d rows to %s\n", st.RowsIn, *tracePath, mode, st.RowsOut, dest)
		if k.MaxISL > 0 {
			what := "input rows"
			if *numReqs > 0 {
				what = "sampled requests"
			}
			fmt.Fprintf(s.stderr, "synthesize: dropped %d %s with input_length > %d (--max-isl)\n", st.DroppedMaxISL, what, k.MaxISL)
		}
		return nil
	}}
}

// intFlag parses an integer flag strictly: kingpin's own Int accepts 1.5
// and truncates it.
func intFlag(f *kingpin.FlagClause) *int {
	v := new(int)
	f.SetValue((*strictInt)(v))
	return v
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

// writeSynthesized writes rows as JSONL to path, or to stdout for "-". A file is
// written under a temporary name in the same directory and renamed when
// complete, so a failure never leaves a half-written trace behind.
func writeSynthesized(ctx context.Context, path string, stdout io.Writer, rows []trace.Record) (err error) {
	if path == "-" {
		return writeSynthesizedRows(ctx, stdout, rows)
	}
	// A device, pipe or socket (/dev/stdout, a FIFO) is written in place:
	// renaming a temporary file over it would replace the device node.
	if fi, serr := os.Stat(path); serr == nil && !fi.Mode().IsRegular() {
		if fi.IsDir() {
			return badInput(fmt.Errorf("write %s: is a directory", path))
		}
		return writeSynthesizedSpecial(ctx, path, rows)
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
	if err := writeSynthesizedRows(ctx, f, rows); err != nil {
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

// writeSynthesizedSpecial writes rows to an existing file that is not a
// regular one.
func writeSynthesizedSpecial(ctx context.Context, path string, rows []trace.Record) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err // *PathError names the file
	}
	if err := writeSynthesizedRows(ctx, f, rows); err != nil {
		f.Close()
		return err // a write's *PathError names the file
	}
	return f.Close()
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
