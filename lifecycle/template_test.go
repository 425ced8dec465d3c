package lifecycle

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// TestTemplateOverhead: the chat template's size is used once two answers
// for prompts of different lengths agree on it (within a token), taken from
// the shorter prompt; failures, unknown usage, rows the exporter did not
// build, absurd differences and figures that do not agree teach nothing.
func TestTemplateOverhead(t *testing.T) {
	ok := func(built, prompt int) *replay.Result {
		return &replay.Result{PromptBuiltTokens: built, Response: openai.Response{Outcome: openai.OutcomeSuccess, PromptKnown: true, PromptTokens: prompt}}
	}
	failed := ok(100, 120)
	failed.Outcome = openai.OutcomeHTTPError
	unknown := ok(100, 0)
	unknown.PromptKnown = false
	for _, tt := range []struct {
		name    string
		results []*replay.Result
		want    int
	}{
		{"nothing yet", nil, 0},
		{"one answer is not enough", []*replay.Result{ok(1000, 1012)}, 0},
		{"two agree", []*replay.Result{ok(1000, 1012), ok(100, 112)}, 12},
		{"within a token: the shorter prompt's", []*replay.Result{ok(1000, 1013), ok(100, 112)}, 12},
		{"within a token, the other order", []*replay.Result{ok(100, 112), ok(1000, 1013)}, 12},
		{"the same length twice proves nothing", []*replay.Result{ok(100, 112), ok(100, 112)}, 0},
		{"a constant figure never agrees", []*replay.Result{ok(100, 500), ok(200, 500), ok(300, 500)}, 0},
		{"disagreement then agreement", []*replay.Result{ok(100, 150), ok(200, 212), ok(300, 312)}, 12},
		{"kept once known", []*replay.Result{ok(100, 112), ok(200, 212), ok(300, 330), ok(400, 430)}, 12},
		{"failed", []*replay.Result{failed, ok(200, 220)}, 0},
		{"no usage", []*replay.Result{unknown, ok(200, 220)}, 0},
		{"not built by the exporter", []*replay.Result{ok(0, 500), ok(200, 220)}, 0},
		{"server counted fewer", []*replay.Result{ok(100, 90), ok(200, 190)}, 0},
		{"absurd", []*replay.Result{ok(100, 100+maxTemplateTokens+1), ok(200, 200+maxTemplateTokens+1)}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var o templateOverhead
			for _, r := range tt.results {
				o.observe(r)
			}
			if got := o.get(); got != tt.want {
				t.Errorf("overhead %d, want %d", got, tt.want)
			}
		})
	}
}

// TestChatTemplateLearnt: against a chat server whose template adds 7
// tokens, the first two answers teach the exporter the template's size,
// and every later prompt is counted by the server at exactly the trace's
// input_length, as far as its last block allows.
func TestChatTemplateLearnt(t *testing.T) {
	t.Parallel()
	const template = 7
	var mu sync.Mutex
	var counted []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) != 1 {
			http.Error(w, "want one message", http.StatusBadRequest)
			return
		}
		n := len(strings.Fields(req.Messages[0].Content)) + template // a word is a token
		mu.Lock()
		counted = append(counted, n)
		mu.Unlock()
		streamOneToken(w, n)
	}))
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	var trace strings.Builder
	// The last row's last block is 3 tokens: only 2 of the template's 7
	// are taken from it, so that a token of its own stays.
	const rows = 7
	isl := func(i int) int {
		if i == rows-1 {
			return 2*16 + 3
		}
		return 40 + i
	}
	for i := range rows {
		fmt.Fprintf(&trace, `{"timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": [%d, %d, %d]}`+"\n", 100*i, isl(i), 3*i, 3*i+1, 3*i+2)
	}
	daemontest.WriteFile(t, filepath.Join(dir, "trace.jsonl"), trace.String())
	path := filepath.Join(dir, "kvload.yml")
	cfg := daemontest.Config(srv.URL, "trace.jsonl")
	cfg.Targets[0].API = "chat"
	daemontest.WriteConfig(t, path, cfg)
	var logs testutil.Buffer
	_, play := rowByRow(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) })
	play(rows, 100*time.Millisecond)
	testutil.Eventually(t, "every row answered", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(counted) == rows, fmt.Sprint(counted)
	})
	mu.Lock()
	defer mu.Unlock()
	for i, n := range counted {
		want := isl(i)
		switch {
		case i < 2:
			want += template // before two answers agreed
		case i == rows-1:
			want += template - 2
		}
		if n != want {
			t.Errorf("prompt %d counted %d tokens, want %d (all: %v)", i+1, n, want, counted)
		}
	}
	if !strings.Contains(logs.String(), "chat template overhead learnt") || !strings.Contains(logs.String(), fmt.Sprintf("tokens=%d", template)) {
		t.Errorf("the log does not say the template was learnt:\n%s", logs.String())
	}
}

// TestTemplateCrossCheck: a size measured through the tokenize endpoint is
// used at once and checked against the answers as a learnt one is: two
// answers that agree on another size (by more than a token) replace it,
// once, exported as a correction; answers that agree with it, or not with
// each other, leave it.
func TestTemplateCrossCheck(t *testing.T) {
	ok := func(built, prompt int) *replay.Result {
		return &replay.Result{PromptBuiltTokens: built, Response: openai.Response{Outcome: openai.OutcomeSuccess, PromptKnown: true, PromptTokens: prompt}}
	}
	type published struct {
		tokens    int
		source    collector.TemplateSource
		corrected bool
	}
	for _, tt := range []struct {
		name     string
		measured int
		results  []*replay.Result
		want     int
		exported []published
	}{
		{"measured, not yet checked", 1000, nil, 1000, []published{{1000, "tokenize", false}}},
		{"confirmed", 12, []*replay.Result{ok(1000, 1012), ok(100, 112)}, 12, []published{{12, "tokenize", false}}},
		{"confirmed within a token", 12, []*replay.Result{ok(1000, 1013), ok(100, 113)}, 12, []published{{12, "tokenize", false}}},
		{"contradicted", 1000, []*replay.Result{ok(1000, 1005), ok(100, 105)}, 5,
			[]published{{1000, "tokenize", false}, {5, "answers", true}}},
		{"replaced once", 1000, []*replay.Result{ok(1000, 1005), ok(100, 105), ok(200, 230), ok(300, 330)}, 5,
			[]published{{1000, "tokenize", false}, {5, "answers", true}}},
		{"answers that disagree teach nothing", 1000, []*replay.Result{ok(100, 150), ok(200, 212), ok(400, 500)}, 1000, []published{{1000, "tokenize", false}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []published
			o := newTemplateOverhead(nil, tt.measured, true, func(tokens int, source collector.TemplateSource, corrected bool) {
				got = append(got, published{tokens, source, corrected})
			})
			o.start()
			for _, r := range tt.results {
				o.observe(r)
			}
			if n := o.get(); n != tt.want {
				t.Errorf("overhead %d, want %d", n, tt.want)
			}
			if !slices.Equal(got, tt.exported) {
				t.Errorf("exported %v, want %v", got, tt.exported)
			}
		})
	}
}

// TestChatTemplateCorrected: against a chat server whose tokenize
// endpoint claims its template is 1,000 tokens where its chat route adds
// 5, the first prompts leave 1,000 tokens of room; their answers show 5,
// which replaces it, logged once with both figures and exported, and
// every later prompt is counted at the trace's input_length. Without the
// check every prompt stayed 995 tokens short.
func TestChatTemplateCorrected(t *testing.T) {
	t.Parallel()
	const (
		template = 5
		claimed  = 1000
	)
	var mu sync.Mutex
	var counted []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt   string
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/tokenize" { // a word is a token; the chat form lies
			n := len(strings.Fields(req.Prompt))
			if len(req.Messages) == 1 {
				n = len(strings.Fields(req.Messages[0].Content)) + claimed
			}
			fmt.Fprintf(w, `{"count": %d, "tokens": [%s]}`, n, strings.TrimSuffix(strings.Repeat("7,", n), ","))
			return
		}
		if len(req.Messages) != 1 {
			http.Error(w, "want one message", http.StatusBadRequest)
			return
		}
		n := len(strings.Fields(req.Messages[0].Content)) + template
		mu.Lock()
		counted = append(counted, n)
		mu.Unlock()
		streamOneToken(w, n)
	}))
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	var trace strings.Builder
	const rows = 6
	isl := func(i int) int { return 2000 + 10*i } // one block each
	for i := range rows {
		fmt.Fprintf(&trace, `{"timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": [%d]}`+"\n", 100*i, isl(i), i)
	}
	daemontest.WriteFile(t, filepath.Join(dir, "trace.jsonl"), trace.String())
	path := filepath.Join(dir, "kvload.yml")
	cfg := daemontest.Config(srv.URL, "trace.jsonl")
	cfg.Targets[0].API = "chat"
	cfg.Workloads[0].BlockSize = 4096
	daemontest.WriteConfig(t, path, cfg)
	var logs testutil.Buffer
	d, play := rowByRow(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) })
	if v, _ := testutil.Gather(t, d.reg).Value("kvload_chat_template_tokens", "source", "tokenize"); v != claimed {
		t.Fatalf("kvload_chat_template_tokens{source=tokenize} %v at the start, want the %d measured", v, claimed)
	}
	play(rows, 100*time.Millisecond)
	testutil.Eventually(t, "every row answered", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(counted) == rows, fmt.Sprint(counted)
	})
	mu.Lock()
	defer mu.Unlock()
	for i, n := range counted {
		want := isl(i)
		if i < 2 { // before two answers agreed
			want += template - claimed
		}
		if n != want {
			t.Errorf("prompt %d counted %d tokens, want %d (all: %v)", i+1, n, want, counted)
		}
	}
	const corrected = `level=warn workload=w target=t msg="the chat template size measured through the target's tokenize endpoint disagrees`
	if log := logs.String(); strings.Count(log, corrected) != 1 || !strings.Contains(log, "measured_tokens=1000 answered_tokens=5") {
		t.Errorf("the correction is not logged once with both figures:\n%s", log)
	}
	mfs := testutil.Gather(t, d.reg)
	if v, n := mfs.Value("kvload_chat_template_tokens", "source", "answers"); v != template || n != 1 {
		t.Errorf("kvload_chat_template_tokens{source=answers} %v (%d series), want %d", v, n, template)
	}
	if _, n := mfs.Value("kvload_chat_template_tokens", "source", "tokenize"); n != 0 {
		t.Errorf("the measured size is still exported")
	}
	if v, _ := mfs.Value("kvload_chat_template_corrections_total"); v != 1 {
		t.Errorf("kvload_chat_template_corrections_total %v, want 1", v)
	}
}

// streamOneToken answers a chat request with one streamed token and a
// usage of promptTokens prompt tokens.
func streamOneToken(w http.ResponseWriter, promptTokens int) {
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},\"finish_reason\":\"length\"}]}\n\n")
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":1,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", promptTokens, promptTokens+1)
}

// manualClock is the kit's fake clock as the replay's dispatch clock: a
// row is due when the test says, never because the machine was slow.
type manualClock struct{ *testutil.Clock }

// NewTimer returns a stopped timer.
func (c manualClock) NewTimer() replay.DispatchTimer { return c.Clock.NewTimer() }

// rowByRow starts a daemon on the configuration file path with a dispatch
// clock that stands still until the test moves it. The returned play runs
// a trace of rows rows gap apart: it moves the clock on to the next row
// only once every answer so far was heard by all of the daemon's side
// jobs. A row is thus never built before the answers to the rows ahead of
// it were learnt from, however slow the machine.
func rowByRow(t *testing.T, path string, configure func(*Options)) (d *started, play func(rows int, gap time.Duration)) {
	t.Helper()
	clock := manualClock{testutil.NewClock()}
	var observed atomic.Int64
	d, err := startDaemon(t, path, func(o *Options) {
		o.dispatchClock = clock
		o.ResultObserved = func(*replay.Result) { observed.Add(1) }
		configure(o)
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, func(rows int, gap time.Duration) {
		t.Helper()
		for i := 1; i < rows; i++ {
			testutil.Eventually(t, fmt.Sprintf("answer %d heard", i), func() (bool, string) {
				n := observed.Load()
				return n >= int64(i), fmt.Sprint(n, " heard")
			})
			clock.Advance(gap)
		}
	}
}
