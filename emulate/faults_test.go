package emulate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// doRaw sends a request and returns the response or the transport error,
// without failing: some faults make the request itself fail.
func doRaw(t *testing.T, ctx context.Context, url string, body any) (*http.Response, error) {
	t.Helper()
	js, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	// A fresh transport per request, so a closed connection is never
	// reused by the next subtest.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	return client.Do(req)
}

func TestFaults(t *testing.T) {
	const maxTokens = 10
	chatStream := chatBody("tell me", map[string]any{"max_tokens": maxTokens, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	chatPlain := chatBody("tell me", map[string]any{"max_tokens": maxTokens})
	complStream := map[string]any{"prompt": "tell me", "max_tokens": maxTokens, "stream": true}

	// contentEvents counts token-carrying chunks among SSE payloads.
	contentEvents := func(t *testing.T, events []string) int {
		n := 0
		for _, ev := range events {
			var c wireChunk
			if json.Unmarshal([]byte(ev), &c) != nil || len(c.Choices) == 0 {
				continue
			}
			ch := c.Choices[0]
			if (ch.Delta != nil && ch.Delta.Content != nil && *ch.Delta.Content != "") || (ch.Text != nil && *ch.Text != "") {
				n++
			}
		}
		return n
	}
	errorBody := func(t *testing.T, resp *http.Response, want int) {
		t.Helper()
		var body struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if resp.StatusCode != want {
			t.Fatalf("status %d, want %d", resp.StatusCode, want)
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error.Code != want || body.Error.Message == "" || body.Error.Type == "" {
			t.Fatalf("error body %+v (%v)", body, err)
		}
	}

	tests := []struct {
		name   string
		faults Faults
		path   string
		body   map[string]any
		check  func(t *testing.T, resp *http.Response, err error)
		want   Stats // only the result counts are compared
	}{
		{"500 streaming", Faults{Error500: 1}, "/v1/chat/completions", chatStream,
			func(t *testing.T, resp *http.Response, err error) { errorBody(t, resp, 500) }, Stats{Error500: 1}},
		{"500 plain", Faults{Error500: 1}, "/v1/completions", map[string]any{"prompt": "x"},
			func(t *testing.T, resp *http.Response, err error) { errorBody(t, resp, 500) }, Stats{Error500: 1}},
		{"429", Faults{Error429: 1}, "/v1/chat/completions", chatStream,
			func(t *testing.T, resp *http.Response, err error) {
				if resp.Header.Get("Retry-After") == "" {
					t.Error("no Retry-After")
				}
				errorBody(t, resp, 429)
			}, Stats{Error429: 1}},
		{"disconnect mid-stream after 3 tokens", Faults{Disconnect: 1, AfterTokens: 3}, "/v1/chat/completions", chatStream,
			func(t *testing.T, resp *http.Response, err error) {
				events, rerr := readSSE(resp.Body)
				if !errors.Is(rerr, io.ErrUnexpectedEOF) {
					t.Fatalf("read error %v, want unexpected EOF", rerr)
				}
				if n := contentEvents(t, events); n != 3 || len(events) != 4 {
					t.Fatalf("%d events, %d with tokens, want role + 3", len(events), n)
				}
			}, Stats{Disconnected: 1}},
		{"disconnect mid-stream at half by default", Faults{Disconnect: 1}, "/v1/completions", complStream,
			func(t *testing.T, resp *http.Response, err error) {
				events, rerr := readSSE(resp.Body)
				if !errors.Is(rerr, io.ErrUnexpectedEOF) {
					t.Fatalf("read error %v, want unexpected EOF", rerr)
				}
				if n := contentEvents(t, events); n != maxTokens/2 {
					t.Fatalf("%d tokens before the cut, want %d", n, maxTokens/2)
				}
			}, Stats{Disconnected: 1}},
		{"disconnect before the response", Faults{Disconnect: 1}, "/v1/chat/completions", chatPlain,
			func(t *testing.T, resp *http.Response, err error) {
				if err == nil {
					t.Fatalf("request succeeded with status %d", resp.StatusCode)
				}
			}, Stats{Disconnected: 1}},
		{"malformed chunk", Faults{Malformed: 1, AfterTokens: 2}, "/v1/chat/completions", chatStream,
			func(t *testing.T, resp *http.Response, err error) {
				events, rerr := readSSE(resp.Body)
				if rerr != nil {
					t.Fatalf("read: %v", rerr)
				}
				if len(events) != 4 || events[3] != "{not json" || contentEvents(t, events) != 2 {
					t.Fatalf("events %q", events)
				}
			}, Stats{Malformed: 1}},
		{"malformed after the last token", Faults{Malformed: 1, AfterTokens: 1000}, "/v1/completions", complStream,
			func(t *testing.T, resp *http.Response, err error) {
				events, rerr := readSSE(resp.Body)
				if rerr != nil || len(events) != maxTokens+1 || events[maxTokens] != "{not json" {
					t.Fatalf("events %q (%v)", events, rerr)
				}
			}, Stats{Malformed: 1}},
		{"malformed plain body", Faults{Malformed: 1}, "/v1/completions", map[string]any{"prompt": "x"},
			func(t *testing.T, resp *http.Response, err error) {
				data, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || json.Valid(data) {
					t.Fatalf("status %d body %q", resp.StatusCode, data)
				}
			}, Stats{Malformed: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, srv := newTestServer(t, Config{Faults: tt.faults})
			resp, err := doRaw(t, context.Background(), srv.URL+tt.path, tt.body)
			if err == nil {
				defer resp.Body.Close()
			}
			tt.check(t, resp, err)
			got := e.Stats()
			if got.Received != 1 {
				t.Errorf("%d requests received, want 1", got.Received)
			}
			got.Received, got.SlowFirstTokens = 0, 0
			got.PromptTokens, got.CompletionTokens, got.CachedTokens, got.CacheQueryTokens, got.CacheHitTokens = 0, 0, 0, 0, 0
			got.Running, got.Waiting, got.Cache = 0, 0, CacheState{}
			if got != tt.want {
				t.Fatalf("stats %+v, want %+v", got, tt.want)
			}
		})
	}
}

// The hang fault holds the request until the client gives up, then ends.
func TestHangEndsOnCancel(t *testing.T) {
	for _, stream := range []bool{true, false} {
		done := make(chan Result, 1)
		e, srv := newTestServer(t, Config{Faults: Faults{Hang: 1}}, func(e *Engine) {
			e.onDone = func(r Result) { done <- r }
		})
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := doRaw(t, ctx, srv.URL+"/v1/chat/completions", chatBody("x", map[string]any{"stream": stream}))
		if err != nil {
			t.Fatalf("stream=%v: %v", stream, err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream=%v: status %d", stream, resp.StatusCode)
		}
		// Nothing arrives while hanging; the read ends with the cancel.
		readErr := make(chan error, 1)
		go func() {
			_, err := io.ReadAll(resp.Body)
			readErr <- err
		}()
		cancel()
		if r := <-done; r != ResultHung {
			t.Fatalf("stream=%v: result %v", stream, r)
		}
		if err := <-readErr; err == nil {
			t.Fatalf("stream=%v: body read ended cleanly", stream)
		}
		resp.Body.Close()
		if st := e.Stats(); st.Hung != 1 || st.Success != 0 {
			t.Fatalf("stream=%v: stats %+v", stream, st)
		}
	}
}

func TestSlowFirstToken(t *testing.T) {
	clock := newFakeClock()
	cfg := Config{Overhead: time.Millisecond, Faults: Faults{SlowFirstToken: 1, SlowFirstTokenDelay: 3 * time.Second}}
	e, srv := newTestServer(t, cfg, clock.install)
	complete(t, srv.URL, seq(1, 10), nil)
	if got := clock.recorded(); len(got) != 1 || got[0] != 3*time.Second+time.Millisecond {
		t.Fatalf("sleeps %v", got)
	}
	if st := e.Stats(); st.Success != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Received counts every generation request, rejected ones too, and
// SlowFirstTokens only those the fault actually delayed: an injected 500
// drawn as slow never reaches prefill.
func TestStatsReceivedAndSlow(t *testing.T) {
	clock := newFakeClock()
	e, srv := newTestServer(t, Config{Faults: Faults{SlowFirstToken: 1, SlowFirstTokenDelay: time.Second}}, clock.install)
	complete(t, srv.URL, seq(1, 10), nil)
	complete(t, srv.URL, seq(1, 10), nil)
	postDecode(t, srv.URL+"/v1/completions", `{"prompt": [1], "max_tokens": 0}`, http.StatusBadRequest, nil)
	if err := e.SetFaults(Faults{Error500: 1, SlowFirstToken: 1}); err != nil {
		t.Fatal(err)
	}
	postDecode(t, srv.URL+"/v1/completions", map[string]any{"prompt": seq(1, 10)}, http.StatusInternalServerError, nil)
	st := e.Stats()
	if st.Received != 4 || st.SlowFirstTokens != 2 || st.Success != 2 || st.Rejected != 1 || st.Error500 != 1 {
		t.Fatalf("stats %+v, want 4 received, 2 slow, 2 successes, 1 rejected, 1 error 500", st)
	}
	var wire struct {
		Received        int64 `json:"received"`
		SlowFirstTokens int64 `json:"slow_first_tokens"`
	}
	resp, err := http.Get(srv.URL + "/emulator/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := decodeJSON(resp, &wire); err != nil || wire.Received != 4 || wire.SlowFirstTokens != 2 {
		t.Fatalf("GET /emulator/stats: %+v (%v)", wire, err)
	}
}

func TestFaultDraws(t *testing.T) {
	f := Faults{Error500: 0.1, Error429: 0.2, Disconnect: 0.05, Malformed: 0.05, Hang: 0.1, SlowFirstToken: 0.5}
	newState := func() *faultState {
		e, err := New(Config{Faults: f, Seed: 42})
		if err != nil {
			t.Fatal(err)
		}
		return &e.faults
	}
	a, b := newState(), newState()
	counts := map[faultKind]int{}
	slow := 0
	const n = 20000
	for range n {
		pa, pb := a.draw(), b.draw()
		if pa.kind != pb.kind || pa.slow != pb.slow {
			t.Fatal("same seed, different draws")
		}
		counts[pa.kind]++
		if pa.slow {
			slow++
		}
	}
	for kind, p := range map[faultKind]float64{fault500: 0.1, fault429: 0.2, faultDisconnect: 0.05, faultMalformed: 0.05, faultHang: 0.1, faultNone: 0.5} {
		if got := float64(counts[kind]) / n; got < p-0.02 || got > p+0.02 {
			t.Errorf("kind %d: rate %.3f, want %.2f", kind, got, p)
		}
	}
	if got := float64(slow) / n; got < 0.48 || got > 0.52 {
		t.Errorf("slow rate %.3f", got)
	}
}

func TestFaultsOverHTTP(t *testing.T) {
	e, srv := newTestServer(t, Config{})
	var got faultsJSON
	postDecode(t, srv.URL+"/emulator/faults", map[string]any{"error_429": 1, "slow_first_token_delay": "250ms"}, http.StatusOK, &got)
	if got.Error429 != 1 || got.SlowFirstTokenDelay != "250ms" {
		t.Fatalf("faults %+v", got)
	}
	resp, err := doRaw(t, context.Background(), srv.URL+"/v1/completions", map[string]any{"prompt": "x"})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, bad := range []map[string]any{{"error_500": 0.7, "hang": 0.7}, {"disconnect": -1}, {"slow_first_token_delay": "soon"}} {
		postDecode(t, srv.URL+"/emulator/faults", bad, http.StatusBadRequest, nil)
	}
	if f := e.Config().Faults; f.Error429 != 1 {
		t.Fatalf("a rejected update changed the faults: %+v", f)
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"zero is valid", Config{}, ""},
		{"defaults", DefaultConfig(), ""},
		{"negative block size", Config{BlockSize: -1}, "block_size"},
		{"negative capacity", Config{CapacityBlocks: -1}, "capacity_blocks"},
		{"capacity beyond 32-bit block ids", Config{CapacityBlocks: 1 << 31}, "capacity_blocks must be at most 2147483647"},
		{"the largest capacity", Config{CapacityBlocks: 1<<31 - 1}, ""},
		{"negative inter-token", Config{InterToken: -time.Second}, "inter_token"},
		{"probability above one", Config{Faults: Faults{Hang: 1.5}}, "faults.hang"},
		{"probabilities sum above one", Config{Faults: Faults{Error500: 0.6, Error429: 0.6}}, "must not exceed 1"},
		{"slow is not exclusive", Config{Faults: Faults{Error500: 1, SlowFirstToken: 1}}, ""},
		{"all problems at once", Config{MaxRunning: -1, Overhead: -1}, "overhead"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("New: %v, want %q", err, tt.want)
			}
		})
	}
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := e.Config()
	if c.Model != DefaultModel || c.BlockSize != DefaultBlockSize || c.MaxRunning != DefaultMaxRunning ||
		c.MaxModelLen != DefaultMaxModelLen || c.Overhead != 0 || c.Faults.SlowFirstTokenDelay != DefaultSlowFirstTokenDelay {
		t.Fatalf("defaults %+v", c)
	}
}
