package testutil

import (
	"fmt"
	"strings"
	"testing"
)

func TestBuffer(t *testing.T) {
	var b Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			fmt.Fprint(&b, "x")
		}
	}()
	_ = b.String() // concurrently with the writes: -race checks it
	<-done
	if got := b.String(); got != strings.Repeat("x", 100) {
		t.Errorf("%q", got)
	}
}
