package openai

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
)

func TestCheckSessionHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string // "" means accepted
	}{
		{"X-Session-ID", ""},
		{"x-dynamo-session", ""},
		{"Session~1", ""},
		{"", "not a header name"},
		{"X Session", `holds ' '`},
		{"X-Sessión", "not a header name"},
		{"X-Session:", `holds ':'`},
		{"content-type", "sets itself"},
		{"Authorization", "sets itself"},
		{"Transfer-Encoding", "sets itself"},
	} {
		err := CheckSessionHeader(tc.name)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckSessionHeader(%q) = %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(TargetConfig{URL: "http://x", SessionHeader: "Host"}); err == nil || !strings.Contains(err.Error(), "session_header") {
		t.Errorf("New with session header Host: %v", err)
	}
}

// TestSessionHeaderSent: a client with a session header sends each
// request's session in it, encoded where needed, and none for a request
// without one; a client without one sends none.
func TestSessionHeaderSent(t *testing.T) {
	var mu sync.Mutex
	var got []string
	stream := replayHandler(t, "vllm_chat.sse")
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, strings.Join(r.Header.Values("X-Session-ID"), ","))
		mu.Unlock()
		stream(w, r)
	}))
	for _, header := range []string{"X-Session-ID", ""} {
		c, err := New(TargetConfig{URL: srv.URL, SessionHeader: header})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"conv-7", "", "a b/ä"} {
			var res Response
			c.Do(t.Context(), Request{Prompt: "hi", MaxTokens: 1, Session: s}, &res)
			if res.Outcome != OutcomeSuccess {
				t.Fatalf("outcome %s: %s", res.Outcome, res.Error)
			}
		}
		c.Close()
	}
	want := []string{"conv-7", "", "a%20b%2F%C3%A4", "", "", ""}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("session headers %q, want %q", got, want)
	}
}

// FuzzSessionValue: whatever a trace's session id holds, its header value
// is visible ASCII that a server can read back to the id.
func FuzzSessionValue(f *testing.F) {
	for _, s := range []string{"s1", "sess ä", "a\r\nX-Evil: 1", "\x00", "%41", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := sessionValue(s)
		for i := range len(v) {
			if c := v[i]; c <= ' ' || c >= 0x7f {
				t.Fatalf("sessionValue(%q) = %q holds byte %#x", s, v, c)
			}
		}
		if v == s {
			return
		}
		if back, err := url.PathUnescape(v); err != nil || back != s {
			t.Fatalf("sessionValue(%q) = %q reads back as %q (%v)", s, v, back, err)
		}
	})
}
