package engine

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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
			ids, err := For(tt.dialect).Tokenize(t.Context(), srv.Client(), srv.URL+"/", "m", " a b")
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
		if _, err := For(d).Tokenize(t.Context(), http.DefaultClient, "http://127.0.0.1:1", "m", "x"); !errors.Is(err, ErrNoEndpoint) {
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
		{"empty list", 200, `{"tokens": []}`, []int{}, ""},
		{"count disagrees", 200, `{"count": 3, "tokens": [1, 2]}`, nil, "count 3 but 2 tokens"},
		{"no tokens", 200, `{"count": 2}`, nil, "no tokens list"},
		{"not JSON", 200, `<html>`, nil, "not a JSON object"},
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
			ids, err := For(DialectVLLM).Tokenize(t.Context(), c, srv.URL, "m", "x")
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

// FuzzParseTokens: any answer gives ids or an error, never a panic, and
// ids only when the answer's count (if any) agrees.
func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{`{"tokens": [1, 2]}`, `{"count": 1, "tokens": [{"id": 3, "piece": "x"}]}`, `{"tokens": null}`, `[]`, `{"tokens": [1.5]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, err := ParseTokens(b)
		if err != nil {
			return
		}
		var ans struct {
			Count *int `json:"count"`
		}
		if json.Unmarshal(b, &ans) == nil && ans.Count != nil && *ans.Count != len(ids) {
			t.Fatalf("count %d accepted with %d ids", *ans.Count, len(ids))
		}
	})
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
			ids, err := For(tt.dialect).TokenizeChat(t.Context(), srv.Client(), srv.URL, "m", " a b")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), srv.URL+"/apply-template") {
					t.Errorf("error %v, want one naming the route and containing %q", err, tt.err)
				}
			} else if err != nil || !slices.Equal(ids, []int{4, 5, 6}) {
				t.Errorf("%v, %v; want [4 5 6]", ids, err)
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
