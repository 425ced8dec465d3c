package openai

import (
	"strings"
	"testing"
)

// TestOutcomeIsError: the outcomes that count as errors are the
// target's and the network's failures, not a cancel or an abandon.
func TestOutcomeIsError(t *testing.T) {
	var errs []string
	for _, o := range Outcomes {
		if o.IsError() {
			errs = append(errs, string(o))
		}
	}
	if got, want := strings.Join(errs, " "), "http_error stream_error timeout connection_error"; got != want {
		t.Errorf("errors %q, want %q", got, want)
	}
}
