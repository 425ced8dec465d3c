package emulate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvload-exporter/kvload-exporter/tokenizer"
)

// newTestServer starts an engine for cfg behind an httptest server. The
// optional setup runs before serving, to install test seams.
func newTestServer(t testing.TB, cfg Config, setup ...func(*Engine)) (*Engine, *httptest.Server) {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for _, f := range setup {
		f(e)
	}
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close)
	return e, srv
}

// post sends body as JSON and returns the response, whose body the caller
// closes.
func post(t testing.TB, ctx context.Context, url string, body any) *http.Response {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		js, err := json.Marshal(body)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		r = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, r)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

// postDecode posts body, expects want status, and decodes the JSON answer.
func postDecode(t testing.TB, url string, body any, want int, out any) {
	t.Helper()
	resp := post(t, context.Background(), url, body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	if resp.StatusCode != want {
		t.Fatalf("POST %s: status %d, want %d; body %s", url, resp.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("decode %s: %v", data, err)
		}
	}
}

// readSSE parses a server-sent event stream strictly: each event is one
// "data: " line followed by a blank line. It returns the payloads, and the
// read error if the stream broke off.
func readSSE(r io.Reader) ([]string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	var events []string
	expectBlank := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case expectBlank:
			if line != "" {
				return events, fmt.Errorf("want a blank line after an event, got %q", line)
			}
			expectBlank = false
		case strings.HasPrefix(line, "data: "):
			events = append(events, strings.TrimPrefix(line, "data: "))
			expectBlank = true
		default:
			return events, fmt.Errorf("unexpected line %q", line)
		}
	}
	return events, sc.Err()
}

// wireChunk is the union of the chunk shapes, decoded loosely so tests
// can check which fields are present.
type wireChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage   *wireUsage   `json:"usage"`
	Timings *wireTimings `json:"timings"`
}

// wireTimings is llama.cpp's timings object, the fields tests check.
type wireTimings struct {
	CacheN     int     `json:"cache_n"`
	PromptN    int     `json:"prompt_n"`
	PromptMS   float64 `json:"prompt_ms"`
	PredictedN int     `json:"predicted_n"`
}

type wireUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *wireUsage) cached(t testing.TB) int {
	t.Helper()
	if u == nil || u.PromptTokensDetails == nil {
		t.Fatalf("usage without prompt_tokens_details: %+v", u)
	}
	return u.PromptTokensDetails.CachedTokens
}

// complete sends a non-streaming /v1/completions request with a prompt of
// token ids and returns its usage.
func complete(t testing.TB, base string, ids []int, extra map[string]any) *wireUsage {
	t.Helper()
	body := map[string]any{"prompt": ids, "max_tokens": 2}
	for k, v := range extra {
		body[k] = v
	}
	var c wireChunk
	postDecode(t, base+"/v1/completions", body, http.StatusOK, &c)
	if c.Usage == nil {
		t.Fatalf("no usage in %+v", c)
	}
	return c.Usage
}

// seq returns n token ids starting at from.
func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func decodeJSON(resp *http.Response, out any) error {
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// doRawNoFatal posts body as JSON; for goroutines, which must not call
// t.Fatal.
func doRawNoFatal(url string, body any) (*http.Response, error) {
	js, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return http.Post(url, "application/json", bytes.NewReader(js))
}

func TestMetricsLintAndGroundTruth(t *testing.T) {
	e, srv := newTestServer(t, Config{BlockSize: 4, Model: "emu"})
	prompts := [][]int{seq(1, 9), seq(1, 9), seq(1, 17), seq(50, 5), seq(1, 30)}
	for _, p := range prompts {
		complete(t, srv.URL, p, nil)
	}
	// Text prompts too, streamed.
	for range 2 {
		resp := post(t, context.Background(), srv.URL+"/v1/chat/completions",
			chatBody("a prompt long enough to fill a few blocks of four tokens", map[string]any{"model": "emu", "stream": true, "max_tokens": 3}))
		if _, err := readSSE(resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}

	problems, err := testutil.GatherAndLint(e.Gatherer())
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range problems {
		// vLLM's names carry colons, which promlint reserves for
		// recording rules; that is the one accepted problem.
		if p.Text != "metric names should not contain ':'" {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
		names[p.Metric] = true
	}
	for _, want := range []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_requests_running",
		"vllm:num_requests_waiting", "vllm:time_to_first_token_seconds", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"} {
		if !names[want] {
			t.Errorf("metric %s missing", want)
		}
	}

	st := e.Stats()
	if st.Success != int64(len(prompts)+2) || st.CachedTokens == 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, c := range []struct {
		name string
		got  float64
		want int64
	}{
		{"queries", testutil.ToFloat64(e.m.queries), st.PromptTokens},
		{"hits", testutil.ToFloat64(e.m.hits), st.CachedTokens},
		{"queries vs cache stats", testutil.ToFloat64(e.m.queries), st.CacheQueryTokens},
		{"hits vs cache stats", testutil.ToFloat64(e.m.hits), st.CacheHitTokens},
		{"prompt tokens", testutil.ToFloat64(e.m.promptTokens), st.PromptTokens},
		{"generation tokens", testutil.ToFloat64(e.m.genTokens), st.CompletionTokens},
	} {
		if c.got != float64(c.want) {
			t.Errorf("%s: metric %v, stats %d", c.name, c.got, c.want)
		}
	}

	// The exposition carries the model_name label.
	if err := testutil.ScrapeAndCompare(srv.URL+"/metrics", strings.NewReader(`
# HELP vllm:num_requests_waiting Requests queued for a running slot.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="emu"} 0
`), "vllm:num_requests_waiting"); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsDoubleCountHits: the hit counter of /metrics reads twice the
// hits, every personality that exports one; the prompt counters, usage
// and Stats stay true.
func TestMetricsDoubleCountHits(t *testing.T) {
	for _, p := range []Personality{PersonalityVLLM, PersonalitySGLang, PersonalityLlamaCpp} {
		for _, double := range []bool{false, true} {
			cfg := Config{Engine: p, MetricsDoubleCountHits: double}
			if p != PersonalityLlamaCpp {
				cfg.BlockSize = 4
			}
			e, srv := newTestServer(t, cfg)
			var cached int
			for _, ids := range [][]int{seq(1, 17), seq(1, 17), seq(1, 30)} {
				cached += complete(t, srv.URL, ids, nil).cached(t)
			}
			st := e.Stats()
			if cached == 0 || int64(cached) != st.CachedTokens || st.CacheHitTokens != st.CachedTokens {
				t.Fatalf("%v: usage cached %d, stats %+v", p, cached, st)
			}
			want := float64(st.CacheHitTokens)
			if double {
				want *= 2
			}
			if got := testutil.ToFloat64(e.m.hits); got != want {
				t.Errorf("%v, double %v: hit counter %v, want %v", p, double, got, want)
			}
			if got := testutil.ToFloat64(e.m.queries); got != float64(st.CacheQueryTokens) {
				t.Errorf("%v, double %v: query counter %v, want %v", p, double, got, st.CacheQueryTokens)
			}
			if got := testutil.ToFloat64(e.m.computedTokens); got != float64(st.CacheQueryTokens-st.CacheHitTokens) {
				t.Errorf("%v, double %v: computed-token counter %v, want %v", p, double, got, st.CacheQueryTokens-st.CacheHitTokens)
			}
		}
	}
}

func TestSleepCtx(t *testing.T) {
	if err := sleepCtx(context.Background(), time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleepCtx(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("sleepCtx on a canceled context: %v", err)
	}
	if err := sleepCtx(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("zero sleep on a canceled context: %v", err)
	}
}

// encodeWatch is a tokenizer that notes, at each encode, how many of the
// engine's encode tokens are held.
type encodeWatch struct {
	tokenizer.Tokenizer
	e    *Engine
	held []int
	mu   sync.Mutex
}

func (w *encodeWatch) Encode(text string) ([]int, error) {
	w.mu.Lock()
	w.held = append(w.held, len(w.e.encoding))
	w.mu.Unlock()
	return w.Tokenizer.Encode(text)
}

// Tokenizations run at most one per CPU at once, whichever endpoint asks:
// each holds several times its text in memory, and requests queueing
// behind a loaded emulator must not all hold that at once.
func TestEncodesBoundedByCPUs(t *testing.T) {
	w := &encodeWatch{}
	_, srv := newTestServer(t, Config{}, func(e *Engine) {
		w.Tokenizer, w.e = e.tok, e
		e.tok = w
	})
	var wg sync.WaitGroup
	for range 4 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			resp := post(t, context.Background(), srv.URL+"/v1/completions",
				`{"model": "kvload-emulated", "prompt": "the prompt of a test", "max_tokens": 1}`)
			resp.Body.Close()
		})
	}
	wg.Wait()
	for _, r := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model": "kvload-emulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}`},
		{"/tokenize", `{"prompt": "and here"}`},
	} {
		resp := post(t, context.Background(), srv.URL+r.path, r.body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", r.path, resp.StatusCode)
		}
		resp.Body.Close()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.held) < 4*runtime.GOMAXPROCS(0)+2 {
		t.Fatalf("%d encodes seen", len(w.held))
	}
	for i, h := range w.held {
		if h < 1 || h > runtime.GOMAXPROCS(0) {
			t.Fatalf("encode %d ran with %d encode tokens held, want 1..%d", i, h, runtime.GOMAXPROCS(0))
		}
	}
	if c := cap(w.e.encoding); c != runtime.GOMAXPROCS(0) {
		t.Fatalf("%d encodes allowed at once, want GOMAXPROCS %d", c, runtime.GOMAXPROCS(0))
	}
}
