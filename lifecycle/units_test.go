package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// recordingServer is the kit's fake server behind a handler that keeps
// every completion request's body and session header.
type recordingServer struct {
	*httptest.Server
	header string

	mu       sync.Mutex
	bodies   []string
	sessions []string // "-" where the header was absent
}

func newRecordingServer(t *testing.T, header string) *recordingServer {
	t.Helper()
	fake := newFakeServer(t, nil)
	rs := &recordingServer{header: header}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/completions") {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			session := "-"
			if v := r.Header.Values(header); len(v) > 0 {
				session = v[0]
			}
			rs.mu.Lock()
			rs.bodies = append(rs.bodies, string(body))
			rs.sessions = append(rs.sessions, session)
			rs.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		fake.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(rs.Close)
	return rs
}

// recorded returns the bodies and sessions so far, each sorted: requests
// go out concurrently, in no fixed order.
func (rs *recordingServer) recorded() (bodies, sessions []string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	bodies, sessions = slices.Clone(rs.bodies), slices.Clone(rs.sessions)
	slices.Sort(bodies)
	slices.Sort(sessions)
	return bodies, sessions
}

// sessionTrace: a session of two turns, one whose id a header cannot hold
// as it is, and a row without a session.
const sessionTrace = `{"timestamp": 0, "session_id": "s1", "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}
{"timestamp": 0, "session_id": "sess ä", "input_length": 20, "output_length": 2, "hash_ids": [3, 4]}
{"session_id": "s1", "input_length": 40, "output_length": 2, "hash_ids": [1, 2, 5]}
{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [6, 7]}
`

// runOnce runs workload cfg once against its targets and returns when
// every server has recorded rows requests.
func runOnce(t *testing.T, cfg config.Config, rows int, servers ...*recordingServer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, cfg)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, rs := range servers {
		testutil.Eventually(t, fmt.Sprintf("server %d: %d requests", i, rows), func() (bool, string) {
			bodies, _ := rs.recorded()
			return len(bodies) == rows, fmt.Sprintf("%d requests", len(bodies))
		})
	}
	d.stop()
	testutil.Wait(t, "the daemon stopped", d.Done())
}

// TestSessionHeader: a target's session header carries each request's
// session, the trace's session_id (percent-encoded where a header could
// not hold it) or the row's own id; a target without one sends none.
func TestSessionHeader(t *testing.T) {
	t.Parallel()
	const header = "X-Session-ID"
	with, without := newRecordingServer(t, header), newRecordingServer(t, header)
	trace := filepath.Join(t.TempDir(), "sessions.jsonl")
	daemontest.WriteFile(t, trace, sessionTrace)
	a, b := daemontest.Target("a", with.URL), daemontest.Target("b", without.URL)
	a.SessionHeader = header
	runOnce(t, config.Config{
		Targets:   []config.Target{a, b},
		Workloads: []config.Workload{daemontest.Workload("w", trace, "a", "b")},
	}, 4, with, without)

	if _, got := with.recorded(); !slices.Equal(got, []string{"row-4", "s1", "s1", "sess%20%C3%A4"}) {
		t.Errorf("session headers %q, want the session ids (one percent-encoded) and row-4", got)
	}
	if _, got := without.recorded(); !slices.Equal(got, []string{"-", "-", "-", "-"}) {
		t.Errorf("a target without session_header sent %q", got)
	}
}

// TestReproduciblePrompts: two runs of a loop: once workload with
// prompts: {reproducible: true} and the same seed send byte-identical
// bodies; by default each run sends prompts of its own.
func TestReproduciblePrompts(t *testing.T) {
	t.Parallel()
	trace := filepath.Join(t.TempDir(), "sessions.jsonl")
	daemontest.WriteFile(t, trace, sessionTrace)
	runs := func(reproducible bool) (first, second []string) {
		for i := range 2 {
			rs := newRecordingServer(t, "")
			w := daemontest.Workload("w", trace, "t")
			w.Seed = 7
			w.Prompts.Reproducible = reproducible
			runOnce(t, config.Config{Targets: []config.Target{daemontest.Target("t", rs.URL)}, Workloads: []config.Workload{w}}, 4, rs)
			bodies, _ := rs.recorded()
			if i == 0 {
				first = bodies
			} else {
				second = bodies
			}
		}
		return first, second
	}
	first, second := runs(true)
	if !slices.Equal(first, second) {
		t.Errorf("reproducible prompts differ between two runs:\n%q\n%q", first, second)
	}
	first, second = runs(false)
	if len(first) != 4 || slices.Equal(first, second) {
		t.Errorf("by default two runs sent the same bodies:\n%q", first)
	}
}

// TestSurplusIDsNotedOnce: a trace whose rows have more hash_ids than
// their input_length fills is replayed from the ids that fit; Check says
// so, naming the workload's block_size, and the daemon logs it once per
// file read, not at a reload that keeps the file.
func TestSurplusIDsNotedOnce(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	tracePath, path := filepath.Join(dir, "t.jsonl"), filepath.Join(dir, "kvload.yml")
	// In 16-token blocks: 20 tokens fill 2 of 3 ids, 40 tokens 3 of 5.
	daemontest.WriteFile(t, tracePath, `{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 3600000, "input_length": 40, "output_length": 1, "hash_ids": [1, 2, 4, 5, 6]}
{"timestamp": 7200000, "input_length": 16, "output_length": 1, "hash_ids": [1]}
`)
	cfg := daemontest.Config(srv.URL, tracePath)
	daemontest.WriteConfig(t, path, cfg)

	notes, err := Check(path)
	want := "workload w: " + tracePath + ": 2 rows have more hash_ids than their input_length fills in 16-token blocks (the first at line 1): 3 ids to spare in all, at most 2 in one row; their prompts use the ids that fit. Is workloads[0].block_size (16) the block size the trace was made with?"
	if err != nil || len(notes) != 1 || notes[0] != want {
		t.Fatalf("Check = %q, %v; want\n%q", notes, err, want)
	}

	logs := &testutil.Buffer{}
	d, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(logs) })
	if err != nil {
		t.Fatal(err)
	}
	rows := d.units.byKey[unitKey{"w", "t"}].plan.Rows()
	for i, n := range []int{2, 3, 1} {
		if ids, _ := rows.AppendHashIDs(nil, i); len(ids) != n {
			t.Errorf("row %d replays %v, want the %d ids that fit", i+1, ids, n)
		}
	}
	cfg.Workloads[0].MaxInFlight = 7 // a change that keeps the file
	daemontest.WriteConfig(t, path, cfg)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "2 rows have more hash_ids"); n != 1 {
		t.Errorf("the note is logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestChainReuseNoted: a trace whose rows reuse hash ids after other
// blocks (AIPerf's documentation trace) gets a note from Check and one
// line in the log, saying how many rows do and that an engine can serve
// less than a hit rate counted by id.
func TestChainReuseNoted(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	tracePath, path := filepath.Join(dir, "t.jsonl"), filepath.Join(dir, "kvload.yml")
	doc, err := os.ReadFile("../testdata/aiperf/custom_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	daemontest.WriteFile(t, tracePath, string(doc))
	cfg := daemontest.Config(srv.URL, tracePath)
	cfg.Workloads[0].BlockSize = 512
	daemontest.WriteConfig(t, path, cfg)

	notes, err := Check(path)
	want := "workload w: " + tracePath + ": 1 of 3 rows use a hash id after another chain of blocks than where it first came (the first at line 3): " +
		"an engine's prefix cache keys a block by its whole prefix, so it can serve less than a hit rate counted by id (AIPerf's, datagen's) says; " +
		"the exporter's model keys blocks as the engine does"
	if err != nil || len(notes) != 1 || notes[0] != want {
		t.Fatalf("Check = %q, %v; want\n%q", notes, err, want)
	}
	logs := &testutil.Buffer{}
	if _, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(logs) }); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "1 of 3 rows use a hash id after another chain"); n != 1 {
		t.Errorf("the note is logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestTooFewIDsNamesBlockSize: a row whose ids cannot hold its length at
// the workload's block size is an error that names the block_size key.
func TestTooFewIDsNamesBlockSize(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tracePath, path := filepath.Join(dir, "t.jsonl"), filepath.Join(dir, "kvload.yml")
	daemontest.WriteFile(t, tracePath, `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`+"\n")
	cfg := daemontest.Config("http://127.0.0.1:1", tracePath)
	cfg.Workloads[0].BlockSize = 64
	daemontest.WriteConfig(t, path, cfg)
	_, err := Check(path)
	if !errors.Is(err, trace.ErrTooFewHashIDs) || !strings.Contains(err.Error(), "t.jsonl:1: input_length 600 does not fit 2 hash_ids of 64-token blocks: it needs 10; workloads[0].block_size is 64 tokens") {
		t.Errorf("Check: %v", err)
	}
}

// TestSendsTokenIDs: a target with prompt_format: token_ids gets its
// prompts as token ids, as many as the trace's input_length (a regression:
// the daemon used to build the token-id builder and send text anyway).
func TestSendsTokenIDs(t *testing.T) {
	t.Parallel()
	prompts := make(chan json.RawMessage, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt json.RawMessage `json:"prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("request body: %v", err)
		}
		select {
		case prompts <- req.Prompt:
		default:
		}
		http.Error(w, `{"error":{"message":"not here"}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	cfg := config.Config{
		Targets:   []config.Target{{Name: "ids", URL: srv.URL, Model: "m", API: "completions", PromptFormat: "token_ids"}},
		Workloads: []config.Workload{daemontest.Workload("w", fixture(t, "future.jsonl"), "ids")},
	}
	daemontest.WriteConfig(t, path, cfg)
	if _, err := startDaemon(t, path, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var ids []int
		p := testutil.Wait(t, "a request", prompts)
		if err := json.Unmarshal(p, &ids); err != nil {
			t.Fatalf("prompt %.80s…: not a list of token ids: %v", p, err)
		}
		if len(ids) != 20 {
			t.Errorf("%d token ids, want the trace's input_length 20", len(ids))
		}
	}
}

// TestOnceEndLogged: a loop: once workload logs one info line naming it and
// its target when its single pass is done and drained; a workload still
// replaying (loop: repeat) logs none.
func TestOnceEndLogged(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	trace := filepath.Join(dir, "now.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [3, 4]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kvload.yml")
	forever := daemontest.Workload("forever", fixture(t, "future.jsonl"), "t")
	forever.Loop = "repeat"
	daemontest.WriteConfig(t, path, config.Config{
		Targets:   []config.Target{daemontest.Target("t", srv.URL)},
		Workloads: []config.Workload{daemontest.Workload("once", trace, "t"), forever},
	})
	var logs testutil.Buffer
	d, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) })
	if err != nil {
		t.Fatal(err)
	}
	const line = `msg="replay finished: its single pass is done and drained"`
	testutil.Eventually(t, "the end of the once workload logged", func() (bool, string) {
		return strings.Contains(logs.String(), line), logs.String()
	})
	d.stop()
	testutil.Wait(t, "the daemon stopped", d.Done())
	var ends []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, line) {
			ends = append(ends, l)
		}
	}
	if len(ends) != 1 || !strings.Contains(ends[0], "workload=once") || !strings.Contains(ends[0], "target=t ") ||
		!strings.Contains(ends[0], "level=info") {
		t.Errorf("want one info line for workload once, target t; got %q", ends)
	}
}

// TestLoopsAfterRestart: a workload whose units all start over — removed
// by a reload then added back, or changed — counts its new passes in
// kvload_trace_loops_total. (A changed one used to count none until it had
// replayed as many passes as before the change: the collector remembered
// them.)
func TestLoopsAfterRestart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(cfg config.Config) []config.Config // the configurations applied in turn
	}{
		{"removed then added back", func(cfg config.Config) []config.Config {
			without := cfg
			without.Workloads = cfg.Workloads[:1] // "other" only
			return []config.Config{without, cfg}
		}},
		{"changed", func(cfg config.Config) []config.Config {
			changed := cfg
			changed.Workloads = slices.Clone(cfg.Workloads)
			changed.Workloads[1].MaxInFlight = 7
			return []config.Config{changed}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, nil)
			dir := t.TempDir()
			trace := filepath.Join(dir, "short.jsonl")
			if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 20, "input_length": 20, "output_length": 1, "hash_ids": [3, 4]}
`), 0o644); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "kvload.yml")
			cfg := daemontest.Config(srv.URL, trace)
			cfg.Workloads[0].Name = "other"
			w := daemontest.Workload("w", trace, "t")
			w.Loop = "repeat"
			cfg.Workloads = append(cfg.Workloads, w)
			daemontest.WriteConfig(t, path, cfg)
			d, err := startDaemon(t, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			loops := func() float64 {
				v, _ := testutil.Gather(t, d.reg).Value("kvload_trace_loops_total", "workload", "w")
				return v
			}
			testutil.Eventually(t, "passes counted", func() (bool, string) { return loops() >= 10, fmt.Sprint(loops()) })
			for _, c := range tt.change(cfg) {
				daemontest.WriteConfig(t, path, c)
				if err := d.Reload(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			before := loops()
			u := d.units.byKey[unitKey{"w", "t"}] // read after Reload answered: the owner is idle
			// Passes are numbered on the anchored grid: three after the restart's.
			first := u.workload.Position().Pass
			testutil.Eventually(t, "the restarted workload three passes on", func() (bool, string) {
				p := u.workload.Position()
				return p.Pass >= first+3, fmt.Sprintf("%+v", p)
			})
			// Counting on from before, or afresh from a deleted series; not
			// stuck where it was.
			if got := loops(); got-before < 2 && (got < 2 || got >= before) {
				t.Errorf("kvload_trace_loops_total %v after 3 passes of the restarted workload (it was %v at the restart)", got, before)
			}
		})
	}
}
