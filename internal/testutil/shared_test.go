package testutil

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestNeedShared: a missing Mooncake trace fails the test with a message
// naming it.
func TestNeedShared(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "traces", "nope.jsonl")
	msg := FatalMessage(t, func(tb testing.TB) { NeedShared(tb, missing) })
	if want := "Mooncake trace missing: " + missing; !strings.HasPrefix(msg, want) {
		t.Errorf("message %q, want it to start with %q", msg, want)
	}
	if got := NeedShared(t, "shared_test.go"); got != "shared_test.go" {
		t.Errorf("a present file: %q", got)
	}
}
