package testutil

import (
	"fmt"
	"runtime"
	"testing"
)

// fatalRecorder keeps the message of Fatalf and ends the goroutine as
// Fatalf does; it has no deadline of its own, so the kit's ceiling
// applies to the waits run against it.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// FatalMessage runs fn against a recorder standing in for t and returns
// what fn failed with through Fatalf ("" if it did not): for tests of
// helpers whose job is to fail a test.
func FatalMessage(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(ft)
	}()
	<-done
	return ft.msg
}
