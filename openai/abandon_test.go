package openai

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// TestClientAbandons: a request told to abandon closes its stream after
// its tokens or its time, with outcome abandoned; the server sees the
// client leave; a stream that ends first is a success.
func TestClientAbandons(t *testing.T) {
	const token = "data: {\"choices\":[{\"delta\":{\"content\":\"t\"}}]}\n\n"
	const end = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n"
	// stream writes tokens chunks, then the end, or, with hold, waits
	// for the client to leave and reports it on left.
	stream := func(tokens int, hold bool, left chan<- struct{}) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			for range tokens {
				_, _ = io.WriteString(w, token)
				_ = rc.Flush()
			}
			if !hold {
				_, _ = io.WriteString(w, end)
				return
			}
			<-r.Context().Done()
			left <- struct{}{}
		}
	}
	tests := []struct {
		name    string
		tokens  int
		hold    bool // the server never ends the stream by itself
		abandon Abandon
		want    want
	}{
		{"after two tokens", 5, true, Abandon{AfterTokens: 2},
			want{outcome: OutcomeAbandoned, status: 200, errSub: "closed after 2 tokens", content: true, output: 2}},
		{"after a duration", 1, true, Abandon{After: 30 * time.Millisecond},
			want{outcome: OutcomeAbandoned, status: 200, errSub: "abandon.after", content: true, output: 1}},
		{"ends before its tokens", 3, false, Abandon{AfterTokens: 4},
			want{outcome: OutcomeSuccess, status: 200, content: true, output: 3}},
		{"not told to abandon", 3, false, Abandon{},
			want{outcome: OutcomeSuccess, status: 200, content: true, output: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			left := make(chan struct{}, 1)
			srv := newServer(t, stream(tt.tokens, tt.hold, left))
			c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM, RequestTimeout: time.Hour})
			var res Response
			c.Do(context.Background(), Request{Prompt: "x", Abandon: tt.abandon}, &res)
			checkResult(t, &res, tt.want)
			if tt.hold {
				<-left // the server saw the stream closed
			}
			if res.Outcome.IsError() {
				t.Errorf("outcome %s counts as an error", res.Outcome)
			}
		})
	}
}

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
