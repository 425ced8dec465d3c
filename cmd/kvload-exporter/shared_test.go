package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
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
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		needShared(ft, missing)
	}()
	<-done
	if want := "shared traces missing: " + missing; len(ft.msg) < len(want) || ft.msg[:len(want)] != want {
		t.Errorf("message %q, want it to start with %q", ft.msg, want)
	}
	if got := needShared(t, "shared_test.go"); got != "shared_test.go" {
		t.Errorf("a present file: %q", got)
	}
}

// fatalRecorder keeps the message of Fatalf, and ends the goroutine the
// way Fatalf does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
