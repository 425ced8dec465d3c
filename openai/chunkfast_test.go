package openai

import (
	"strings"
	"testing"
	"time"
)

// TestChunkTemplateSameAsFullParse: over streams that mix template-shaped
// chunks with every kind of departure from the template, handle ends in
// the same state with the template as when every chunk is parsed in full.
func TestChunkTemplateSameAsFullParse(t *testing.T) {
	const head = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{`
	const tail = `},"logprobs":null,"finish_reason":null}]}`
	tok := func(content string) string { return head + `"content":"` + content + `"` + tail }
	role := head + `"role":"assistant","content":""` + tail
	finish := head + `"content":""},"logprobs":null,"finish_reason":"length"}]}`
	usage := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}`
	for _, tc := range []struct {
		name   string
		chunks []string
	}{
		{"plain", []string{role, tok(" a"), tok(" b"), tok(" c"), finish, usage, "[DONE]"}},
		{"empty content between", []string{tok("a"), tok(""), tok("b"), tok(""), "[DONE]"}},
		{"escapes", []string{tok("a"), tok(`\"content\":\"x`), tok(`caf\u00e9`), tok(`\\`), tok(`\n\t\/`), "[DONE]"}},
		{"bad escape", []string{tok("a"), tok(`\x`), tok("b")}},
		{"short unicode escape", []string{tok("a"), tok(`\u00e`), tok("b")}},
		{"raw control character", []string{tok("a"), tok("x\x01y"), tok("b")}},
		{"invalid UTF-8", []string{tok("a"), tok("x\xffy"), tok("b")}},
		{"unterminated", []string{tok("a"), head + `"content":"abc`}},
		{"suffix cut", []string{tok("a"), head + `"content":"b"},"logprobs":null`}},
		{"trailing garbage", []string{tok("a"), tok("b") + "x"}},
		{"duplicate key", []string{tok("a"), head + `"content":"","content":"b"` + tail, tok("c")}},
		{"reasoning beside", []string{tok("a"), head + `"reasoning_content":"r","content":""` + tail, tok("")}},
		{"abort", []string{tok("a"), head + `"content":""},"logprobs":null,"finish_reason":"abort"}]}`}},
		{"error chunk", []string{tok("a"), `{"error":{"message":"boom","type":"x"}}`}},
		{"continuous usage", []string{
			head + `"content":"a"` + `},"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`,
			head + `"content":"b"` + `},"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`,
			"[DONE]",
		}},
		{"no object member", []string{`{"choices":[{"delta":{"content":"a"}}]}`, `{"choices":[{"delta":{"content":""}}]}`, `{"choices":[{"delta":{"content":"b"}}]}`}},
		{"another id", []string{tok("a"), strings.Replace(tok("b"), "chatcmpl-1", "chatcmpl-2", 1), tok("")}},
		{"two choices", []string{
			head + `"content":"a"},"finish_reason":null},{"index":1,"delta":{"content":"b"}}]}`,
			head + `"content":""},"finish_reason":null},{"index":1,"delta":{"content":"b"}}]}`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(template bool) stateView {
				var s streamState
				s.reset()
				now := tickClock()
				for _, c := range tc.chunks {
					if !template {
						s.tmpl.clear()
					}
					if s.handle(sseEvent{data: []byte(c), at: now()}) {
						break
					}
				}
				return viewOf(&s)
			}
			fast, full := run(true), run(false)
			if fast != full {
				t.Errorf("with the template:\n%+v\nparsing every chunk:\n%+v", fast, full)
			}
		})
	}
}

// TestChunkTemplateUsed: the template does serve the chunks it fits.
func TestChunkTemplateUsed(t *testing.T) {
	var s streamState
	s.reset()
	pieces := vllmStream(8)
	at := time.Unix(1, 0)
	hits := 0
	for _, p := range pieces {
		data := []byte(strings.TrimSpace(strings.TrimPrefix(string(p), "data: ")))
		if _, ok := s.tmpl.match(data); ok {
			hits++
		}
		if s.handle(sseEvent{data: data, at: at}) {
			break
		}
	}
	// The role chunk and the first content chunk are parsed; the other 7
	// content chunks match.
	if hits != 7 {
		t.Errorf("%d chunks matched the template, want 7", hits)
	}
}

// stateView is what handle decides of a stream, comparable.
type stateView struct {
	events, contentChunks                                  int
	first, last                                            time.Time
	done, finished, failed, usageSeen, usageBad            bool
	abort, failMsg                                         string
	prompt, completion, cached, cacheN                     int
	promptKnown, completionKnown, cachedKnown, cacheNKnown bool
}

func viewOf(s *streamState) stateView {
	return stateView{
		events: s.events, contentChunks: s.contentChunks, first: s.first, last: s.last,
		done: s.done, finished: s.finished, failed: s.failed, usageSeen: s.usageSeen, usageBad: s.usageBad,
		abort: s.abort, failMsg: s.failMsg,
		prompt: s.prompt, completion: s.completion, cached: s.cached, cacheN: s.cacheN,
		promptKnown: s.promptKnown, completionKnown: s.completionKnown, cachedKnown: s.cachedKnown, cacheNKnown: s.cacheNKnown,
	}
}
