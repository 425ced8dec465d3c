package lifecycle

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// TestFailureLog: the first failure of a streak is logged at once, later
// ones at most once per interval with their counts, and the first success
// after a logged streak says so once.
func TestFailureLog(t *testing.T) {
	type step struct {
		at      time.Duration // since the start
		outcome openai.Outcome
		err     string
	}
	tests := []struct {
		name  string
		steps []step
		want  []string // log lines, with the time fields removed
	}{
		{"successes only", []step{{0, openai.OutcomeSuccess, ""}, {time.Second, openai.OutcomeSuccess, ""}}, nil},
		{"dead endpoint", []step{
			{0, openai.OutcomeConnectionError, "dial tcp: connection refused"},
			{time.Second, openai.OutcomeConnectionError, "dial tcp: connection refused"},
			{2 * time.Second, openai.OutcomeTimeout, "request_timeout 1s expired"},
			{31 * time.Second, openai.OutcomeConnectionError, "dial tcp: connection refused"},
			{32 * time.Second, openai.OutcomeSuccess, ""},
			{33 * time.Second, openai.OutcomeSuccess, ""},
		}, []string{
			`level=warn msg="requests failing" failed=1 outcomes="connection_error=1" last_error="dial tcp: connection refused"`,
			`level=warn msg="requests failing" failed=3 outcomes="connection_error=2,timeout=1" last_error="dial tcp: connection refused" since=31s`,
			`level=info msg="requests succeed again"`,
		}},
		{"failures between successes", []step{
			{0, openai.OutcomeHTTPError, "HTTP 500: boom"},
			{time.Second, openai.OutcomeStreamError, "malformed chunk"},
			{2 * time.Second, openai.OutcomeSuccess, ""},
			{3 * time.Second, openai.OutcomeHTTPError, "HTTP 429: slow down"},
		}, []string{
			`level=warn msg="requests failing" failed=1 outcomes="http_error=1" last_error="HTTP 500: boom"`,
			`level=warn msg="requests failed before recovering" failed=1 outcomes="stream_error=1" last_error="malformed chunk" since=2s`,
			`level=info msg="requests succeed again"`,
			`level=warn msg="requests failing" failed=1 outcomes="http_error=1" last_error="HTTP 429: slow down"`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			now := start
			f := newFailureLog(log.NewLogfmtLogger(&buf))
			f.now = func() time.Time { return now }
			for _, s := range tt.steps {
				now = start.Add(s.at)
				f.observe(&replay.Result{Response: openai.Response{Outcome: s.outcome, Error: s.err}})
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
				if l != "" {
					got = append(got, l)
				}
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
