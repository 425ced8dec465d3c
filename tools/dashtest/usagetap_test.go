package dashtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestUsageStream: the usage an answer ends with, however its bytes are
// cut, and none where the stream did not end.
func TestUsageStream(t *testing.T) {
	const (
		plain   = `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
		content = `data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":0,"completion_tokens":0}}` + "\n\n"
		cached  = `data: {"choices":[],"usage":{"prompt_tokens":118,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":117}}}` + "\n\n"
		bare    = `data: {"choices":[],"usage":{"prompt_tokens":118,"completion_tokens":4}}` + "\r\n\r\n"
		done    = "data: [DONE]\n\n"
	)
	tests := []struct {
		name, body string
		want       usageTotals
	}{
		{"cached", content + cached + done, usageTotals{answers: 1, prompt: 118, cached: 117}},
		{"no details", ": keep-alive\n\n" + content + bare + done, usageTotals{answers: 1, prompt: 118, unreported: 1}},
		{"no [DONE]", content + cached, usageTotals{}},
		{"no usage", plain + done, usageTotals{}},
		{"malformed", "data: {\n\n" + cached + done, usageTotals{}},
		{"data after [DONE]", cached + done + content, usageTotals{}},
	}
	for _, tt := range tests {
		for _, piece := range []int{1, 7, len(tt.body)} {
			var s usageStream
			for b := []byte(tt.body); len(b) > 0; {
				n := min(piece, len(b))
				s.write(b[:n])
				b = b[n:]
			}
			var got usageTotals
			if u, ok := s.final(); ok {
				got.add(u)
			}
			if got != tt.want {
				t.Errorf("%s in pieces of %d: %+v, want %+v", tt.name, piece, got, tt.want)
			}
		}
	}
}

// TestUsageTap: answers pass through the tap unchanged and counted, and
// once closed it refuses requests.
func TestUsageTap(t *testing.T) {
	const body = `data: {"choices":[],"usage":{"prompt_tokens":20,"prompt_tokens_details":{"cached_tokens":16}}}` + "\n\ndata: [DONE]\n\n"
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(engine.Close)
	tap, addr := newUsageTap(t, strings.TrimPrefix(engine.URL, "http://"))
	client := &http.Client{Timeout: time.Minute}
	for range 3 {
		resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != body {
			t.Fatalf("through the tap: %q (%v), want %q", got, err, body)
		}
	}
	all := tap.close()
	if got, want := sum(all, time.Time{}, time.Now()), (usageTotals{answers: 3, prompt: 60, cached: 48}); got != want {
		t.Errorf("totals %+v, want %+v", got, want)
	}
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("closed tap answered %d, want 503", resp.StatusCode)
	}
}

// FuzzUsageStream: any body, cut anywhere, reads as it does whole.
func FuzzUsageStream(f *testing.F) {
	f.Add([]byte(`data: {"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}`+"\n\ndata: [DONE]\n\n"), uint8(5))
	f.Add([]byte("data: [DONE]\r\n"), uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, cut uint8) {
		var whole, pieces usageStream
		whole.write(body)
		at := min(int(cut), len(body))
		pieces.write(body[:at])
		pieces.write(body[at:])
		wu, wok := whole.final()
		pu, pok := pieces.final()
		var wt, pt usageTotals
		if wok {
			wt.add(wu)
		}
		if pok {
			pt.add(pu)
		}
		if wok != pok || wt != pt {
			t.Fatalf("whole %v %+v, cut at %d %v %+v", wok, wt, at, pok, pt)
		}
	})
}
