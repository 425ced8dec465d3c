package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

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
