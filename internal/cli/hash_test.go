package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

func runHash(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"hash"}, args...), streams{stdout: &out, stderr: &errb})
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHashCommand(t *testing.T) {
	dir := t.TempDir()
	in := writeFile(t, dir, "prompts.jsonl", strings.Join([]string{
		`{"prompt": "hello world, this is a test", "timestamp": 0, "output_length": 5, "session_id": "s1"}`,
		``,
		`{"prompt": "hello world, this is a test of sharing", "timestamp": 12.5}`,
		`{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]}, {"role": "assistant", "content": null}], "extra": 1}`,
	}, "\n"))
	out := filepath.Join(dir, "trace.jsonl")
	code, _, stderr := runHash(t, in, "-o", out, "--block-size", "4")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	recs, err := trace.ReadFile(out, trace.ReadOptions{BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := tokenizer.Load(tokenizer.O200kBase)
	texts := []string{
		"hello world, this is a test",
		"hello world, this is a test of sharing",
		"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n",
	}
	h, _ := prompt.NewHasher(4)
	for i, text := range texts {
		ids, _ := tok.Encode(text)
		if recs[i].ISL() != len(ids) {
			t.Errorf("row %d: input_length %d, want %d", i, recs[i].ISL(), len(ids))
		}
		if want := h.Append(nil, ids); !slices.Equal(recs[i].HashIDs, want) {
			t.Errorf("row %d: hash_ids %v, want %v", i, recs[i].HashIDs, want)
		}
	}
	if recs[0].HashIDs[0] != recs[1].HashIDs[0] {
		t.Error("rows with a common first block got different first ids")
	}
	if *recs[0].SessionID != "s1" || recs[0].OSL() != 5 || *recs[1].Timestamp != 12.5 || recs[2].Timestamp != nil {
		t.Errorf("copied fields wrong: %s / %s / %s", recs[0].AppendJSON(nil), recs[1].AppendJSON(nil), recs[2].AppendJSON(nil))
	}
}

func TestHashCommandBadInput(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"not json", `{"prompt": "a"}` + "\n{oops", "prompts.jsonl:2: invalid JSON"},
		{"neither", `{"text": "a"}`, `prompts.jsonl:1: exactly one of "prompt" or "messages"`},
		{"both", `{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}`, "prompts.jsonl:1: exactly one"},
		{"prompt number", `{"prompt": 3}`, "prompts.jsonl:1: prompt: must be a string, got a number"},
		{"empty prompt", `{"prompt": ""}`, "prompts.jsonl:1: prompt: is empty"},
		{"messages object", `{"messages": {"role": "user"}}`, "prompts.jsonl:1: messages: must be a list, got an object"},
		{"no role", `{"messages": [{"content": "x"}]}`, "prompts.jsonl:1: messages[0]: has no role"},
		{"content number", `{"messages": [{"role": "user", "content": 5}]}`, "prompts.jsonl:1: messages[0].content: must be a string"},
		{"negative timestamp", `{"prompt": "a", "timestamp": -1}`, "prompts.jsonl:1: timestamp: must be ≥ 0"},
		{"fractional output", `{"prompt": "a", "output_length": 1.5}`, "prompts.jsonl:1: output_length: must be an integer"},
		{"session number", `{"prompt": "a", "session_id": 7}`, "prompts.jsonl:1: session_id: must be a string"},
		{"empty file", "\n\n", "prompts.jsonl: trace has no rows"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			in := writeFile(t, dir, "prompts.jsonl", tc.body)
			out := filepath.Join(dir, "trace.jsonl")
			code, _, stderr := runHash(t, in, "-o", out)
			if code != exitBadInput || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, stderr, tc.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Fatalf("left files behind: %v", entries)
			}
		})
	}
	dir := t.TempDir()
	in := writeFile(t, dir, "p.jsonl", `{"prompt": "a"}`)
	for _, args := range [][]string{
		{filepath.Join(dir, "missing.jsonl"), "-o", filepath.Join(dir, "t")},
		{in, "-o", filepath.Join(dir, "t"), "--tokenizer", "nope"},
		{in, "-o", filepath.Join(dir, "t"), "--block-size", "0"},
		{in},
	} {
		if code, _, stderr := runHash(t, args...); code != exitBadInput {
			t.Errorf("%v: exit %d (%s), want 2", args, code, stderr)
		}
	}
}

// TestHashRoundTrip writes the builder's prompts for the first rows of both
// shared traces as a prompts file (with their timestamps and output
// lengths), hashes it with the command (o200k_base, block 512) and expects
// the original rows back, hash ids compared after renumbering in first-
// appearance order. prompt's TestHasherRoundTrip covers 1,000 rows per trace
// (without -race); here a few rows check the command's plumbing.
func TestHashRoundTrip(t *testing.T) {
	const rows = 20
	for _, name := range []string{"conversation_trace.jsonl", "synthetic_trace.jsonl"} {
		t.Run(name, func(t *testing.T) {
			recs, err := trace.ReadFile(testutil.NeedShared(t, filepath.Join("..", "..", "testdata", "mooncake", name)), trace.ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			recs = recs[:rows]
			b, err := prompt.NewBuilder(prompt.Options{BlockSize: 512, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			var in bytes.Buffer
			enc := json.NewEncoder(&in)
			for i := range recs {
				text, err := b.AppendText(nil, &recs[i], 0, uint64(i))
				if err != nil {
					t.Fatal(err)
				}
				row := map[string]any{"prompt": string(text), "output_length": recs[i].OSL()}
				if recs[i].Timestamp != nil {
					row["timestamp"] = *recs[i].Timestamp
				}
				if err := enc.Encode(row); err != nil {
					t.Fatal(err)
				}
			}
			dir := t.TempDir()
			inPath := writeFile(t, dir, "prompts.jsonl", in.String())
			outPath := filepath.Join(dir, "trace.jsonl")
			if code, _, stderr := runHash(t, inPath, "-o", outPath); code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			got, err := trace.ReadFile(outPath, trace.ReadOptions{BlockSize: 512})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(recs) {
				t.Fatalf("%d rows out, %d in", len(got), len(recs))
			}
			var wantIDs, gotIDs [][]int64
			for i := range recs {
				if got[i].ISL() != recs[i].ISL() || got[i].OSL() != recs[i].OSL() || (recs[i].Timestamp != nil && *got[i].Timestamp != *recs[i].Timestamp) {
					t.Fatalf("row %d: %s, want %s", i, got[i].AppendJSON(nil), recs[i].AppendJSON(nil))
				}
				wantIDs = append(wantIDs, recs[i].HashIDs)
				gotIDs = append(gotIDs, got[i].HashIDs)
			}
			wantIDs, gotIDs = firstAppearance(wantIDs), firstAppearance(gotIDs)
			for i := range wantIDs {
				if !slices.Equal(gotIDs[i], wantIDs[i]) {
					t.Fatalf("row %d: hash_ids %v, want %v (renumbered)", i, gotIDs[i], wantIDs[i])
				}
			}
		})
	}
}

func firstAppearance(rows [][]int64) [][]int64 {
	m := map[int64]int64{}
	out := make([][]int64, len(rows))
	for i, r := range rows {
		for _, id := range r {
			if _, ok := m[id]; !ok {
				m[id] = int64(len(m))
			}
			out[i] = append(out[i], m[id])
		}
	}
	return out
}

// TestHashDynamoForm: `hash PROMPTS OUT [BLOCK_SIZE]` writes what -o and
// --block-size write, and says which block_size a workload needs.
func TestHashDynamoForm(t *testing.T) {
	prompts := filepath.Join("..", "..", "examples", "prompts.jsonl")
	dir := t.TempDir()
	hash := func(args ...string) (int, string, []byte) {
		code, _, stderr := runCLI(append([]string{"hash", prompts}, args...)...)
		b, _ := os.ReadFile(filepath.Join(dir, "t.jsonl"))
		os.Remove(filepath.Join(dir, "t.jsonl"))
		return code, stderr, b
	}
	out := filepath.Join(dir, "t.jsonl")
	code, stderr, want := hash("-o", out, "--block-size", "16")
	if code != exitOK || !strings.Contains(stderr, "needs block_size: 16") {
		t.Fatalf("-o: exit %d, stderr %q", code, stderr)
	}
	for _, args := range [][]string{{out, "16"}, {out, "16", "--block-size", "16"}, {out, "-o", out, "--block-size", "16"}} {
		if code, stderr, got := hash(args...); code != exitOK || string(got) != string(want) {
			t.Errorf("%v: exit %d (%s), same trace: %v", args, code, stderr, string(got) == string(want))
		}
	}
	_, _, def := hash("-o", out)
	if code, _, got := hash(out); code != exitOK || string(got) != string(def) || string(def) == string(want) {
		t.Errorf("OUT alone: exit %d, want the 512-token trace", code)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "the trace to write is required"},
		{[]string{out, "-o", out + ".2"}, "disagree"},
		{[]string{out, "16", "--block-size", "32"}, "disagree"},
		{[]string{out, "x"}, "BLOCK_SIZE: want an integer"},
		{[]string{out, "0"}, "must be positive"},
	} {
		if code, stderr, _ := hash(tt.args...); code != exitBadInput || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
	_, help, _ := runCLI("help", "hash")
	for _, name := range []string{"OUT", "BLOCK_SIZE", "Dynamo"} {
		if !strings.Contains(help, name) {
			t.Errorf("help of hash does not mention %s:\n%s", name, help)
		}
	}
}
