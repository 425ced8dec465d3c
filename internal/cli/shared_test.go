package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// needShared returns path, one of the project's shared traces (beside the
// repository, in ../shared/traces), after checking it is there: a test
// that needs one fails saying so, rather than skipping or failing later
// with an error that does not name the cause.
func needShared(t testing.TB, path string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		abs, aerr := filepath.Abs(path)
		if aerr != nil {
			abs = path
		}
		t.Fatalf("shared traces missing: %s (%v)", abs, err)
	}
	return path
}

// TestNeedShared: a missing shared trace fails the test with a message
// naming it.
func TestNeedShared(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "traces", "nope.jsonl")
	msg := testutil.FatalMessage(t, func(tb testing.TB) { needShared(tb, missing) })
	if want := "shared traces missing: " + missing; !strings.HasPrefix(msg, want) {
		t.Errorf("message %q, want it to start with %q", msg, want)
	}
	if got := needShared(t, "shared_test.go"); got != "shared_test.go" {
		t.Errorf("a present file: %q", got)
	}
}
