package emulate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
)

func chatBody(content string, extra map[string]any) map[string]any {
	b := map[string]any{
		"model":    DefaultModel,
		"messages": []map[string]any{{"role": "user", "content": content}},
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func TestStreamShapes(t *testing.T) {
	tests := []struct {
		name      string
		path      string
		body      map[string]any
		chat      bool
		wantUsage bool
		wantToks  int
	}{
		{"chat with usage", "/v1/chat/completions",
			chatBody("hello there", map[string]any{"stream": true, "max_tokens": 5, "stream_options": map[string]any{"include_usage": true}}),
			true, true, 5},
		{"chat usage defaults on with stream_options", "/v1/chat/completions",
			chatBody("hello there", map[string]any{"stream": true, "max_completion_tokens": 3, "stream_options": map[string]any{}}),
			true, true, 3},
		{"chat without usage", "/v1/chat/completions",
			chatBody("hello there", map[string]any{"stream": true, "max_tokens": 4}),
			true, false, 4},
		{"chat include_usage false", "/v1/chat/completions",
			chatBody("hello there", map[string]any{"stream": true, "max_tokens": 2, "stream_options": map[string]any{"include_usage": false}}),
			true, false, 2},
		{"completion with usage", "/v1/completions",
			map[string]any{"prompt": "Once upon a time", "stream": true, "max_tokens": 6, "stream_options": map[string]any{"include_usage": true}},
			false, true, 6},
		{"completion default length", "/v1/completions",
			map[string]any{"prompt": "Once upon a time", "stream": true},
			false, false, defaultMaxTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, srv := newTestServer(t, Config{})
			resp := post(t, context.Background(), srv.URL+tt.path, tt.body)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("Content-Type %q", ct)
			}
			events, err := readSSE(resp.Body)
			if err != nil {
				t.Fatalf("readSSE: %v", err)
			}
			if n := len(events); n == 0 || events[n-1] != "[DONE]" {
				t.Fatalf("stream does not end with [DONE]: %q", events)
			}
			events = events[:len(events)-1]
			var chunks []wireChunk
			for _, ev := range events {
				var c wireChunk
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatalf("chunk %q: %v", ev, err)
				}
				chunks = append(chunks, c)
			}
			wantObject := "text_completion"
			if tt.chat {
				wantObject = "chat.completion.chunk"
			}
			for i, c := range chunks {
				if c.Object != wantObject || c.Model != DefaultModel || c.ID == "" || c.ID != chunks[0].ID {
					t.Errorf("chunk %d: object %q model %q id %q", i, c.Object, c.Model, c.ID)
				}
			}
			if tt.chat {
				// A role-only first chunk, as vLLM sends.
				d := chunks[0].Choices[0].Delta
				if d == nil || d.Role == nil || *d.Role != "assistant" || d.Content == nil || *d.Content != "" {
					t.Fatalf("first chunk is not role-only: %s", events[0])
				}
				chunks = chunks[1:]
			}
			var usage *wireUsage
			if tt.wantUsage {
				last := chunks[len(chunks)-1]
				if len(last.Choices) != 0 || last.Usage == nil || !strings.Contains(events[len(events)-1], `"choices":[]`) {
					t.Fatalf("last chunk is not a usage chunk: %s", events[len(events)-1])
				}
				usage = last.Usage
				chunks = chunks[:len(chunks)-1]
			}
			if len(chunks) != tt.wantToks {
				t.Fatalf("%d token chunks, want %d", len(chunks), tt.wantToks)
			}
			var text strings.Builder
			for i, c := range chunks {
				if len(c.Choices) != 1 || c.Usage != nil {
					t.Fatalf("token chunk %d: %s", i, events[i])
				}
				ch := c.Choices[0]
				var piece *string
				if tt.chat {
					if ch.Delta == nil || ch.Delta.Role != nil {
						t.Fatalf("token chunk %d has no delta or repeats the role", i)
					}
					piece = ch.Delta.Content
				} else {
					piece = ch.Text
				}
				if piece == nil || *piece == "" {
					t.Fatalf("token chunk %d carries no text", i)
				}
				text.WriteString(*piece)
				isLast := i == len(chunks)-1
				if isLast != (ch.FinishReason != nil) || (isLast && *ch.FinishReason != "length") {
					t.Fatalf("token chunk %d finish_reason %v", i, ch.FinishReason)
				}
			}
			ids, err := e.tok.Encode(text.String())
			if err != nil || len(ids) != tt.wantToks {
				t.Fatalf("output re-tokenizes to %d tokens (%v), want %d", len(ids), err, tt.wantToks)
			}
			st := e.Stats()
			if st.Success != 1 || st.CompletionTokens != int64(tt.wantToks) {
				t.Fatalf("stats %+v", st)
			}
			if usage != nil {
				if usage.CompletionTokens != tt.wantToks || usage.PromptTokens != int(st.PromptTokens) ||
					usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens || usage.cached(t) != 0 {
					t.Fatalf("usage %+v, stats %+v", usage, st)
				}
			}
		})
	}
}

func TestNonStreaming(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		body       map[string]any
		wantObject string
		wantToks   int
	}{
		{"chat", "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 7}), "chat.completion", 7},
		{"chat default length", "/v1/chat/completions", chatBody("hi", nil), "chat.completion", defaultMaxTokens},
		{"chat max_completion_tokens wins", "/v1/chat/completions",
			chatBody("hi", map[string]any{"max_tokens": 7, "max_completion_tokens": 9, "ignore_eos": true, "min_tokens": 9}), "chat.completion", 9},
		{"chat stream false", "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 1, "stream": false}), "chat.completion", 1},
		{"completion", "/v1/completions", map[string]any{"prompt": "abc", "max_tokens": 100}, "text_completion", 100},
		{"completion list of strings", "/v1/completions", map[string]any{"prompt": []string{"abc", "ignored"}, "max_tokens": 3}, "text_completion", 3},
		{"completion token ids", "/v1/completions", map[string]any{"prompt": []int{1, 2, 3}, "max_tokens": 3}, "text_completion", 3},
		{"completion nested token ids", "/v1/completions", map[string]any{"prompt": [][]int{{1, 2, 3}}, "max_tokens": 3}, "text_completion", 3},
		{"unknown fields ignored", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 2, "temperature": 0.5, "whatever": []int{1}}, "text_completion", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, srv := newTestServer(t, Config{})
			var c wireChunk
			postDecode(t, srv.URL+tt.path, tt.body, http.StatusOK, &c)
			if c.Object != tt.wantObject || len(c.Choices) != 1 || c.Usage == nil {
				t.Fatalf("response %+v", c)
			}
			ch := c.Choices[0]
			var text string
			if tt.wantObject == "chat.completion" {
				if ch.Message == nil || ch.Message.Role != "assistant" {
					t.Fatalf("message %+v", ch.Message)
				}
				text = ch.Message.Content
			} else {
				text = *ch.Text
			}
			if ch.FinishReason == nil || *ch.FinishReason != "length" {
				t.Fatalf("finish_reason %v", ch.FinishReason)
			}
			ids, _ := e.tok.Encode(text)
			if len(ids) != tt.wantToks || c.Usage.CompletionTokens != tt.wantToks {
				t.Fatalf("output %d tokens, usage %d, want %d", len(ids), c.Usage.CompletionTokens, tt.wantToks)
			}
			if c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens || c.Usage.PromptTokens == 0 {
				t.Fatalf("usage %+v", c.Usage)
			}
		})
	}
}

// The prompt of a token-id request is its length, untouched.
func TestTokenIDPromptLength(t *testing.T) {
	_, srv := newTestServer(t, Config{})
	if u := complete(t, srv.URL, seq(100, 37), nil); u.PromptTokens != 37 {
		t.Fatalf("prompt_tokens %d, want 37", u.PromptTokens)
	}
}

func TestOmitCachedTokens(t *testing.T) {
	_, srv := newTestServer(t, Config{OmitCachedTokens: true})
	resp := post(t, context.Background(), srv.URL+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 1})
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(data), `"prompt_tokens_details":null`) {
		t.Fatalf("body %s", data)
	}
}

func TestRejects(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		body       any
		wantStatus int
		wantParam  string
	}{
		{"stream_options without stream", "/v1/chat/completions",
			chatBody("x", map[string]any{"stream_options": map[string]any{"include_usage": true}}), 400, "stream_options"},
		{"stream_options with stream false", "/v1/completions",
			map[string]any{"prompt": "x", "stream": false, "stream_options": map[string]any{"include_usage": true}}, 400, "stream_options"},
		{"unknown model", "/v1/completions", map[string]any{"model": "gpt-9", "prompt": "x"}, 404, "model"},
		{"max_tokens zero", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 0}, 400, "max_tokens"},
		{"n two", "/v1/completions", map[string]any{"prompt": "x", "n": 2}, 400, "n"},
		{"context too long", "/v1/completions", map[string]any{"prompt": seq(0, 100), "max_tokens": 29}, 400, "max_tokens"},
		{"empty prompt", "/v1/completions", map[string]any{"prompt": ""}, 400, "prompt"},
		{"empty prompt list", "/v1/completions", map[string]any{"prompt": []int{}}, 400, "prompt"},
		{"no prompt", "/v1/completions", map[string]any{}, 400, "prompt"},
		{"negative token id", "/v1/completions", map[string]any{"prompt": []int{1, -2}}, 400, "prompt"},
		{"float token id", "/v1/completions", `{"prompt": [1, 2.5]}`, 400, "prompt"},
		{"bad json", "/v1/completions", `{"prompt": `, 400, ""},
		{"empty body", "/v1/chat/completions", ``, 400, ""},
		{"no messages", "/v1/chat/completions", map[string]any{"messages": []any{}}, 400, "messages"},
		{"image part", "/v1/chat/completions",
			map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url", "image_url": map[string]any{"url": "x"}}}}}}, 400, "messages"},
		{"too large", "/v1/completions", `{"prompt": "` + strings.Repeat("a", 2048) + `"}`, 413, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, srv := newTestServer(t, Config{MaxModelLen: 128, MaxBodyBytes: 1024})
			var body struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    int     `json:"code"`
				} `json:"error"`
			}
			postDecode(t, srv.URL+tt.path, tt.body, tt.wantStatus, &body)
			got := body.Error
			if got.Message == "" || got.Type == "" || got.Code != tt.wantStatus {
				t.Fatalf("error body %+v", got)
			}
			if (tt.wantParam == "") != (got.Param == nil) || (got.Param != nil && *got.Param != tt.wantParam) {
				t.Fatalf("param %v, want %q", got.Param, tt.wantParam)
			}
			if st := e.Stats(); st.Rejected != 1 || st.CacheQueryTokens != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestChatContentForms(t *testing.T) {
	_, srv := newTestServer(t, Config{})
	count := func(messages any) int {
		var tok tokenizeResponse
		postDecode(t, srv.URL+"/tokenize", map[string]any{"messages": messages}, http.StatusOK, &tok)
		return tok.Count
	}
	plain := count([]map[string]any{{"role": "user", "content": "alpha\nbeta"}})
	parts := count([]map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "alpha"}, {"type": "text", "text": "beta"}}}})
	if plain != parts {
		t.Fatalf("string content %d tokens, text parts %d", plain, parts)
	}
	withNull := count([]map[string]any{{"role": "user", "content": "alpha\nbeta"}, {"role": "assistant", "content": nil}})
	if withNull <= plain {
		t.Fatalf("a null-content message adds no template tokens: %d <= %d", withNull, plain)
	}
}

// /tokenize must count what the generation endpoints report, so a client
// can calibrate with it.
func TestTokenizeMatchesUsage(t *testing.T) {
	_, srv := newTestServer(t, Config{})
	messages := []map[string]any{
		{"role": "system", "content": "You are terse."},
		{"role": "user", "content": "Summarise the plot of Hamlet in one line, please."},
	}
	tests := []struct {
		name     string
		tokenize map[string]any
		path     string
		request  map[string]any
	}{
		{"chat", map[string]any{"messages": messages}, "/v1/chat/completions", map[string]any{"messages": messages, "max_tokens": 1}},
		{"chat explicit generation prompt", map[string]any{"messages": messages, "add_generation_prompt": true},
			"/v1/chat/completions", map[string]any{"messages": messages, "max_tokens": 1}},
		{"text", map[string]any{"prompt": "The quick brown fox jumps over the lazy dog."},
			"/v1/completions", map[string]any{"prompt": "The quick brown fox jumps over the lazy dog.", "max_tokens": 1}},
		{"token ids", map[string]any{"prompt": []int{5, 6, 7, 8}}, "/v1/completions", map[string]any{"prompt": []int{5, 6, 7, 8}, "max_tokens": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tok tokenizeResponse
			postDecode(t, srv.URL+"/tokenize", tt.tokenize, http.StatusOK, &tok)
			if tok.Count != len(tok.Tokens) || tok.MaxModelLen != DefaultMaxModelLen {
				t.Fatalf("tokenize %+v", tok)
			}
			var c wireChunk
			postDecode(t, srv.URL+tt.path, tt.request, http.StatusOK, &c)
			if c.Usage.PromptTokens != tok.Count {
				t.Fatalf("prompt_tokens %d, /tokenize count %d", c.Usage.PromptTokens, tok.Count)
			}
		})
	}
	// Without the generation prompt the chat form is shorter.
	var with, without tokenizeResponse
	postDecode(t, srv.URL+"/tokenize", map[string]any{"messages": messages}, http.StatusOK, &with)
	postDecode(t, srv.URL+"/tokenize", map[string]any{"messages": messages, "add_generation_prompt": false}, http.StatusOK, &without)
	if without.Count >= with.Count {
		t.Fatalf("add_generation_prompt=false gives %d tokens, true %d", without.Count, with.Count)
	}
	// token_strs and /detokenize round-trip.
	var strs tokenizeResponse
	postDecode(t, srv.URL+"/tokenize", map[string]any{"prompt": "hello world", "return_token_strs": true}, http.StatusOK, &strs)
	if strings.Join(strs.TokenStrs, "") != "hello world" {
		t.Fatalf("token_strs %q", strs.TokenStrs)
	}
	var detok struct {
		Prompt string `json:"prompt"`
	}
	postDecode(t, srv.URL+"/detokenize", map[string]any{"tokens": strs.Tokens}, http.StatusOK, &detok)
	if detok.Prompt != "hello world" {
		t.Fatalf("detokenize %q", detok.Prompt)
	}
}

// Earlier turns of a chat must render to a token prefix of later turns,
// or multi-turn chats would never hit the cache.
func TestChatTemplatePrefixStable(t *testing.T) {
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	msg := func(role, content string) prompt.ChatMessage {
		raw, _ := json.Marshal(content)
		return prompt.ChatMessage{Role: role, Content: raw}
	}
	turn1 := []prompt.ChatMessage{msg("system", "Be brief."), msg("user", "What is 2+2?")}
	turn2 := append(append([]prompt.ChatMessage(nil), turn1...), msg("assistant", "4."), msg("user", "And 3+3?"))
	a, _ := renderChat(turn1, false)
	b, _ := renderChat(turn2, true)
	ta, _ := e.tok.Encode(a)
	tb, _ := e.tok.Encode(b)
	if len(tb) <= len(ta) {
		t.Fatalf("turn 2 shorter than turn 1")
	}
	for i := range ta {
		if ta[i] != tb[i] {
			t.Fatalf("token %d differs: turn 1 is not a prefix of turn 2", i)
		}
	}
}

func TestOutputPiecesAreSingleTokens(t *testing.T) {
	tok, err := tokenizer.Load("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	pieces := outputPieces()
	var all strings.Builder
	for _, p := range pieces {
		ids, err := tok.Encode(p)
		if err != nil || len(ids) != 1 {
			t.Errorf("%q is %d tokens (%v)", p, len(ids), err)
		}
	}
	for i := range 3 * len(pieces) {
		all.WriteString(pieces[i%len(pieces)])
	}
	if ids, _ := tok.Encode(all.String()); len(ids) != 3*len(pieces) {
		t.Fatalf("concatenation is %d tokens, want %d", len(ids), 3*len(pieces))
	}
}

func TestModelsHealth(t *testing.T) {
	_, srv := newTestServer(t, Config{Model: "m1", MaxModelLen: 4096})
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "m1" || models.Data[0].MaxModelLen != 4096 {
		t.Fatalf("models %+v (%v)", models, err)
	}
	resp, err = http.Get(srv.URL + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(srv.URL + "/v1/completions")
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/completions: %v %v", resp, err)
	}
	resp.Body.Close()
}

// fakeClock is the kit's fake clock as the engine's: it moves only when
// the engine sleeps, so timing is exact and tests never wait.
type fakeClock struct{ *testutil.Clock }

func newFakeClock() fakeClock { return fakeClock{testutil.NewClock()} }

func (c fakeClock) install(e *Engine) { e.now, e.sleep = c.Now, c.Sleep }

// recorded lists the engine's sleeps, in order.
func (c fakeClock) recorded() []time.Duration { return c.Slept() }

// The timing model, on a clock that moves only when the engine sleeps:
// TTFT = overhead + prefill per uncached token, then one token per
// inter-token interval.
func TestTimingModel(t *testing.T) {
	clock := newFakeClock()
	cfg := Config{BlockSize: 16, Overhead: 5 * time.Millisecond, PrefillPerToken: time.Millisecond, InterToken: 10 * time.Millisecond}
	e, srv := newTestServer(t, cfg, clock.install)
	prompt := seq(1000, 40) // two full blocks and 8 tokens

	stream := func() {
		resp := post(t, context.Background(), srv.URL+"/v1/completions",
			map[string]any{"prompt": prompt, "max_tokens": 4, "stream": true})
		defer resp.Body.Close()
		if _, err := readSSE(resp.Body); err != nil {
			t.Fatal(err)
		}
	}
	stream()
	stream() // now 32 of 40 tokens are cached
	got := clock.recorded()
	want := []time.Duration{
		5*time.Millisecond + 40*time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond,
		5*time.Millisecond + 8*time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond,
	}
	if len(got) != len(want) {
		t.Fatalf("sleeps %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sleeps %v, want %v", got, want)
		}
	}
	// The histogram saw 45ms and 13ms.
	var sum float64
	mfs, err := e.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "vllm:time_to_first_token_seconds" {
			sum = mf.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	if d := sum - 0.058; d > 1e-9 || d < -1e-9 {
		t.Fatalf("TTFT sum %v, want 0.058", sum)
	}
}

// With Config.BOS, /tokenize adds the BOS as each engine does by default
// (vLLM and SGLang's add_special_tokens true, llama.cpp's add_special
// false) and leaves it out when asked; token ids are never touched.
func TestTokenizeSpecialTokens(t *testing.T) {
	_, srv := newTestServer(t, Config{BOS: true})
	no, yes := false, true
	tests := []struct {
		name    string
		body    map[string]any
		wantBOS bool
		count   int
	}{
		{"vllm default", map[string]any{"prompt": " alpha beta"}, true, 3},
		{"vllm without", map[string]any{"prompt": " alpha beta", "add_special_tokens": no}, false, 2},
		{"vllm with", map[string]any{"prompt": " alpha beta", "add_special_tokens": yes}, true, 3},
		{"strings without", map[string]any{"prompt": []string{" alpha beta"}, "add_special_tokens": no}, false, 2},
		{"llama.cpp default", map[string]any{"content": " alpha beta"}, false, 2},
		{"llama.cpp with", map[string]any{"content": " alpha beta", "add_special": yes}, true, 3},
		{"ids untouched", map[string]any{"prompt": []int{bosToken, 5}, "add_special_tokens": no}, true, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tok tokenizeResponse
			postDecode(t, srv.URL+"/tokenize", tt.body, http.StatusOK, &tok)
			if tok.Count != tt.count || (len(tok.Tokens) > 0 && tok.Tokens[0] == bosToken) != tt.wantBOS {
				t.Fatalf("tokens %v, want %d with BOS %v", tok.Tokens, tt.count, tt.wantBOS)
			}
		})
	}
}

// Start serves on a loopback port; canceling its context ends every
// request, including a hung one, and wait returns once all is down.
func TestStartShutdown(t *testing.T) {
	hung := make(chan struct{})
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	e.onDone = func(r Result) {
		if r == ResultHung {
			close(hung)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, wait, err := e.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	complete(t, base, seq(1, 5), nil)

	if err := e.SetFaults(Faults{Hang: 1}); err != nil {
		t.Fatal(err)
	}
	resp := post(t, context.Background(), base+"/v1/chat/completions", chatBody("x", map[string]any{"stream": true}))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	cancel()
	<-hung
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Logf("hung body ended with %v", err)
	}
	if err := wait(); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if err := wait(); err != nil {
		t.Fatalf("second wait: %v", err)
	}
	if _, err := http.Get(base + "/health"); err == nil {
		t.Fatal("server still answering after shutdown")
	}
}

func TestStartBadAddress(t *testing.T) {
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Start(context.Background(), "127.0.0.1:notaport"); err == nil {
		t.Fatal("Start on a bad address succeeded")
	}
}

// A client that leaves mid-stream is counted as canceled, and its slot
// is freed.
func TestClientCancelMidStream(t *testing.T) {
	done := make(chan Result, 1)
	e, srv := newTestServer(t, Config{InterToken: time.Millisecond}, func(e *Engine) {
		// Prefill is instant; every decode step waits for the client
		// to leave.
		e.sleep = func(ctx context.Context, d time.Duration) error {
			if d <= 0 {
				return ctx.Err()
			}
			<-ctx.Done()
			return ctx.Err()
		}
		e.onDone = func(r Result) { done <- r }
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("x", map[string]any{"stream": true, "max_tokens": 5}))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for range 4 { // role chunk, blank, first token, blank
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if r := <-done; r != ResultCanceled {
		t.Fatalf("result %v", r)
	}
	if st := e.Stats(); st.Canceled != 1 || st.Running != 0 || st.CacheQueryTokens == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTokenizeErrors(t *testing.T) {
	_, srv := newTestServer(t, Config{Model: "m"})
	for _, tt := range []struct {
		path string
		body any
		want int
	}{
		{"/tokenize", map[string]any{"model": "other", "prompt": "x"}, http.StatusNotFound},
		{"/tokenize", map[string]any{"prompt": 5}, http.StatusBadRequest},
		{"/tokenize", map[string]any{"messages": []map[string]any{{"content": "no role"}}}, http.StatusBadRequest},
		{"/tokenize", map[string]any{"messages": []map[string]any{{"role": "user", "content": 5}}}, http.StatusBadRequest},
		{"/tokenize", `{`, http.StatusBadRequest},
		{"/detokenize", map[string]any{"tokens": []int{-1}}, http.StatusBadRequest},
		{"/detokenize", map[string]any{"tokens": []int{1 << 30}}, http.StatusBadRequest},
		{"/detokenize", `[]`, http.StatusBadRequest},
	} {
		postDecode(t, srv.URL+tt.path, tt.body, tt.want, nil)
	}
}

// BenchmarkEmulatorStream measures streamed chat requests of 32 output
// tokens with zero delays, through a real HTTP client on loopback: the
// emulator's own cost per request, tokenization and SSE included.
func BenchmarkEmulatorStream(b *testing.B) {
	e, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler())
	defer srv.Close()
	body, err := json.Marshal(chatBody("Explain prefix caching in two sentences.", map[string]any{
		"stream": true, "max_tokens": 32, "stream_options": map[string]any{"include_usage": true}}))
	if err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || n == 0 {
				b.Errorf("status %d, %d bytes, %v", resp.StatusCode, n, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if st := e.Stats(); st.Success != int64(b.N) {
		b.Fatalf("%d successes for %d requests", st.Success, b.N)
	}
}

// TestAbandonedSlot: a client that closes its stream mid-way frees its
// running slot at once; with HoldAbandonedSlots the engine generates on
// into the void, the slot held (a second request waits) until the output
// would have ended.
func TestAbandonedSlot(t *testing.T) {
	const maxTokens = 5
	for _, hold := range []bool{false, true} {
		name := map[bool]string{false: "freed", true: "held"}[hold]
		t.Run(name, func(t *testing.T) {
			gate := make(chan struct{})
			steps := make(chan struct{}, maxTokens)
			queued := make(chan struct{}, 1)
			done := make(chan Result, 2)
			e, err := New(Config{InterToken: time.Hour, MaxRunning: 1, HoldAbandonedSlots: hold})
			if err != nil {
				t.Fatal(err)
			}
			// Prefill is instant; every decode step (an hour apart, so
			// never already due) waits for the gate or for its context.
			e.sleep = func(ctx context.Context, d time.Duration) error {
				if d <= 0 {
					return ctx.Err()
				}
				steps <- struct{}{}
				select {
				case <-gate:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			e.onDone = func(r Result) { done <- r }
			e.sched.onQueue = func() { queued <- struct{}{} }
			// left reports the first request's client gone, as the server sees it.
			left := make(chan struct{}, 1)
			first := true
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if first {
					first = false
					go func() { <-r.Context().Done(); left <- struct{}{} }()
				}
				e.Handler().ServeHTTP(w, r)
			}))
			defer srv.Close()

			ctx, cancel := context.WithCancel(context.Background())
			resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("x", map[string]any{"stream": true, "max_tokens": maxTokens}))
			br := bufio.NewReader(resp.Body)
			for range 4 { // role chunk, blank, first token, blank
				if _, err := br.ReadString('\n'); err != nil {
					t.Fatal(err)
				}
			}
			<-steps // the engine waits to decode the second token
			cancel()
			resp.Body.Close()
			<-left

			// A second request, sent while the first's client is gone.
			second := make(chan *http.Response, 1)
			go func() {
				second <- post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("y", map[string]any{"stream": true, "max_tokens": 1}))
			}()
			if !hold {
				if r := <-done; r != ResultCanceled {
					t.Fatalf("first request: %v, want canceled", r)
				}
			} else {
				<-queued // the slot is still held: the second request waits
				if st := e.Stats(); st.Running != 1 || st.Waiting != 1 {
					t.Fatalf("with the client gone: running %d waiting %d, want 1 and 1", st.Running, st.Waiting)
				}
				for range maxTokens - 2 { // the rest of the output, into the void
					gate <- struct{}{}
					<-steps
				}
				gate <- struct{}{}
				if r := <-done; r != ResultCanceled {
					t.Fatalf("first request: %v, want canceled", r)
				}
			}
			r := <-second
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
			if got := <-done; got != ResultSuccess {
				t.Fatalf("second request: %v, want success", got)
			}
			if st := e.Stats(); st.Canceled != 1 || st.Running != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}
