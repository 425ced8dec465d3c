package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestTokenizeRequests: each engine is asked on its own route, in its own
// body, without special tokens where it takes the flag (the engines'
// documented shapes, ../shared/docs/engines-and-conventions.md).
func TestTokenizeRequests(t *testing.T) {
	tests := []struct {
		dialect Dialect
		path    string
		body    string
	}{
		{DialectVLLM, "/tokenize", `{"model":"m","prompt":" a b","add_special_tokens":false}`},
		{DialectDynamo, "/tokenize", `{"model":"m","prompt":" a b","add_special_tokens":false}`},
		{DialectSGLang, "/v1/tokenize", `{"model":"m","prompt":" a b","add_special_tokens":false}`},
		{DialectTRTLLM, "/_internal/tokenize", `{"model":"m","prompt":" a b"}`},
		{DialectLlamaCpp, "/tokenize", `{"content":" a b","add_special":false}`},
	}
	for _, tt := range tests {
		t.Run(string(tt.dialect), func(t *testing.T) {
			var path, body string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				path, body = r.URL.Path, string(b)
				io.WriteString(w, `{"tokens": [4, 5]}`)
			}))
			defer srv.Close()
			ids, err := tokenize(t, For(tt.dialect), srv.Client(), srv.URL+"/", " a b")
			if err != nil {
				t.Fatal(err)
			}
			if path != tt.path || body != tt.body || !slices.Equal(ids, []int{4, 5}) {
				t.Errorf("POST %s %s -> %v, want POST %s %s -> [4 5]", path, body, ids, tt.path, tt.body)
			}
		})
	}
	for _, d := range []Dialect{DialectOpenAI, DialectOllama} {
		if For(d).CanTokenize() {
			t.Errorf("%s has a tokenize endpoint?", d)
		}
		if _, err := For(d).Tokenize(t.Context(), http.DefaultClient, "http://127.0.0.1:1", "m", "x", nil); !errors.Is(err, ErrNoEndpoint) {
			t.Errorf("%s: %v, want ErrNoEndpoint", d, err)
		}
	}
}

// TestTokenizeAnswers: what a server may answer, and what it must not.
func TestTokenizeAnswers(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   []int
		err    string
	}{
		{"ids", 200, `{"tokens": [1, 2, 3]}`, []int{1, 2, 3}, ""},
		{"ids with count", 200, `{"count": 2, "tokens": [1, 2], "max_model_len": 8192}`, []int{1, 2}, ""},
		{"pieces", 200, `{"tokens": [{"id": 9, "piece": " a"}, {"id": 8, "piece": " b"}]}`, []int{9, 8}, ""},
		{"pieces as bytes", 200, `{"tokens": [{"piece": [226, 150], "id": 9}], "extra": {"a": [1, {"b": null}]}}`, []int{9}, ""},
		{"empty list", 200, `{"tokens": []}`, []int{}, ""},
		{"count disagrees", 200, `{"count": 3, "tokens": [1, 2]}`, nil, "count 3 but 2 tokens"},
		{"no tokens", 200, `{"count": 2}`, nil, "no tokens list"},
		{"not JSON", 200, `<html>`, nil, "not a JSON object"},
		{"two objects", 200, `{"tokens": [1]} {"tokens": [2]}`, nil, "more after its object"},
		{"two lists", 200, `{"tokens": [1], "tokens": [2]}`, nil, "two tokens lists"},
		{"count not whole", 200, `{"tokens": [1], "count": 1.5}`, nil, "count is not a whole number"},
		{"a fractional id", 200, `{"tokens": [1.5]}`, nil, "neither an id nor"},
		{"a list as a token", 200, `{"tokens": [[1]]}`, nil, "neither an id nor"},
		// "x" is one byte: a BOS, an EOS and a few control tokens may
		// come with its token, but no more.
		{"as many as a byte may make", 200, `{"tokens": [` + strings.TrimSuffix(strings.Repeat("1,", 1+maxExtraTokens), ",") + `]}`, slices.Repeat([]int{1}, 1+maxExtraTokens), ""},
		{"more than a byte may make", 200, `{"tokens": [` + strings.TrimSuffix(strings.Repeat("1,", 2+maxExtraTokens), ",") + `]}`, nil, "more than 17 tokens"},
		{"strings", 200, `{"tokens": ["a"]}`, nil, "neither an id nor"},
		{"piece without id", 200, `{"tokens": [{"piece": "a"}]}`, nil, "neither an id nor"},
		{"not found", 404, `{"detail": "Not Found"}`, nil, "HTTP 404: {\"detail\": \"Not Found\"}"},
		{"redirect", 302, ``, nil, "redirect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.status == 302 {
					w.Header().Set("Location", "http://elsewhere.invalid/")
				}
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			c := srv.Client()
			NoRedirects(c)
			ids, err := tokenize(t, For(DialectVLLM), c, srv.URL, "x")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), srv.URL) {
					t.Fatalf("error %v, want one naming %s and containing %q", err, srv.URL, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(ids, tt.want) {
				t.Fatalf("%v, %v; want %v", ids, err, tt.want)
			}
		})
	}
}

// FuzzCountTokens: any answer gives a count or an error, never a panic;
// a count only for a whole JSON object whose count (if any) agrees, with
// the ids a plain decoding of the whole answer finds, and never more
// than the limit.
func FuzzCountTokens(f *testing.F) {
	for _, s := range []string{`{"tokens": [1, 2]}`, `{"count": 1, "tokens": [{"id": 3, "piece": "x"}]}`, `{"tokens": null}`, `[]`,
		`{"tokens": [1.5]}`, `{"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9]}`, `{"a": [{"b": [1]}], "tokens": [{"piece": [1], "id": 2, "id": 3}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var ids []int
		n, err := CountTokens(bytes.NewReader(b), 8, func(id int) { ids = append(ids, id) })
		if err != nil {
			return
		}
		if !json.Valid(b) || n > 8 || n != len(ids) {
			t.Fatalf("accepted %d ids %v of %q", n, ids, b)
		}
		want, err := decodeTokens(b)
		if err != nil || !slices.Equal(ids, want) {
			t.Fatalf("ids %v, a whole decoding gives %v, %v", ids, want, err)
		}
	})
}

// decodeTokens decodes a tokenize answer whole, as the fuzz target's
// reference.
func decodeTokens(b []byte) ([]int, error) {
	var ans map[string]json.RawMessage
	if err := json.Unmarshal(b, &ans); err != nil {
		return nil, err
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(ans["tokens"], &raw); err != nil {
		return nil, err
	}
	if c, ok := ans["count"]; ok {
		var n int
		if err := json.Unmarshal(c, &n); err != nil || n != len(raw) {
			return nil, fmt.Errorf("count %s for %d tokens", c, len(raw))
		}
	}
	ids := make([]int, len(raw))
	for i, r := range raw {
		if json.Unmarshal(r, &ids[i]) == nil {
			continue
		}
		var piece map[string]json.RawMessage
		if err := json.Unmarshal(r, &piece); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(piece["id"], &ids[i]); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// tokenize is Tokenize's ids, collected.
func tokenize(t *testing.T, s *Spec, c *http.Client, base, text string) ([]int, error) {
	ids := []int{}
	n, err := s.Tokenize(t.Context(), c, base, "m", text, func(id int) { ids = append(ids, id) })
	if err == nil && n != len(ids) {
		t.Errorf("Tokenize counted %d, handed %d ids", n, len(ids))
	}
	return ids, err
}

// TestTokenizeChat: vLLM is asked for the chat form of /tokenize, llama.cpp
// renders the messages with /apply-template and tokenizes that text as its
// chat route does (special tokens added and parsed); other engines have no
// chat form, and a rendering without a prompt is an error naming the route.
func TestTokenizeChat(t *testing.T) {
	tests := []struct {
		dialect Dialect
		calls   []string // path and body of each request, in order
		render  string   // /apply-template's answer
		err     string
	}{
		{DialectVLLM, []string{`/tokenize {"model":"m","messages":[{"role":"user","content":" a b"}],"add_generation_prompt":true}`}, "", ""},
		{DialectLlamaCpp, []string{
			`/apply-template {"messages":[{"role":"user","content":" a b"}]}`,
			`/tokenize {"content":"\u003cs\u003euser: a b\nassistant:","add_special":true,"parse_special":true}`,
		}, `{"prompt": "<s>user: a b\nassistant:"}`, ""},
		{DialectLlamaCpp, []string{`/apply-template {"messages":[{"role":"user","content":" a b"}]}`}, `{"text": "x"}`, "no prompt string"},
	}
	for _, tt := range tests {
		t.Run(string(tt.dialect)+tt.err, func(t *testing.T) {
			var calls []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				calls = append(calls, r.URL.Path+" "+string(b))
				if r.URL.Path == "/apply-template" {
					io.WriteString(w, tt.render)
					return
				}
				io.WriteString(w, `{"tokens": [4, 5, 6]}`)
			}))
			defer srv.Close()
			if !For(tt.dialect).CanTokenizeChat() {
				t.Fatalf("CanTokenizeChat(%s) = false", tt.dialect)
			}
			n, err := For(tt.dialect).TokenizeChat(t.Context(), srv.Client(), srv.URL, "m", " a b")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), srv.URL+"/apply-template") {
					t.Errorf("error %v, want one naming the route and containing %q", err, tt.err)
				}
			} else if err != nil || n != 3 {
				t.Errorf("%v, %v; want 3", n, err)
			}
			if !slices.Equal(calls, tt.calls) {
				t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(tt.calls, "\n"))
			}
		})
	}
	for _, d := range []Dialect{DialectSGLang, DialectTRTLLM, DialectDynamo, DialectOpenAI} {
		if For(d).CanTokenizeChat() {
			t.Errorf("%s has a chat tokenize form?", d)
		}
		if _, err := For(d).TokenizeChat(t.Context(), http.DefaultClient, "http://127.0.0.1:1", "m", "x"); !errors.Is(err, ErrNoEndpoint) {
			t.Errorf("%s: %v, want ErrNoEndpoint", d, err)
		}
	}
}

// TestTokenizeAbsurdAnswer: an answer of 2M ids for a prompt of a few
// bytes is refused as soon as its count passes what the text could make,
// and reading it allocates next to nothing: such an answer once cost
// 250 MB to parse, and 20 targets giving it at once 4.2 GB.
func TestTokenizeAbsurdAnswer(t *testing.T) {
	const ids = 2_000_000 // under the body bound: read whole before
	body := []byte(`{"tokens": [` + strings.TrimSuffix(strings.Repeat("1,", ids), ",") + `]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(body)
	}))
	defer srv.Close()
	text := strings.Repeat(" word", 512)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n, err := For(DialectVLLM).Tokenize(t.Context(), srv.Client(), srv.URL, "m", text, nil)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTooManyTokens) || !strings.Contains(err.Error(), srv.URL) {
		t.Fatalf("%d, %v; want ErrTooManyTokens naming the route", n, err)
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d bytes allocated reading the answer (%d bytes, %d ids)", allocated, len(body), ids)
	if allocated > 4<<20 {
		t.Errorf("%d bytes allocated reading the answer, want at most 4 MiB", allocated)
	}
}

// TestTokenizeAnswerTooLarge: an answer past the body bound is an error
// saying so, never read as the part of it that fit.
func TestTokenizeAnswerTooLarge(t *testing.T) {
	body := `{"tokens": [1, 2]` + strings.Repeat(" ", maxTokenizeBody) + `}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	}))
	defer srv.Close()
	n, err := For(DialectVLLM).Tokenize(t.Context(), srv.Client(), srv.URL, "m", "a b", nil)
	if !errors.Is(err, ErrAnswerTooLarge) {
		t.Fatalf("%d, %v; want ErrAnswerTooLarge", n, err)
	}
	// Just under the bound is an answer like any other.
	body = `{"tokens": [1, 2]` + strings.Repeat(" ", maxTokenizeBody-len(`{"tokens": [1, 2]}`)) + `}`
	if n, err := For(DialectVLLM).Tokenize(t.Context(), srv.Client(), srv.URL, "m", "a b", nil); err != nil || n != 2 {
		t.Fatalf("%d, %v; want 2 tokens", n, err)
	}
}
