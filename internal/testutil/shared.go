package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// NeedShared returns path, one of the project's copies of the Mooncake
// traces (testdata/mooncake), after checking it is there: a test
// that needs one fails saying so, rather than skipping or failing later
// with an error that does not name the cause.
func NeedShared(t testing.TB, path string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		abs, aerr := filepath.Abs(path)
		if aerr != nil {
			abs = path
		}
		t.Fatalf("Mooncake trace missing: %s (%v)", abs, err)
	}
	return path
}
