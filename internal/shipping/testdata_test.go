package shipping

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestShippingMooncakeTraces: the traces the tests replay are in the
// repository, intact (the sums testdata/mooncake/SOURCES.md lists), so a
// clone tests itself.
func TestShippingMooncakeTraces(t *testing.T) {
	dir := filepath.Join(shippingRoot, "testdata", "mooncake")
	sources, err := os.ReadFile(filepath.Join(dir, "SOURCES.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+\\.jsonl)` \\|[^|]*\\|[^|]*\\| `([0-9a-f]{64})` \\|")
	rows := row.FindAllStringSubmatch(string(sources), -1)
	if len(rows) != 2 {
		t.Fatalf("SOURCES.md lists %d traces with a sha256, want 2", len(rows))
	}
	for _, r := range rows {
		f, err := os.Open(filepath.Join(dir, r[1]))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != r[2] {
			t.Errorf("%s: sha256 %s, SOURCES.md says %s", r[1], got, r[2])
		}
	}
}

// sharedReference is a path into the directory beside the checkout,
// which a clone does not have.
var sharedReference = regexp.MustCompile(`\.\./shared\b|"\.\.",\s*"shared"`)

// TestShippingNothingReadsShared: no tracked source, script or make file
// reaches outside the repository for its inputs.
func TestShippingNothingReadsShared(t *testing.T) {
	out, err := exec.Command("git", "-C", shippingRoot, "ls-files").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	checked := 0
	for _, name := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		base := filepath.Base(name)
		if !(strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".sh") || strings.HasSuffix(name, ".py") ||
			base == "Makefile" || base == "Dockerfile" || strings.HasPrefix(name, ".ci/")) {
			continue
		}
		f, err := os.Open(filepath.Join(shippingRoot, name))
		if err != nil {
			continue // deleted in the working tree
		}
		checked++
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for line := 1; sc.Scan(); line++ {
			text := sc.Text()
			if strings.Contains(text, "shared/docs") || name == "internal/shipping/testdata_test.go" {
				continue // a pointer for the reader, not an input
			}
			if sharedReference.MatchString(text) {
				t.Errorf("%s:%d reads beside the checkout: %s", name, line, strings.TrimSpace(text))
			}
		}
		f.Close()
	}
	if checked < 100 {
		t.Fatalf("checked %d files: the listing went wrong", checked)
	}
}
