package cli

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/alecthomas/kingpin/v2"

	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// hashCommand turns a file of prompts into a Mooncake trace, giving equal
// hash ids to equal token prefixes (Dynamo's datagen hasher). The output and
// block size may also come as arguments, as Dynamo's hasher script takes
// them.
func hashCommand(app *kingpin.Application) command {
	cl := app.Command("hash", `Tokenize prompts (JSONL rows {"prompt": "..."} or {"messages": [...]}) and write a Mooncake trace with input_length and hash_ids. Also "hash PROMPTS OUT [BLOCK_SIZE]", as Dynamo's hasher script takes them.`)
	in := cl.Arg("PROMPTS", "JSONL file of prompts.").Required().String()
	outArg := cl.Arg("OUT", "Trace to write (the same as -o).").String()
	blockArg := cl.Arg("BLOCK_SIZE", "Hash block size in tokens (the same as --block-size).").String()
	out := cl.Flag("output-file", "Trace to write.").Short('o').String()
	var blockSet bool
	blockSize := cl.Flag("block-size", "Hash block size in tokens; a workload replaying the trace needs the same block_size.").
		Default("512").IsSetByUser(&blockSet).Int()
	tok := cl.Flag("tokenizer", "o200k_base, cl100k_base, or the path of a Hugging Face tokenizer.json.").Default(tokenizer.O200kBase).String()
	return command{clause: cl, run: func(ctx context.Context, s streams) error {
		outPath, block, err := hashOutput(*out, *outArg, *blockSize, blockSet, *blockArg)
		if err != nil {
			return badInput(fmt.Errorf("hash: %w", err))
		}
		t, err := tokenizer.Load(*tok)
		if err != nil {
			return badInput(fmt.Errorf("hash: %w", err))
		}
		rows, err := hashFile(ctx, *in, outPath, t, block)
		if err != nil {
			return err
		}
		fmt.Fprintf(s.stderr, "hash: wrote %d rows of %d-token blocks to %s; a workload replaying it needs block_size: %d\n",
			rows, block, outPath, block)
		return nil
	}}
}

// hashOutput settles the output path and block size from the flags and
// the positional arguments, which may each give them, but not differently.
func hashOutput(flagOut, argOut string, flagBlock int, flagBlockSet bool, argBlock string) (string, int, error) {
	out := cmp.Or(argOut, flagOut)
	switch {
	case out == "":
		return "", 0, errors.New("the trace to write is required: give OUT or -o")
	case argOut != "" && flagOut != "" && argOut != flagOut:
		return "", 0, fmt.Errorf("OUT %q and -o %q disagree; give one", argOut, flagOut)
	}
	block := flagBlock
	if argBlock != "" {
		n, err := strconv.Atoi(argBlock)
		if err != nil {
			return "", 0, fmt.Errorf("BLOCK_SIZE: want an integer, got %q", argBlock)
		}
		if flagBlockSet && n != flagBlock {
			return "", 0, fmt.Errorf("BLOCK_SIZE %d and --block-size %d disagree; give one", n, flagBlock)
		}
		block = n
	}
	if block <= 0 {
		return "", 0, fmt.Errorf("the block size must be positive, got %d", block)
	}
	return out, block, nil
}

// hashFile writes the trace to a temporary file beside out and renames it
// at the end, so a bad row never leaves a partial trace behind.
func hashFile(ctx context.Context, inPath, outPath string, t tokenizer.Tokenizer, blockSize int) (rows int, err error) {
	in, err := os.Open(inPath)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(outPath), "."+filepath.Base(outPath)+".*")
	if err != nil {
		return 0, fmt.Errorf("hash: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := bufio.NewWriterSize(tmp, 1<<16)
	if rows, err = hashPrompts(ctx, in, inPath, w, t, blockSize); err != nil {
		return 0, err
	}
	if err := w.Flush(); err != nil {
		return 0, fmt.Errorf("hash: write %s: %w", outPath, err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("hash: write %s: %w", outPath, err)
	}
	if err := os.Rename(tmp.Name(), outPath); err != nil {
		return 0, fmt.Errorf("hash: %w", err)
	}
	return rows, nil
}

// promptRow is one parsed input row.
type promptRow struct {
	line int
	text string
	rec  trace.Record // timestamp, output_length, session_id
	ids  []int
}

// hashPrompts reads prompt rows from r and writes trace rows to w. Rows are
// tokenized in parallel batches (tokenizing is the slow part) and hashed in
// file order, since ids depend on first appearance.
func hashPrompts(ctx context.Context, r io.Reader, name string, w io.Writer, t tokenizer.Tokenizer, blockSize int) (int, error) {
	h, err := prompt.NewHasher(blockSize)
	if err != nil {
		return 0, badInput(err)
	}
	br := bufio.NewReaderSize(r, 1<<16)
	workers := runtime.GOMAXPROCS(0)
	const batchSize = 256
	batch := make([]promptRow, 0, batchSize)
	var out []byte
	rows := 0
	line := 0
	flush := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for k := range workers {
			wg.Go(func() {
				for i := k; i < len(batch); i += workers {
					batch[i].ids, errs[i] = t.Encode(batch[i].text)
				}
			})
		}
		wg.Wait()
		for i := range batch {
			row := &batch[i]
			if errs[i] != nil {
				return &trace.LineError{File: name, Line: row.line, Err: errs[i]}
			}
			row.rec.InputLength = trace.Ptr(len(row.ids))
			row.rec.HashIDs = h.Append(make([]int64, 0, (len(row.ids)+blockSize-1)/blockSize), row.ids)
			out = row.rec.AppendJSON(out[:0])
			out = append(out, '\n')
			if _, err := w.Write(out); err != nil {
				return fmt.Errorf("hash: write: %w", err)
			}
		}
		batch = batch[:0]
		return nil
	}
	for {
		b, rerr := br.ReadBytes('\n')
		if len(b) > 0 {
			line++
			if b = bytes.TrimSpace(b); len(b) > 0 {
				row, err := parsePromptRow(b)
				if err != nil {
					return 0, &trace.LineError{File: name, Line: line, Err: err}
				}
				row.line = line
				batch = append(batch, row)
				rows++
				if len(batch) == batchSize {
					if err := flush(); err != nil {
						return 0, err
					}
				}
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return 0, fmt.Errorf("hash: read %s: %w", name, rerr)
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}
	if rows == 0 {
		return 0, fmt.Errorf("%s: %w", name, trace.ErrEmpty)
	}
	return rows, nil
}

// parsePromptRow reads one row: exactly one of prompt (a non-empty string)
// or messages (chat messages, rendered by renderChat); optional timestamp,
// output_length and session_id are copied to the trace; other keys are
// ignored, so prompt files from other tools can be fed as they are.
func parsePromptRow(b []byte) (promptRow, error) {
	var row promptRow
	if !utf8.Valid(b) {
		return row, errors.New("invalid UTF-8")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return row, fmt.Errorf("invalid JSON: %w", err)
	}
	if m == nil {
		return row, errors.New("a row must be a JSON object")
	}
	rawPrompt, hasPrompt := m["prompt"]
	msgs, hasMsgs := m["messages"]
	switch {
	case hasPrompt == hasMsgs:
		return row, errors.New(`exactly one of "prompt" or "messages" must be given`)
	case hasPrompt:
		if err := json.Unmarshal(rawPrompt, &row.text); err != nil || rawPrompt[0] != '"' {
			return row, fmt.Errorf("prompt: must be a string, got %s", trace.JSONKind(rawPrompt))
		}
		if row.text == "" {
			return row, errors.New("prompt: is empty")
		}
	default:
		text, err := renderChat(msgs)
		if err != nil {
			return row, err
		}
		row.text = text
	}
	if raw, ok := m["timestamp"]; ok && !isNull(raw) {
		var f float64
		if err := json.Unmarshal(raw, &f); err != nil || raw[0] == '"' {
			return row, fmt.Errorf("timestamp: must be a number of milliseconds, got %s", trace.JSONKind(raw))
		}
		if f < 0 || math.IsInf(f, 0) {
			return row, fmt.Errorf("timestamp: must be ≥ 0, got %s", raw)
		}
		row.rec.Timestamp = &f
	}
	if raw, ok := m["output_length"]; ok && !isNull(raw) {
		var n int
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
			return row, fmt.Errorf("output_length: must be an integer ≥ 0, got %s", raw)
		}
		row.rec.OutputLength = &n
	}
	if raw, ok := m["session_id"]; ok && !isNull(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return row, fmt.Errorf("session_id: must be a string, got %s", trace.JSONKind(raw))
		}
		row.rec.SessionID = &s
	}
	return row, nil
}

// renderChat renders a row's messages with the project's chat template
// (prompt.RenderChatML, shared with the emulator), generation prompt
// included. Content parts other than text (images, audio) are left out.
func renderChat(raw json.RawMessage) (string, error) {
	var msgs []prompt.ChatMessage
	if raw[0] != '[' {
		return "", fmt.Errorf("messages: must be a list, got %s", trace.JSONKind(raw))
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return "", fmt.Errorf("messages: must be a list of objects with a string role: %w", err)
	}
	if len(msgs) == 0 {
		return "", errors.New("messages: must be a non-empty list")
	}
	text, _, err := prompt.RenderChatML(msgs, true)
	return text, err
}

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }
