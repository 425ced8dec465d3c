package openai

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// pieceReader returns one piece per Read, as a socket does when each
// server flush arrives on its own.
type pieceReader struct {
	pieces [][]byte
	i, off int
}

func (r *pieceReader) Read(p []byte) (int, error) {
	if r.i >= len(r.pieces) {
		return 0, io.EOF
	}
	n := copy(p, r.pieces[r.i][r.off:])
	r.off += n
	if r.off == len(r.pieces[r.i]) {
		r.i, r.off = r.i+1, 0
	}
	return n, nil
}

func (r *pieceReader) rewind() { r.i, r.off = 0, 0 }

// chunkReader returns at most n bytes per Read, to cut lines anywhere.
type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), r.n, len(r.b))
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// tickClock returns t0 + k seconds on its k-th call.
func tickClock() func() time.Time {
	t0 := time.Unix(1_700_000_000, 0)
	var k int
	return func() time.Time {
		k++
		return t0.Add(time.Duration(k) * time.Second)
	}
}

func TestSSEReaderFraming(t *testing.T) {
	type ev struct {
		data    string
		isError bool
		comment string
	}
	tests := []struct {
		name string
		in   string
		want []ev
	}{
		{"space optional", "data: a\n\ndata:b\n\n", []ev{{data: "a"}, {data: "b"}}},
		{"only one space stripped", "data:  a \n\n", []ev{{data: " a "}}},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []ev{{data: "a"}, {data: "b"}}},
		{"comments and pings", ":\n\n: keep-alive\n\ndata: a\n\n", []ev{{data: "a"}}},
		{"multi-line data", "data: a\ndata:b\ndata\n\n", []ev{{data: "a\nb\n"}}},
		{"id retry event unknown", "id: 7\nretry: 10\nevent: message\nfoo: bar\nnocolon\ndata: x\n\n", []ev{{data: "x"}}},
		{"empty data line", "data:\n\n", []ev{{data: ""}}},
		{"blank lines alone", "\n\n\n", nil},
		{"bom", "\xef\xbb\xbfdata: a\n\n", []ev{{data: "a"}}},
		{"pending at eof", "data: a\n\ndata: b", []ev{{data: "a"}, {data: "b"}}},
		{"pending at eof after newline", "data: a\n", []ev{{data: "a"}}},
		{"error event with comment", "event: error\n: boom happened\n\n", []ev{{isError: true, comment: "boom happened"}}},
		{"error event with data", "event: error \ndata: {\"message\":\"x\"}\n\n", []ev{{data: `{"message":"x"}`, isError: true}}},
		{"comment does not leak into next event", ": old\n\nevent: error\n\n", []ev{{isError: true}}},
		{"event type resets", "event: error\ndata: a\n\ndata: b\n\n", []ev{{data: "a", isError: true}, {data: "b"}}},
	}
	for _, tt := range tests {
		for _, n := range []int{1, 3, 1 << 20} {
			t.Run(fmt.Sprintf("%s/read%d", tt.name, n), func(t *testing.T) {
				var r sseReader
				r.reset(&chunkReader{b: []byte(tt.in), n: n}, time.Now)
				var got []ev
				for {
					e, ok := r.next()
					if !ok {
						break
					}
					got = append(got, ev{string(e.data), e.errorEvent, string(e.comment)})
				}
				if !errors.Is(r.err, io.EOF) {
					t.Errorf("err = %v, want EOF", r.err)
				}
				if fmt.Sprint(got) != fmt.Sprint(tt.want) {
					t.Errorf("events\n got %+v\nwant %+v", got, tt.want)
				}
			})
		}
	}
}

func TestSSEReaderLongLines(t *testing.T) {
	long := strings.Repeat("x", 3*sseInitialBuffer)
	var r sseReader
	r.reset(strings.NewReader("data: "+long+"\n\ndata: y\n\n"), time.Now)
	e, ok := r.next()
	if !ok || string(e.data) != long {
		t.Fatalf("long event: ok=%v len=%d", ok, len(e.data))
	}
	if e, ok = r.next(); !ok || string(e.data) != "y" {
		t.Fatalf("event after the long one: ok=%v %q", ok, e.data)
	}

	r.reset(strings.NewReader("data: "+strings.Repeat("z", sseMaxEvent)+"\n\n"), time.Now)
	if _, ok := r.next(); ok || !errors.Is(r.err, errEventTooLarge) {
		t.Fatalf("oversized line: ok=%v err=%v", ok, r.err)
	}
	r.reset(strings.NewReader(strings.Repeat("data: "+strings.Repeat("z", 1<<20)+"\n", 17)), time.Now)
	if _, ok := r.next(); ok || !errors.Is(r.err, errEventTooLarge) {
		t.Fatalf("oversized multi-line event: ok=%v err=%v", ok, r.err)
	}
}

// TestStreamTimestamps checks that first and last token are stamped with
// the arrival of the chunk carrying content: not the role-only chunk, not
// the usage chunk.
func TestStreamTimestamps(t *testing.T) {
	events := []string{
		`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}`, // read 1
		`: ping`, // read 2
		`data: {"choices":[{"delta":{"content":"a"}}]}`,                          // read 3
		`data: {"choices":[{"delta":{"content":""}}]}`,                           // read 4
		`data: {"choices":[{"delta":{"reasoning_content":"b"}}]}`,                // read 5
		`data: {"choices":[{"delta":{},"finish_reason":"stop"}]}`,                // read 6
		`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}`, // read 7
		`data: [DONE]`, // read 8
	}
	var pieces [][]byte
	for _, e := range events {
		pieces = append(pieces, []byte(e+"\n\n"))
	}
	c := mustClient(t, TargetConfig{Dialect: engine.DialectVLLM})
	var sp streamParser
	sp.sse.reset(&pieceReader{pieces: pieces}, tickClock())
	sp.state.reset()
	for {
		ev, ok := sp.sse.next()
		if !ok || sp.state.handle(ev) {
			break
		}
	}
	var res Response
	c.fillUsage(&res, &sp.state)
	t0 := time.Unix(1_700_000_000, 0)
	if want := t0.Add(3 * time.Second); !res.FirstToken.Equal(want) {
		t.Errorf("FirstToken = %v, want %v", res.FirstToken, want)
	}
	if want := t0.Add(5 * time.Second); !res.LastToken.Equal(want) {
		t.Errorf("LastToken = %v, want %v", res.LastToken, want)
	}
	if !sp.state.done || sp.state.contentChunks != 2 || res.OutputTokens != 2 || !res.OutputFromUsage {
		t.Errorf("state %+v, result %+v", sp.state, res)
	}
}

func TestStreamChunkKinds(t *testing.T) {
	tests := []struct {
		chunk   string
		content bool
	}{
		{`{"choices":[{"delta":{"role":"assistant"}}]}`, false},
		{`{"choices":[{"delta":{"content":null}}]}`, false},
		{`{"choices":[{"delta":{}}]}`, false},
		{`{"choices":[{"delta":{"content":"x"}}]}`, true},
		{`{"choices":[{"delta":{"content":"\n"}}]}`, true},
		{`{"choices":[{"delta":{"reasoning":"x"}}]}`, true},
		{`{"choices":[{"delta":{"reasoning_content":"x"}}]}`, true},
		{`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","type":"function"}]}}]}`, false},
		{`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}`, true},
		{`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`, true},
		{`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]}}]}`, false},
		{`{"choices":[{"text":""}]}`, false},
		{`{"choices":[{"text":"x"}]}`, true},
		{`{"choices":[],"usage":{"completion_tokens":1}}`, false},
		{`{"choices":"weird","delta":{"content":"x"}}`, false},
		{`{"choices":[1,null,{"delta":"x"},{"delta":{"content":"y"}}]}`, true},
	}
	var st streamState
	for _, tt := range tests {
		st.reset()
		if st.handle(sseEvent{data: []byte(tt.chunk)}) {
			t.Errorf("%s: stopped the stream (%s)", tt.chunk, st.failMsg)
		}
		if got := st.contentChunks == 1; got != tt.content {
			t.Errorf("%s: content = %v, want %v", tt.chunk, got, tt.content)
		}
	}
}

func TestStreamUsageFields(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   string // prompt/completion/cached with ? for unknown, then cache_n
	}{
		{"full", []string{`{"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}`}, "10/3/8/?"},
		{"details null", []string{`{"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":null}}`}, "10/3/?/?"},
		{"cached null", []string{`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":null}}}`}, "10/?/?/?"},
		{"zero is known", []string{`{"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}`}, "10/3/0/?"},
		{"usage null", []string{`{"usage":null}`}, "?/?/?/?"},
		// Impossible numbers fail the stream: TestClientRejectsAbsurdUsage.
		{"whole float and string", []string{`{"usage":{"prompt_tokens":true,"completion_tokens":4.0,"prompt_tokens_details":{"cached_tokens":"8"}}}`}, "?/4/?/?"},
		{"continuous usage, later wins", []string{
			`{"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":8}}}`,
			`{"usage":{"prompt_tokens":10,"completion_tokens":2}}`,
		}, "10/2/8/?"},
		{"llama.cpp timings", []string{`{"choices":[],"timings":{"cache_n":16,"prompt_n":8}}`}, "?/?/?/16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st streamState
			st.reset()
			for _, c := range tt.chunks {
				if st.handle(sseEvent{data: []byte(c)}) {
					t.Fatalf("stopped: %s", st.failMsg)
				}
			}
			f := func(n int, ok bool) string {
				if !ok {
					return "?"
				}
				return strconv.Itoa(n)
			}
			got := f(st.prompt, st.promptKnown) + "/" + f(st.completion, st.completionKnown) + "/" +
				f(st.cached, st.cachedKnown) + "/" + f(st.cacheN, st.cacheNKnown)
			if got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// TestStreamPrefillTime: the engine's prefill time is read from llama.cpp's
// timings and vLLM's per-request metrics, in milliseconds; a figure no
// request could take is ignored without failing the stream.
func TestStreamPrefillTime(t *testing.T) {
	tests := []struct {
		name  string
		chunk string
		want  time.Duration // -1 for unknown
	}{
		{"llama.cpp", `{"choices":[],"timings":{"cache_n":16,"prompt_n":8,"prompt_ms":43.237}}`, 43237 * time.Microsecond},
		{"vLLM", `{"choices":[],"usage":{"prompt_tokens":9},"metrics":{"time_to_first_token_ms":85.2,"queue_time_ms":12.3}}`, 85200 * time.Microsecond},
		{"zero", `{"timings":{"prompt_ms":0}}`, 0},
		{"whole", `{"timings":{"prompt_ms":7}}`, 7 * time.Millisecond},
		{"an hour", `{"timings":{"prompt_ms":3600000}}`, time.Hour},
		{"absent", `{"timings":{"cache_n":16}}`, -1},
		{"metrics null", `{"metrics":null}`, -1},
		{"field null", `{"metrics":{"time_to_first_token_ms":null}}`, -1},
		{"string", `{"timings":{"prompt_ms":"43"}}`, -1},
		{"negative", `{"timings":{"prompt_ms":-1}}`, -1},
		{"beyond an hour", `{"timings":{"prompt_ms":3600001}}`, -1},
		{"infinite", `{"timings":{"prompt_ms":1e999}}`, -1},
		{"timings not an object", `{"timings":[1,2]}`, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st streamState
			st.reset()
			if st.handle(sseEvent{data: []byte(tt.chunk)}) {
				t.Fatalf("stopped: %s", st.failMsg)
			}
			got := time.Duration(-1)
			if st.prefillKnown {
				got = st.prefill
			}
			if got != tt.want {
				t.Errorf("prefill %v, want %v", got, tt.want)
			}
		})
	}
}

func TestStreamErrors(t *testing.T) {
	tests := []struct {
		name string
		ev   sseEvent
		want string
	}{
		{"nested", sseEvent{data: []byte(`{"error":{"message":"boom","type":"internal_server_error","code":500}}`)}, "internal_server_error: boom"},
		{"nested without message", sseEvent{data: []byte(`{"error":{"code":500}}`)}, "error chunk"},
		{"tgi", sseEvent{data: []byte(`{"error":"overloaded","error_type":"overloaded_error"}`)}, "overloaded_error: overloaded"},
		{"flat", sseEvent{data: []byte(`{"object":"error","message":"bad","type":"BadRequestError","code":400}`)}, "BadRequestError: bad"},
		{"error event with comment", sseEvent{errorEvent: true, comment: []byte("stream ended")}, "error event: stream ended"},
		{"error event with json", sseEvent{errorEvent: true, data: []byte(`{"error":{"message":"m"}}`)}, "error event: m"},
		{"error event with text", sseEvent{errorEvent: true, data: []byte(`oops`)}, "error event: oops"},
		{"bare error event", sseEvent{errorEvent: true}, "error event"},
		{"malformed", sseEvent{data: []byte(`{"choices":[`)}, "malformed chunk"},
		{"not an object", sseEvent{data: []byte(`[1,2]`)}, "chunk is not a JSON object"},
		{"number", sseEvent{data: []byte(`42`)}, "chunk is not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st streamState
			st.reset()
			if !st.handle(tt.ev) || !st.failed {
				t.Fatalf("did not fail")
			}
			if !strings.HasPrefix(st.failMsg, tt.want) {
				t.Errorf("message %q, want prefix %q", st.failMsg, tt.want)
			}
		})
	}
	var st streamState
	st.reset()
	if st.handle(sseEvent{data: []byte(`{"error":null,"choices":[]}`)}) {
		t.Errorf(`"error": null stopped the stream`)
	}
}

// fuzzClient is built once per fuzz run; readStream is safe for concurrent
// use like Do.
func newFuzzClient(f *testing.F) *Client {
	c, err := New(TargetConfig{Name: "fuzz", URL: "http://127.0.0.1:1", Dialect: engine.DialectSGLang})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(c.Close)
	return c
}

// FuzzSSE feeds arbitrary bytes as a response body, whole and cut into
// reads of split+1 bytes. The parser must not panic, must end in exactly one
// outcome of a body-only exchange (success or stream_error), and must not
// depend on how the bytes were cut.
func FuzzSSE(f *testing.F) {
	files, _ := filepath.Glob("testdata/streams/*.sse")
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(7))
	}
	c := newFuzzClient(f)
	f.Fuzz(func(t *testing.T, body []byte, split uint8) {
		ctx := context.Background()
		var whole, cut Response
		c.readStream(ctx, ctx, bytes.NewReader(body), "text/event-stream", anyRequest, 0, &whole)
		c.readStream(ctx, ctx, &chunkReader{b: body, n: int(split) + 1}, "text/event-stream", anyRequest, 0, &cut)
		for _, r := range []*Response{&whole, &cut} {
			switch r.Outcome {
			case OutcomeSuccess:
				if r.Error != "" {
					t.Fatalf("success with error %q", r.Error)
				}
			case OutcomeStreamError:
				if r.Error == "" {
					t.Fatal("stream_error without a reason")
				}
			default:
				t.Fatalf("outcome %q", r.Outcome)
			}
			if r.FirstToken.IsZero() != r.LastToken.IsZero() || r.LastToken.Before(r.FirstToken) {
				t.Fatalf("first %v last %v", r.FirstToken, r.LastToken)
			}
			if r.OutputTokens < 0 || r.PromptTokens < 0 || r.CachedTokens < 0 {
				t.Fatalf("negative count: %+v", r)
			}
			if r.PrefillTime < 0 || r.PrefillTime > maxPrefill || (!r.PrefillKnown && r.PrefillTime != 0) {
				t.Fatalf("prefill time %v (known %v)", r.PrefillTime, r.PrefillKnown)
			}
			if !r.OutputFromUsage && r.OutputTokens > 0 && r.FirstToken.IsZero() {
				t.Fatalf("counted %d content chunks without a first token", r.OutputTokens)
			}
		}
		if whole.Outcome != cut.Outcome || whole.Error != cut.Error ||
			whole.OutputTokens != cut.OutputTokens || whole.PromptTokens != cut.PromptTokens ||
			whole.CachedKnown != cut.CachedKnown || whole.CachedTokens != cut.CachedTokens ||
			whole.PrefillKnown != cut.PrefillKnown || whole.PrefillTime != cut.PrefillTime ||
			whole.FirstToken.IsZero() != cut.FirstToken.IsZero() {
			t.Fatalf("depends on read boundaries:\nwhole %+v\ncut   %+v", whole, cut)
		}
	})
}

// vllmStream renders a realistic vLLM chat stream: role-only chunk, n
// content chunks, finish chunk, usage chunk, [DONE]; one event per piece.
func vllmStream(n int) [][]byte {
	const head = `data: {"id":"chatcmpl-9b1f0c2e7a3d4c5e8f90a1b2c3d4e5f6","object":"chat.completion.chunk","created":1761523200,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{`
	const tail = `},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	words := []string{" the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", "\\n", " caf\\u00e9"}
	pieces := [][]byte{[]byte(head + `"role":"assistant","content":""` + tail)}
	for i := range n {
		pieces = append(pieces, []byte(head+`"content":"`+words[i%len(words)]+`"`+tail))
	}
	pieces = append(pieces,
		[]byte(head+`"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`+"\n\n"),
		[]byte(`data: {"id":"chatcmpl-9b1f0c2e7a3d4c5e8f90a1b2c3d4e5f6","object":"chat.completion.chunk","created":1761523200,"model":"Qwen/Qwen3-0.6B","choices":[],"usage":{"prompt_tokens":1043,"total_tokens":`+strconv.Itoa(1043+n)+`,"completion_tokens":`+strconv.Itoa(n)+`,"prompt_tokens_details":{"cached_tokens":1024}}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	return pieces
}

// BenchmarkSSEParseChunk parses a 256-token vLLM stream delivered one chunk
// per Read (so each chunk also pays its arrival timestamp) and reports the
// cost per chunk.
func BenchmarkSSEParseChunk(b *testing.B) {
	pieces := vllmStream(256)
	chunks := len(pieces)
	c := mustClient(b, TargetConfig{Dialect: engine.DialectVLLM})
	r := &pieceReader{pieces: pieces}
	ctx := context.Background()
	var res Response
	var bytesPerStream int
	for _, p := range pieces {
		bytesPerStream += len(p)
	}
	b.SetBytes(int64(bytesPerStream))
	b.ReportAllocs()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	for b.Loop() {
		r.rewind()
		c.readStream(ctx, ctx, r, "text/event-stream", anyRequest, 0, &res)
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	if res.Outcome != OutcomeSuccess || res.OutputTokens != 256 {
		b.Fatalf("unexpected result %+v", res)
	}
	total := float64(b.N) * float64(chunks)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/chunk")
	b.ReportMetric(total/b.Elapsed().Seconds(), "chunks/s")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/total, "allocs/chunk")
}

// BenchmarkClientStream32 runs whole requests against an httptest server
// streaming 32-token responses, one flush per chunk, from many goroutines.
// CPU time is the whole process's (client and server) where /proc is
// available.
func BenchmarkClientStream32(b *testing.B) {
	pieces := vllmStream(32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, p := range pieces {
			_, _ = w.Write(p)
			_ = rc.Flush()
		}
	}))
	defer srv.Close()
	c := mustClient(b, TargetConfig{Name: "bench", URL: srv.URL, Model: "Qwen/Qwen3-0.6B", Dialect: engine.DialectVLLM})
	cpu0, cpuOK := testutil.ProcessCPUSeconds()
	start := time.Now()
	streamParallel(b, c)
	elapsed := time.Since(start)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	if cpu1, ok := testutil.ProcessCPUSeconds(); cpuOK && ok {
		b.ReportMetric((cpu1-cpu0)/(float64(b.N)*32)*1e6, "cpu-s/1Mtok")
	}
}

// streamParallel has c stream 32-token answers to 200-word prompts from
// 8 goroutines per P, b.N in all, timed, and fails b if any request did.
func streamParallel(b *testing.B, c *Client) {
	var failed atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := Request{Prompt: strings.Repeat("hello ", 200), MaxTokens: 32}
		var res Response
		for pb.Next() {
			c.Do(context.Background(), req, &res)
			if res.Outcome != OutcomeSuccess {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d requests failed", n)
	}
}

// benchSinkEnv makes the test binary a sink (see TestMain).
const benchSinkEnv = "KVLOAD_REPLAY_BENCH_SINK"

// runBenchSink serves vllmStream(32), one flush per event, on a loopback
// port it prints, until its stdin closes.
func runBenchSink() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pieces := vllmStream(32)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, p := range pieces {
			_, _ = w.Write(p)
			_ = rc.Flush()
		}
	})}
	fmt.Println(ln.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = srv.Close()
	}()
	_ = srv.Serve(ln)
	return 0
}

// BenchmarkClientStream32Sink is BenchmarkClientStream32 with the server
// in a process of its own, so that cpu-µs/tok is the client's alone, and
// sink-cpu-µs/tok the server's beside it.
func BenchmarkClientStream32Sink(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), benchSinkEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("sink address: %v", err)
	}
	c := mustClient(b, TargetConfig{Name: "bench", URL: "http://" + strings.TrimSpace(addr), Model: "Qwen/Qwen3-0.6B", Dialect: engine.DialectVLLM})
	defer c.Close()
	cpu0, ok0 := testutil.ProcessCPUSeconds()
	sink0, okS0 := testutil.PIDCPUSeconds(cmd.Process.Pid)
	streamParallel(b, c)
	tokens := float64(b.N) * 32
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if cpu1, ok := testutil.ProcessCPUSeconds(); ok0 && ok {
		b.ReportMetric((cpu1-cpu0)/tokens*1e6, "cpu-µs/tok")
	}
	if sink1, ok := testutil.PIDCPUSeconds(cmd.Process.Pid); okS0 && ok {
		b.ReportMetric((sink1-sink0)/tokens*1e6, "sink-cpu-µs/tok")
	}
}

// TestSSEReaderMonotonicClock: without a clock of its own the reader times
// its reads from the monotonic clock; the times read as time.Now would.
func TestSSEReaderMonotonicClock(t *testing.T) {
	before := time.Now()
	var r sseReader
	r.reset(strings.NewReader("data: x\n\n"), nil)
	ev, ok := r.next()
	after := time.Now()
	if !ok || ev.at.Before(before) || ev.at.After(after) {
		t.Fatalf("event %v at %v, want one between %v and %v", ok, ev.at, before, after)
	}
	if d := ev.at.Round(0).Sub(before.Round(0)); d < 0 || d > after.Round(0).Sub(before.Round(0))+time.Millisecond {
		t.Errorf("the wall clock reading is %v after the start, want within the read", d)
	}
}
