// Package tokenizertest loads the tokenizers that tests check prompt lengths
// and golden ids against.
package tokenizertest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/tokenizer"
)

// Names are the four tokenizers the prompt builder promises exact lengths
// for, by the names of their golden files in tokenizer/testdata.
var Names = []string{tokenizer.O200kBase, tokenizer.Cl100kBase, "qwen3", "llama3_1"}

// loaded caches tokenizers across tests: a tokenizer.json takes a good
// fraction of a second to load.
var loaded struct {
	sync.Mutex
	m map[string]tokenizer.Tokenizer
}

// Load returns a tokenizer by one of Names. The tokenizer.json files come
// from `make tokenizers` into $KVLOAD_TOKENIZER_DIR; without them the test
// fails rather than skips, so a CI run can never silently test less.
func Load(t testing.TB, name string) tokenizer.Tokenizer {
	t.Helper()
	loaded.Lock()
	defer loaded.Unlock()
	if tok, ok := loaded.m[name]; ok {
		return tok
	}
	spec := name
	if name != tokenizer.O200kBase && name != tokenizer.Cl100kBase {
		dir := os.Getenv("KVLOAD_TOKENIZER_DIR")
		if dir == "" {
			t.Fatalf("KVLOAD_TOKENIZER_DIR is not set: run `make tokenizers` and test through make (or export KVLOAD_TOKENIZER_DIR=$PWD/.cache/tokenizers)")
		}
		spec = filepath.Join(dir, name, "tokenizer.json")
		if _, err := os.Stat(spec); err != nil {
			t.Fatalf("%v: run `make tokenizers`", err)
		}
	}
	tok, err := tokenizer.Load(spec)
	if err != nil {
		t.Fatalf("tokenizer.Load(%s): %v", spec, err)
	}
	if loaded.m == nil {
		loaded.m = make(map[string]tokenizer.Tokenizer)
	}
	loaded.m[name] = tok
	return tok
}
