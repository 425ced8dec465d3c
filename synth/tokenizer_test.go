package synth

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The four tokenizers the prompt builder promises exact lengths for, by the
// names of their golden files in testdata/tokenizer.
var testTokenizerNames = []string{"o200k_base", "cl100k_base", "qwen3", "llama3_1"}

// testTokenizers caches loaded tokenizers across tests: a tokenizer.json
// takes a good fraction of a second to load.
var testTokenizers struct {
	sync.Mutex
	m map[string]Tokenizer
}

// loadTestTokenizer returns a tokenizer by golden-file name. The
// tokenizer.json files come from `make tokenizers`; without them the test
// fails rather than skips, so a CI run can never silently test less.
func loadTestTokenizer(t testing.TB, name string) Tokenizer {
	t.Helper()
	testTokenizers.Lock()
	defer testTokenizers.Unlock()
	if tok, ok := testTokenizers.m[name]; ok {
		return tok
	}
	spec := name
	if name != TokenizerO200k && name != TokenizerCl100k {
		dir := os.Getenv("KVLOAD_TOKENIZER_DIR")
		if dir == "" {
			t.Fatalf("KVLOAD_TOKENIZER_DIR is not set: run `make tokenizers` and test through make (or export KVLOAD_TOKENIZER_DIR=$PWD/.cache/tokenizers)")
		}
		spec = filepath.Join(dir, name, "tokenizer.json")
		if _, err := os.Stat(spec); err != nil {
			t.Fatalf("%v: run `make tokenizers`", err)
		}
	}
	tok, err := LoadTokenizer(spec)
	if err != nil {
		t.Fatalf("LoadTokenizer(%s): %v", spec, err)
	}
	if testTokenizers.m == nil {
		testTokenizers.m = make(map[string]Tokenizer)
	}
	testTokenizers.m[name] = tok
	return tok
}

type goldenFile struct {
	Tokenizer string `json:"tokenizer"`
	Source    string `json:"source"`
	Cases     []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	} `json:"cases"`
}

func readGolden(t *testing.T, name string) goldenFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "tokenizer", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s.json: %v", name, err)
	}
	if len(g.Cases) == 0 {
		t.Fatalf("%s.json has no cases", name)
	}
	return g
}

// TestTokenizerGolden compares our ids with ids produced independently
// (transformers.js for tokenizer.json files, js-tiktoken for the tiktoken
// encodings; see testdata/tokenizer/README.md).
func TestTokenizerGolden(t *testing.T) {
	for _, name := range testTokenizerNames {
		t.Run(name, func(t *testing.T) {
			tok := loadTestTokenizer(t, name)
			g := readGolden(t, name)
			for i, c := range g.Cases {
				got, err := tok.Encode(c.Text)
				if err != nil {
					t.Fatalf("case %d: Encode: %v", i, err)
				}
				if !slices.Equal(got, c.IDs) {
					t.Errorf("case %d %.60q:\n got  %v\n want %v (%s)", i, c.Text, head(got), head(c.IDs), g.Source)
					continue
				}
				back, err := tok.Decode(got)
				if err != nil {
					t.Fatalf("case %d: Decode: %v", i, err)
				}
				if back != c.Text {
					t.Errorf("case %d: Decode(Encode(s)) = %.60q, want %.60q", i, back, c.Text)
				}
			}
		})
	}
}

func head(ids []int) []int {
	if len(ids) > 40 {
		return ids[:40]
	}
	return ids
}

// TestTokenizerConcurrent encodes from many goroutines at once (run with
// -race) and checks every result is the same.
func TestTokenizerConcurrent(t *testing.T) {
	for _, name := range testTokenizerNames {
		t.Run(name, func(t *testing.T) {
			tok := loadTestTokenizer(t, name)
			text := strings.Repeat("Concurrent encoding, 123 times; naïve 中文 ", 20)
			want, err := tok.Encode(text)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					got, err := tok.Encode(text)
					if err != nil || !slices.Equal(got, want) {
						t.Errorf("concurrent Encode differs (err %v)", err)
					}
				})
			}
			wg.Wait()
		})
	}
}

func TestLoadTokenizerErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const byteLevel = `{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}`
	tests := []struct {
		name, spec, want string
	}{
		{"empty spec", "", "empty name"},
		{"missing file", filepath.Join(dir, "nope.json"), "neither o200k_base"},
		{"not json", write("bad.json", "{"), "tokenizer.json"},
		{"wordpiece", write("wp.json", `{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`), `model type "WordPiece"`},
		{"byte fallback", write("bf.json", `{"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0}}}`), "byte_fallback"},
		{"no pre-tokenizer", write("np.json", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`), "no pre_tokenizer"},
		{"removed split", write("rs.json", `{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed"}, `+byteLevel+`]}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`), `behavior "Removed"`},
		{"metaspace", write("ms.json", `{"pre_tokenizer": {"type": "Metaspace"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`), `pre-tokenizer "Metaspace"`},
		{"nfkc", write("nf.json", `{"normalizer": {"type": "NFKC"}, "pre_tokenizer": `+byteLevel+`, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`), `normalizer "NFKC"`},
		{"not byte level", write("nb.json", `{"pre_tokenizer": `+byteLevel+`, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`), "lacks byte 0x00"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTokenizer(tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadTokenizer error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// BenchmarkTokenizerEncode reports each tokenizer's speed on prompt-builder
// text (what the tests tokenize most) and on mixed prose and code.
func BenchmarkTokenizerEncode(b *testing.B) {
	pb, err := NewPromptBuilder(PromptOptions{BlockSize: 512, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	words, err := pb.AppendText(nil, &Record{InputLength: Ptr(8192)}, 0, 1)
	if err != nil {
		b.Fatal(err)
	}
	mixed := strings.Repeat("The server returned 503 after 2.5s; retry with `curl -sS http://host:8000/v1/completions`.\n\tif err != nil { return fmt.Errorf(\"x: %w\", err) }\n", 60)
	for _, name := range testTokenizerNames {
		tok := loadTestTokenizer(b, name)
		for _, in := range []struct{ kind, text string }{{"words", string(words)}, {"mixed", mixed}} {
			b.Run(name+"/"+in.kind, func(b *testing.B) {
				b.SetBytes(int64(len(in.text)))
				tokens := 0
				for b.Loop() {
					ids, err := tok.Encode(in.text)
					if err != nil {
						b.Fatal(err)
					}
					tokens += len(ids)
				}
				b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
