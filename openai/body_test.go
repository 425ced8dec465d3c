package openai

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// join is the body in one piece.
func (r requestBody) join() []byte { return bytes.Join(r, nil) }

func mustClient(t testing.TB, cfg TargetConfig) *Client {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = "http://127.0.0.1:1"
	}
	if cfg.Name == "" {
		cfg.Name = "t"
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestEncodeRequest(t *testing.T) {
	const m = `"model":"m",`
	const so = `"stream":true,"stream_options":{"include_usage":true}`
	chat := Request{Prompt: "Hi <there> & \"you\"\n", MaxTokens: 7}
	compl := Request{Prompt: "Once", MaxTokens: 7}
	const chatMsgs = `"messages":[{"role":"user","content":"Hi <there> & \"you\"\n"}],`
	tests := []struct {
		name    string
		dialect engine.Dialect
		api     API
		req     Request
		extra   map[string]any
		want    string
	}{
		{"openai chat", engine.DialectOpenAI, APIChat, chat, nil,
			`{` + m + chatMsgs + so + `,"max_completion_tokens":7}`},
		{"openai completions", engine.DialectOpenAI, APICompletions, compl, nil,
			`{` + m + `"prompt":"Once",` + so + `,"max_tokens":7}`},
		{"vllm chat", engine.DialectVLLM, APIChat, chat, nil,
			`{` + m + chatMsgs + so + `,"max_completion_tokens":7,"ignore_eos":true,"min_tokens":7}`},
		{"vllm completions", engine.DialectVLLM, APICompletions, compl, nil,
			`{` + m + `"prompt":"Once",` + so + `,"max_tokens":7,"ignore_eos":true,"min_tokens":7}`},
		{"vllm token ids", engine.DialectVLLM, APICompletions, Request{PromptTokenIDs: []int{151644, 0, 42}, MaxTokens: 3}, nil,
			`{` + m + `"prompt":[151644,0,42],` + so + `,"max_tokens":3,"ignore_eos":true,"min_tokens":3}`},
		{"sglang chat", engine.DialectSGLang, APIChat, chat, nil,
			`{` + m + chatMsgs + so + `,"max_tokens":7,"ignore_eos":true,"min_tokens":7}`},
		{"sglang completions", engine.DialectSGLang, APICompletions, compl, nil,
			`{` + m + `"prompt":"Once",` + so + `,"max_tokens":7,"ignore_eos":true,"min_tokens":7}`},
		{"trtllm chat", engine.DialectTRTLLM, APIChat, chat, nil,
			`{` + m + chatMsgs + so + `,"max_tokens":7,"ignore_eos":true,"min_tokens":7}`},
		{"dynamo chat", engine.DialectDynamo, APIChat, chat, nil,
			`{` + m + chatMsgs + so + `,"max_tokens":7,"ignore_eos":true,"min_tokens":7}`},
		{"llamacpp chat", engine.DialectLlamaCpp, APIChat, chat, nil,
			`{` + m + chatMsgs + so + `,"max_tokens":7,"n_predict":7,"ignore_eos":true}`},
		{"llamacpp completions", engine.DialectLlamaCpp, APICompletions, compl, nil,
			`{` + m + `"prompt":"Once",` + so + `,"max_tokens":7,"n_predict":7,"ignore_eos":true}`},
		{"ollama chat", engine.DialectOllama, APIChat, chat, nil,
			`{` + m + chatMsgs + so + `,"max_tokens":7}`},
		{"no max tokens", engine.DialectVLLM, APIChat, Request{Prompt: "x"}, nil,
			`{` + m + `"messages":[{"role":"user","content":"x"}],` + so + `}`},
		{"messages and tools verbatim", engine.DialectVLLM, APIChat, Request{
			Messages: []json.RawMessage{
				json.RawMessage(`{"role":"system","content":"Be brief."}`),
				json.RawMessage(` {"role": "user", "content": "Weather?"} `),
			},
			Tools: []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"get_weather","parameters":{}}}`)},
		}, nil,
			`{` + m + `"messages":[{"role":"system","content":"Be brief."},{"role": "user", "content": "Weather?"}],` +
				`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],` + so + `}`},
		{"extra_body then row extra, row wins", engine.DialectVLLM, APIChat, Request{
			Prompt: "x", MaxTokens: 2,
			Extra: json.RawMessage(`{"temperature":0.5,"cache_salt":"row","stream":false}`),
		}, map[string]any{"cache_salt": "target", "top_k": 1, "nested": map[any]any{"a": []any{1, "b"}}},
			`{` + m + `"messages":[{"role":"user","content":"x"}],` + so +
				`,"max_completion_tokens":2,"ignore_eos":true,"min_tokens":2,"cache_salt":"row","nested":{"a":[1,"b"]},"top_k":1,"temperature":0.5}`},
		{"payload verbatim, model and streaming forced", engine.DialectTRTLLM, APIChat, Request{
			Payload:   json.RawMessage(`{"messages":[{"role":"user","content":"p"}],"model":"other","stream":false,"max_tokens":9,"stream_options":{"include_usage":false}}`),
			MaxTokens: 3, // ignored: the payload carries its own length
			Extra:     json.RawMessage(`{"max_tokens":10}`),
		}, nil,
			`{"messages":[{"role":"user","content":"p"}],"model":"m","stream":true,"max_tokens":10,"stream_options":{"include_usage":true}}`},
		{"null extra", engine.DialectOpenAI, APICompletions, Request{Prompt: "a", Extra: json.RawMessage(`null`)}, nil,
			`{` + m + `"prompt":"a",` + so + `}`},
		{"invalid utf8 and control bytes", engine.DialectOpenAI, APICompletions, Request{Prompt: "a\xffb\x01\t"}, nil,
			`{` + m + `"prompt":"a\ufffdb\u0001\t",` + so + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustClient(t, TargetConfig{Model: "m", API: tt.api, Dialect: tt.dialect, ExtraBody: tt.extra})
			body, err := c.encodeRequest(tt.req)
			if err != nil {
				t.Fatalf("encodeRequest: %v", err)
			}
			got := body.join()
			if string(got) != tt.want {
				t.Errorf("body\n got %s\nwant %s", got, tt.want)
			}
			if !json.Valid(got) {
				t.Errorf("body is not valid JSON")
			}
		})
	}
}

func TestEncodeRequestNoModel(t *testing.T) {
	c := mustClient(t, TargetConfig{Dialect: engine.DialectLlamaCpp})
	body, err := c.encodeRequest(Request{Prompt: "x"})
	if err != nil {
		t.Fatal(err)
	}
	got := body.join()
	if want := `{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`; string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestEncodeRequestErrors(t *testing.T) {
	tests := []struct {
		name string
		api  API
		req  Request
		want string
	}{
		{"token ids on chat", APIChat, Request{PromptTokenIDs: []int{1}}, "completions API"},
		{"messages on completions", APICompletions, Request{Messages: []json.RawMessage{json.RawMessage(`{}`)}}, "chat API"},
		{"bad message", APIChat, Request{Messages: []json.RawMessage{json.RawMessage(`{`)}}, "messages"},
		{"bad tool", APIChat, Request{Prompt: "x", Tools: []json.RawMessage{json.RawMessage(`nope`)}}, "tools"},
		{"extra not an object", APIChat, Request{Prompt: "x", Extra: json.RawMessage(`[1]`)}, "extra: not a JSON object"},
		{"extra trailing data", APIChat, Request{Prompt: "x", Extra: json.RawMessage(`{} {}`)}, "extra: trailing data"},
		{"payload not an object", APIChat, Request{Payload: json.RawMessage(`"s"`)}, "payload"},
		{"payload broken", APIChat, Request{Payload: json.RawMessage(`{"a":`)}, "payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustClient(t, TargetConfig{Model: "m", API: tt.api, Dialect: engine.DialectVLLM})
			_, err := c.encodeRequest(tt.req)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestNewClientValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  TargetConfig
		want string // "" = valid
	}{
		{"defaults", TargetConfig{URL: "http://h:8000"}, ""},
		{"https with path and query", TargetConfig{URL: "https://h/prefix/?model=a", API: APICompletions, PromptFormat: PromptFormatTokenIDs}, ""},
		{"unknown dialect", TargetConfig{URL: "http://h", Dialect: "tgi"}, `dialect "tgi"`},
		{"unknown api", TargetConfig{URL: "http://h", API: "responses"}, `api "responses"`},
		{"token ids on chat", TargetConfig{URL: "http://h", PromptFormat: PromptFormatTokenIDs}, "token_ids needs api completions"},
		{"unknown prompt format", TargetConfig{URL: "http://h", PromptFormat: "bytes"}, `prompt_format "bytes"`},
		{"negative timeout", TargetConfig{URL: "http://h", RequestTimeout: -1}, "negative"},
		{"no scheme", TargetConfig{URL: "h:8000"}, "url:"},
		{"no host", TargetConfig{URL: "http://"}, "url:"},
		{"unparsable url keeps secrets out", TargetConfig{URL: "http://u:s3cret@h:port%"}, "url: cannot be parsed"},
		{"extra_body stream false", TargetConfig{URL: "http://h", ExtraBody: map[string]any{"stream": false}}, "extra_body.stream"},
		{"extra_body unencodable", TargetConfig{URL: "http://h", ExtraBody: map[string]any{"f": func() {}}}, "extra_body.f"},
		{"extra_body non-string key", TargetConfig{URL: "http://h", ExtraBody: map[string]any{"m": map[any]any{1: 2}}}, "extra_body.m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			if c != nil {
				defer c.Close()
			}
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			case err != nil && strings.Contains(err.Error(), "s3cret"):
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestNewClientEndpoint(t *testing.T) {
	tests := []struct {
		url  string
		api  API
		want string
	}{
		{"http://h:8000", APIChat, "http://h:8000/v1/chat/completions"},
		{"http://h:8000/", APICompletions, "http://h:8000/v1/completions"},
		{"https://user:pw@gw.example/llm/?model=qwen", APIChat, "https://gw.example/llm/v1/chat/completions?model=qwen"},
	}
	for _, tt := range tests {
		c := mustClient(t, TargetConfig{URL: tt.url, API: tt.api})
		if got := c.endpoint.String(); got != tt.want {
			t.Errorf("%s: endpoint %s, want %s", tt.url, got, tt.want)
		}
	}
}

// TestEncodeRequestSharesLongPrompt checks that a long prompt needing no
// escapes goes into a body over maxFlatBody as it is, without a copy, that
// a smaller body is one piece, and that the body is the same JSON as when
// the prompt is escaped into it.
func TestEncodeRequestSharesLongPrompt(t *testing.T) {
	plain := strings.Repeat("the quick brown fox ", 300) // 6,000 bytes
	small := plain[:2000]
	tests := []struct {
		name   string
		api    API
		prompt string
		shared bool
	}{
		{"chat, plain", APIChat, plain, true},
		{"completions, plain", APICompletions, plain, true},
		{"chat, plain, a small body", APIChat, small, false},
		{"completions, plain, a small body", APICompletions, small, false},
		{"short", APIChat, "the quick brown fox", false},
		{"a quote", APIChat, plain + `"`, false},
		{"a newline", APICompletions, plain + "\n", false},
		{"a backslash", APIChat, `\` + plain, false},
		{"invalid UTF-8", APIChat, plain + "\xff", false},
		{"valid UTF-8", APIChat, plain + "é", true},
		{"valid UTF-8, a small body", APIChat, small + "é", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustClient(t, TargetConfig{Model: "m", API: tt.api, Dialect: engine.DialectVLLM, ExtraBody: map[string]any{"top_k": 1}})
			req := Request{Prompt: tt.prompt, MaxTokens: 8, Extra: json.RawMessage(`{"seed":3}`)}
			body, err := c.encodeRequest(req)
			if err != nil {
				t.Fatal(err)
			}
			shared := false
			for _, p := range body {
				if len(p) > 0 && unsafe.SliceData(p) == unsafe.StringData(tt.prompt) {
					shared = true
				}
			}
			if shared != tt.shared {
				t.Errorf("prompt shared = %v, want %v", shared, tt.shared)
			}
			if body.size() <= maxFlatBody && len(body) != 1 {
				t.Errorf("a body of %d bytes in %d pieces, want one", body.size(), len(body))
			}
			got := body.join()
			if len(got) != body.size() {
				t.Errorf("size %d, joined %d bytes", body.size(), len(got))
			}
			var v map[string]any
			if err := json.Unmarshal(got, &v); err != nil {
				t.Fatalf("body is not JSON: %v", err)
			}
			var text string
			if tt.api == APIChat {
				text = v["messages"].([]any)[0].(map[string]any)["content"].(string)
			} else {
				text = v["prompt"].(string)
			}
			want := strings.ToValidUTF8(tt.prompt, "\uFFFD")
			if text != want {
				t.Errorf("prompt came back as %d bytes, want %d", len(text), len(want))
			}
			if v["seed"] != 3.0 || v["top_k"] != 1.0 || v["stream"] != true {
				t.Errorf("other members lost: %v", v)
			}
			// Each reader reads the whole body (a retry needs a second).
			for i := range 2 {
				b, _ := io.ReadAll(body.reader())
				if !bytes.Equal(b, got) {
					t.Fatalf("reader %d read %d bytes, want %d", i, len(b), len(got))
				}
			}
		})
	}
}

// BenchmarkEncodeRequest encodes the body of a 3,000-token prompt (about
// the conversation trace's mean): what each request allocates in
// proportion to its prompt.
func BenchmarkEncodeRequest(b *testing.B) {
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog, ", 3000/10)
	for _, api := range []API{APIChat, APICompletions} {
		b.Run(string(api), func(b *testing.B) {
			c := mustClient(b, TargetConfig{Model: "m", API: api, Dialect: engine.DialectVLLM})
			req := Request{Prompt: prompt, MaxTokens: 128}
			b.SetBytes(int64(len(prompt)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.encodeRequest(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestEncodeRequestCacheSalt: with a cache salt, every body carries it in
// the field the dialect takes on the API, last, over any salt that a
// payload, extra_body or the row's extra carried.
func TestEncodeRequestCacheSalt(t *testing.T) {
	const m = `"model":"m",`
	const so = `"stream":true,"stream_options":{"include_usage":true}`
	chat := Request{Prompt: "x", MaxTokens: 2}
	compl := Request{Prompt: "x", MaxTokens: 2}
	const msgs = `"messages":[{"role":"user","content":"x"}],`
	tests := []struct {
		name    string
		dialect engine.Dialect
		api     API
		req     Request
		extra   map[string]any
		want    string
	}{
		{"vllm chat", engine.DialectVLLM, APIChat, chat, nil,
			`{` + m + msgs + so + `,"max_completion_tokens":2,"ignore_eos":true,"min_tokens":2,"cache_salt":"s1"}`},
		{"vllm completions", engine.DialectVLLM, APICompletions, compl, nil,
			`{` + m + `"prompt":"x",` + so + `,"max_tokens":2,"ignore_eos":true,"min_tokens":2,"cache_salt":"s1"}`},
		{"sglang completions", engine.DialectSGLang, APICompletions, compl, nil,
			`{` + m + `"prompt":"x",` + so + `,"max_tokens":2,"ignore_eos":true,"min_tokens":2,"cache_salt":"s1"}`},
		{"trtllm chat", engine.DialectTRTLLM, APIChat, chat, nil,
			`{` + m + msgs + so + `,"max_tokens":2,"ignore_eos":true,"min_tokens":2,"cache_salt":"s1"}`},
		{"dynamo chat", engine.DialectDynamo, APIChat, chat, nil,
			`{` + m + msgs + so + `,"max_tokens":2,"ignore_eos":true,"min_tokens":2,"cache_salt":"s1"}`},
		{"over extra_body and the row's extra", engine.DialectVLLM, APIChat,
			Request{Prompt: "x", MaxTokens: 2, Extra: json.RawMessage(`{"cache_salt":"row"}`)}, map[string]any{"cache_salt": "target"},
			`{` + m + msgs + so + `,"max_completion_tokens":2,"ignore_eos":true,"min_tokens":2,"cache_salt":"s1"}`},
		{"over a payload's", engine.DialectVLLM, APIChat,
			Request{Payload: json.RawMessage(`{"messages":[],"cache_salt":"payload"}`)}, nil,
			`{"messages":[],"cache_salt":"s1","model":"m","stream":true,"stream_options":{"include_usage":true}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustClient(t, TargetConfig{Model: "m", API: tt.api, Dialect: tt.dialect, ExtraBody: tt.extra, CacheSalt: "s1"})
			body, err := c.encodeRequest(tt.req)
			if err != nil {
				t.Fatalf("encodeRequest: %v", err)
			}
			if got := string(body.join()); got != tt.want {
				t.Errorf("body\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestCacheSaltWhereNoneIsTaken: a client with a salt for a route whose
// engine takes none is refused (the salt would isolate nothing, or fail
// every request), and a client without one sends none.
func TestCacheSaltWhereNoneIsTaken(t *testing.T) {
	for _, tt := range []struct {
		d   engine.Dialect
		api API
	}{
		{engine.DialectLlamaCpp, APIChat},
		{engine.DialectOllama, APIChat},
		{engine.DialectOpenAI, APICompletions},
		{engine.DialectTRTLLM, APICompletions},
	} {
		_, err := New(TargetConfig{Name: "t", URL: "http://127.0.0.1:1", API: tt.api, Dialect: tt.d, CacheSalt: "s1"})
		if err == nil || !strings.Contains(err.Error(), "takes none on "+string(tt.api)) {
			t.Errorf("%s on %s with a salt: err %v, want a refusal", tt.d, tt.api, err)
		}
	}
	c := mustClient(t, TargetConfig{Model: "m", Dialect: engine.DialectVLLM})
	body, err := c.encodeRequest(Request{Prompt: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(body.join()); strings.Contains(got, "cache_salt") {
		t.Errorf("a client without a salt sent %s", got)
	}
}

// FuzzEncodeRequest feeds the encoder a row's prompt and its extra members
// (JSON from the trace, which merge parses): the body is JSON or the row is
// refused, every reader reads size() bytes of it, a body that fits the
// transport's write buffer is one piece, and the prompt comes back as it
// was sent (each invalid UTF-8 byte replaced, as encoding/json does).
func FuzzEncodeRequest(f *testing.F) {
	f.Add("the quick brown fox", []byte(`{"seed":3}`), false)
	f.Add(strings.Repeat("the quick brown fox ", 200), []byte(`{"max_tokens":9}`), true)
	f.Add(strings.Repeat("x", maxFlatBody-120), []byte(`null`), false)
	f.Add(strings.Repeat("é", 3000)+"\xff\"\\\n", []byte(`{"stream":false}`), true)
	f.Add("", []byte(`{"a":`), false)
	chat := mustClient(f, TargetConfig{Model: "m", API: APIChat, Dialect: engine.DialectVLLM})
	completions := mustClient(f, TargetConfig{Model: "m", API: APICompletions, Dialect: engine.DialectVLLM})
	f.Fuzz(func(t *testing.T, prompt string, extra []byte, useCompletions bool) {
		c := chat
		if useCompletions {
			c = completions
		}
		body, err := c.encodeRequest(Request{Prompt: prompt, MaxTokens: 8, Extra: extra})
		if err != nil {
			return // a bad extra is refused; the row is dropped with the error
		}
		joined := body.join()
		if len(joined) != body.size() {
			t.Fatalf("size %d, joined %d bytes", body.size(), len(joined))
		}
		if body.size() <= maxFlatBody && len(body) != 1 {
			t.Errorf("a body of %d bytes in %d pieces", body.size(), len(body))
		}
		for range 2 {
			if b, _ := io.ReadAll(body.reader()); !bytes.Equal(b, joined) {
				t.Fatalf("a reader read %d bytes, want %d", len(b), len(joined))
			}
		}
		var v map[string]any
		if err := json.Unmarshal(joined, &v); err != nil {
			t.Fatalf("body is not JSON: %v\n%q", err, joined)
		}
		if v["stream"] != true {
			t.Errorf("stream = %v, want true", v["stream"])
		}
		if bytes.Contains(extra, []byte(`"messages"`)) || bytes.Contains(extra, []byte(`"prompt"`)) {
			return // the row's extra may replace the prompt
		}
		var got any
		if useCompletions {
			got = v["prompt"]
		} else if msgs, ok := v["messages"].([]any); ok && len(msgs) == 1 {
			got = msgs[0].(map[string]any)["content"]
		}
		// encoding/json replaces each invalid byte, as the encoder does.
		quoted, _ := json.Marshal(prompt)
		var want string
		_ = json.Unmarshal(quoted, &want)
		if got != want {
			t.Errorf("prompt came back as %q, want %q", got, want)
		}
	})
}
