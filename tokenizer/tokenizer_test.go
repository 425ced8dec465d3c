package tokenizer_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/tokenizer"
	"github.com/kvload-exporter/kvload-exporter/tokenizer/tokenizertest"
)

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
	data, err := os.ReadFile(filepath.Join("testdata", name+".json"))
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
// encodings; see testdata/README.md).
func TestTokenizerGolden(t *testing.T) {
	for _, name := range tokenizertest.Names {
		t.Run(name, func(t *testing.T) {
			tok := tokenizertest.Load(t, name)
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
	for _, name := range tokenizertest.Names {
		t.Run(name, func(t *testing.T) {
			tok := tokenizertest.Load(t, name)
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

func TestLoadErrors(t *testing.T) {
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
			_, err := tokenizer.Load(tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
