package testutil

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Usage is what FakeServer reports for one request.
type Usage struct {
	Prompt, Completion, Cached int
	// NoCached leaves prompt_tokens_details out, as an engine that does
	// not report cached tokens does.
	NoCached bool
}

// VLLMMetrics is a vLLM's /metrics as little as the daemon's cache
// discovery and server-metrics scrapers read it: a prefix-cache hit counter
// at zero.
const VLLMMetrics = "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 0\n"

// FakeServer speaks OpenAI chat completions over SSE on loopback:
// a role chunk, one content chunk per output token, a usage chunk, then
// [DONE]. The numbers depend only on the request's max tokens, never on
// arrival order. A request whose JSON body does not ask for a stream is
// answered 400.
type FakeServer struct {
	*httptest.Server

	// Usage gives the numbers of a request's answer from its max tokens;
	// nil: ten prompt tokens an output token, none of them cached.
	Usage func(maxTokens int) Usage
	// Release, when set, holds every request until it receives from it
	// (one request per value sent; closing releases all) or the client
	// goes away. The test's cleanup closes it.
	Release chan struct{}
	// Hold, when set, runs before each answer; false means the client went
	// away meanwhile and nothing is answered.
	Hold func(r *http.Request) bool
	// Fail, when set, may answer instead with status and body (JSON);
	// status 0 answers normally.
	Fail func(r *http.Request, maxTokens int) (status int, body string)
	// Metrics, when set, answers a GET of any path ending in /metrics, as
	// an engine's own metrics; such a GET is counted by Count, not
	// Requests. Unset, it is answered as any other request.
	Metrics string

	mu       sync.Mutex
	byPath   map[string]int // every request, by URL path
	requests int            // completion requests
	auth     map[string]int // Authorization headers of completion requests
	ended    int            // held requests whose client went away
}

// NewFakeServer starts a FakeServer, after configure (which may be nil)
// has set its fields; the test's cleanup closes it.
func NewFakeServer(t testing.TB, configure func(*FakeServer)) *FakeServer {
	t.Helper()
	f := &FakeServer{byPath: map[string]int{}, auth: map[string]int{}}
	if configure != nil {
		configure(f)
	}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	if f.Release != nil {
		// Runs before Close (cleanups are last in, first out), so that no
		// handler is left waiting.
		t.Cleanup(func() {
			defer func() { _ = recover() }() // closed already by the test
			close(f.Release)
		})
	}
	return f
}

// Count is how many requests arrived for path, /metrics included.
func (f *FakeServer) Count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byPath[path]
}

// Requests is how many completion requests arrived, on any path.
func (f *FakeServer) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// Auth is how many completion requests carried the Authorization header
// value h.
func (f *FakeServer) Auth(h string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.auth[h]
}

// Ended is how many held requests (Release, Hold) ended because their
// client went away.
func (f *FakeServer) Ended() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ended
}

func (f *FakeServer) serve(w http.ResponseWriter, r *http.Request) {
	if f.Metrics != "" && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/metrics") {
		f.mu.Lock()
		f.byPath[r.URL.Path]++
		f.mu.Unlock()
		io.WriteString(w, f.Metrics)
		return
	}
	var req struct {
		MaxTokens           int  `json:"max_tokens"`
		MaxCompletionTokens int  `json:"max_completion_tokens"`
		Stream              bool `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	n := max(req.MaxTokens, req.MaxCompletionTokens)
	f.mu.Lock()
	f.byPath[r.URL.Path]++
	f.requests++
	f.auth[r.Header.Get("Authorization")]++
	f.mu.Unlock()

	if !f.held(r) {
		f.mu.Lock()
		f.ended++
		f.mu.Unlock()
		return
	}
	if f.Fail != nil {
		if status, body := f.Fail(r, n); status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, body)
			return
		}
	}
	u := Usage{Prompt: 10 * n, Completion: n}
	if f.Usage != nil {
		u = f.Usage(n)
	}
	writeStream(w, n, u)
}

// held waits as Release and Hold say; false: the client went away.
func (f *FakeServer) held(r *http.Request) bool {
	if f.Release != nil {
		select {
		case <-f.Release:
		case <-r.Context().Done():
			return false
		}
	}
	return f.Hold == nil || f.Hold(r)
}

// Chunks of an OpenAI chat completion stream.
type (
	sseDelta struct {
		Role    string `json:"role,omitempty"`
		Content string `json:"content"`
	}
	sseChoice struct {
		Index        int      `json:"index"`
		Delta        sseDelta `json:"delta"`
		FinishReason *string  `json:"finish_reason"`
	}
	sseChunk struct {
		ID      string         `json:"id"`
		Object  string         `json:"object"`
		Choices []sseChoice    `json:"choices"`
		Usage   map[string]any `json:"usage,omitempty"`
	}
)

// writeStream answers n tokens and the usage u, flushing every event.
func writeStream(w http.ResponseWriter, n int, u Usage) {
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	event := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		_ = rc.Flush()
	}
	event(sseChunk{ID: "c", Object: "chat.completion.chunk", Choices: []sseChoice{{Delta: sseDelta{Role: "assistant"}}}})
	stop := "stop"
	for i := range n {
		c := sseChoice{Delta: sseDelta{Content: " tok"}}
		if i == n-1 {
			c.FinishReason = &stop
		}
		event(sseChunk{ID: "c", Object: "chat.completion.chunk", Choices: []sseChoice{c}})
	}
	usage := map[string]any{
		"prompt_tokens":     u.Prompt,
		"completion_tokens": u.Completion,
		"total_tokens":      u.Prompt + u.Completion,
	}
	if !u.NoCached {
		usage["prompt_tokens_details"] = map[string]any{"cached_tokens": u.Cached}
	}
	event(sseChunk{ID: "c", Object: "chat.completion.chunk", Choices: []sseChoice{}, Usage: usage})
	io.WriteString(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}
