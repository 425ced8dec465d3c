package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newFakeServer is the kit's fake server standing for a vLLM: its /metrics
// answers the cache discovery and the server-metrics scrapers.
func newFakeServer(t *testing.T, configure func(*testutil.FakeServer)) *testutil.FakeServer {
	t.Helper()
	return testutil.NewFakeServer(t, func(f *testutil.FakeServer) {
		f.Metrics = testutil.VLLMMetrics
		if configure != nil {
			configure(f)
		}
	})
}

// started is a daemon started on path, stopped (and drained) by the test's
// cleanup.
type started struct {
	*Daemon
	reg     *prometheus.Registry
	stop    context.CancelFunc
	held    <-chan struct{} // a test's beforeApply hook says it holds a reload
	release chan struct{}   // and lets it go on when closed
}

func startDaemon(t *testing.T, path string, configure func(*Options)) (*started, error) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o := Options{ConfigFile: path, DrainTimeout: time.Second, Collector: collector.New(reg)}
	if configure != nil {
		configure(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := New(o)
	if err := d.Start(ctx); err != nil {
		cancel()
		return nil, err
	}
	s := &started{Daemon: d, reg: reg, stop: cancel}
	t.Cleanup(func() {
		cancel()
		<-d.Done()
	})
	return s, nil
}

// reloadConfig is the configuration of the direct reload test: three
// workloads on three targets (paths of one server), each replaying
// future.jsonl: two rows at once, the third an hour later, so every
// workload stands at position {0 2} for the whole test.
func reloadConfig(srvURL, trace string, changeInFlight int, withRemove bool) config.Config {
	names := []string{"keep", "change"}
	if withRemove {
		names = append(names, "remove")
	}
	cfg := twoWorkloads(srvURL, trace, names...)
	for i := range cfg.Workloads {
		cfg.Workloads[i].MaxInFlight = 8
		if cfg.Workloads[i].Name == "change" {
			cfg.Workloads[i].MaxInFlight = changeInFlight
		}
	}
	return cfg
}

// TestReloadUnits reloads a real file through the owner goroutine and looks at the units themselves:
// (a) an unchanged workload keeps its unit, trace position and counters;
// (b) a changed one restarts from the start with fresh series;
// (c) a removed one's series are gone;
// (d) an invalid file changes nothing but the reload gauge.
func TestReloadUnits(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	ctx := t.Context()
	daemontest.WriteConfig(t, path, reloadConfig(srv.URL, trace, 8, true))
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := d.reg
	successes := func(w string) float64 {
		v, _ := testutil.Gather(t, reg).Value("kvload_requests_total", "workload", w, "outcome", "success")
		return v
	}
	testutil.Eventually(t, "the first two rows of every workload done", func() (bool, string) {
		k, c, r := successes("keep"), successes("change"), successes("remove")
		return k == 2 && c == 2 && r == 2, fmt.Sprintf("keep %v, change %v, remove %v", k, c, r)
	})
	keepKey, changeKey := unitKey{"keep", "t-keep"}, unitKey{"change", "t-change"}
	keep, change := d.units[keepKey], d.units[changeKey]
	wantPos := replay.TracePosition{Pass: 0, Conv: 2}
	for _, u := range []*unit{keep, change} {
		if got := u.workload.Position(); got != wantPos {
			t.Fatalf("position before the reload %+v, want %+v", got, wantPos)
		}
	}

	// (d) An invalid file: nothing changes but the gauge.
	invalid := reloadConfig(srv.URL, trace, 8, true)
	invalid.Workloads[0].Targets = []string{"t-nope"}
	daemontest.WriteConfig(t, path, invalid)
	if err := d.Reload(ctx); err == nil || !strings.Contains(err.Error(), `unknown target "t-nope"`) {
		t.Fatalf("reload of an invalid file: %v", err)
	}
	mfs := testutil.Gather(t, reg)
	if v, _ := mfs.Value("kvload_config_last_reload_successful"); v != 0 {
		t.Errorf("kvload_config_last_reload_successful %v after a bad reload, want 0", v)
	}
	if len(d.units) != 3 || d.units[keepKey] != keep || d.units[changeKey] != change {
		t.Errorf("a rejected file changed the units: %v", d.units)
	}
	if v, _ := mfs.Value("kvload_requests_total", "workload", "remove"); v != 2 {
		t.Errorf("a rejected file reset the counters: remove has %v requests, want 2", v)
	}

	// Change "change", drop "remove", leave "keep" alone.
	daemontest.WriteConfig(t, path, reloadConfig(srv.URL, trace, 4, false))
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}

	// (a) kept: the same unit, still at its position, counters intact.
	if got := d.units[keepKey]; got != keep {
		t.Errorf("unchanged workload got a new unit (%p, was %p)", got, keep)
	} else if got.workload != keep.workload {
		t.Errorf("unchanged workload got a new replay.Workload")
	}
	if got := keep.workload.Position(); got != wantPos {
		t.Errorf("unchanged workload's position %+v, want %+v", got, wantPos)
	}
	if v := successes("keep"); v != 2 {
		t.Errorf("unchanged workload's requests %v after the reload, want 2 (not reset)", v)
	}

	// (b) changed: a new unit replaying from the start, counted afresh.
	if got := d.units[changeKey]; got == nil || got == change || got.workload == change.workload {
		t.Fatalf("changed workload kept its unit")
	}
	testutil.Eventually(t, "the changed workload replayed again from the start", func() (bool, string) {
		return srv.Count("/change/v1/chat/completions") == 4 && successes("change") == 2,
			fmt.Sprintf("server saw %d, counted %v", srv.Count("/change/v1/chat/completions"), successes("change"))
	})
	if got := d.units[changeKey].workload.Position(); got != wantPos {
		t.Errorf("restarted workload's position %+v, want %+v", got, wantPos)
	}
	if got := srv.Count("/keep/v1/chat/completions"); got != 2 {
		t.Errorf("unchanged workload sent %d requests in all, want 2 (it must not start over)", got)
	}

	// (c) removed: no series left with its workload or target label.
	mfs = testutil.Gather(t, reg)
	if s := append(mfs.SeriesWith("workload", "remove"), mfs.SeriesWith("target", "t-remove")...); len(s) > 0 {
		t.Errorf("series of the removed workload remain: %v", s)
	}
	if _, ok := d.units[unitKey{"remove", "t-remove"}]; ok || len(d.units) != 2 {
		t.Errorf("units after the reload: %v", d.units)
	}
	if v, _ := mfs.Value("kvload_config_last_reload_successful"); v != 1 {
		t.Errorf("kvload_config_last_reload_successful %v, want 1", v)
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

// TestReloadGaugeAfterRevert: the file is made invalid, then restored to
// exactly the bytes that run. The watcher's content check must not take the
// restored file for "unchanged": the gauge returns to 1. Writing the same
// invalid bytes again sets it back to 0.
func TestReloadGaugeAfterRevert(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	good := daemontest.Marshal(t, twoWorkloads(srv.URL, fixture(t, "future.jsonl"), "w"))
	badCfg := twoWorkloads(srv.URL, fixture(t, "future.jsonl"), "w")
	badCfg.Workloads[0].Targets = []string{"t-nope"}
	bad := daemontest.Marshal(t, badCfg)
	daemontest.WriteFile(t, path, good)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		write []byte
		want  float64
	}{
		{bad, 0},
		{good, 1}, // the bytes that run
		{bad, 0},  // the bytes last rejected, rejected again
		{good, 1},
	}
	for i, s := range steps {
		daemontest.WriteFile(t, path, s.write)
		// As the file watcher asks: an unchanged file is skipped. A bad
		// file's error is what the gauge and the status must show.
		_ = d.request(t.Context(), false)
		if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != s.want {
			t.Errorf("step %d: kvload_config_last_reload_successful %v, want %v", i, v, s.want)
		}
		if got := d.Status().ReloadOK; got != (s.want == 1) {
			t.Errorf("step %d: landing page's reload ok %v", i, got)
		}
	}
}

// TestBadReloadKeepsRunning: a reload of input that cannot be applied (the
// configuration, or a trace it names, broken in ways a user would) answers
// the problem, sets the reload gauge to 0 and leaves the running set alone:
// the same unit keeps sending. The whole catalogue of bad inputs, with the
// exact messages, is cmd/kvload-exporter's TestBadInputReload (through
// POST /-/reload).
func TestBadReloadKeepsRunning(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// breakIt leaves dir/kvload.yml broken; good is the configuration
		// that runs, the test's own copy.
		breakIt func(t *testing.T, dir string, good config.Config)
		errSub  string
	}{
		{"unknown target", func(t *testing.T, dir string, good config.Config) {
			good.Workloads[0].Targets = []string{"t-nope"}
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, `unknown target "t-nope"`},
		{"truncated YAML", func(t *testing.T, dir string, good config.Config) {
			text := daemontest.Marshal(t, good)
			daemontest.WriteFile(t, filepath.Join(dir, "kvload.yml"), text[:len(text)/2])
		}, "kvload.yml"},
		{"trace missing", func(t *testing.T, dir string, good config.Config) {
			good.Workloads[0].Trace = "gone.jsonl"
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, "gone.jsonl"},
		{"trace with a bad row", func(t *testing.T, dir string, good config.Config) {
			daemontest.WriteFile(t, filepath.Join(dir, "bad.jsonl"), []byte(`{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": "soon", "input_length": 20}
`))
			good.Workloads[0].Trace = "bad.jsonl"
			daemontest.WriteConfig(t, filepath.Join(dir, "kvload.yml"), good)
		}, "bad.jsonl:2"},
		{"configuration is a directory", func(t *testing.T, dir string, _ config.Config) {
			path := filepath.Join(dir, "kvload.yml")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "kvload.yml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, nil)
			dir := t.TempDir()
			steady, err := os.ReadFile(daemontest.SteadyTrace(t, dir))
			if err != nil {
				t.Fatal(err)
			}
			daemontest.WriteFile(t, filepath.Join(dir, "trace.jsonl"), steady)
			good := func() config.Config {
				cfg := twoWorkloads(srv.URL, "trace.jsonl", "w")
				cfg.Workloads[0].Loop = "repeat"
				return cfg
			}
			path := filepath.Join(dir, "kvload.yml")
			daemontest.WriteConfig(t, path, good())
			d, err := startDaemon(t, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := d.units[unitKey{"w", "t-w"}] // Start answered: the owner is idle

			tt.breakIt(t, dir, good())
			err = d.Reload(t.Context())
			if err == nil || !strings.Contains(err.Error(), tt.errSub) {
				t.Fatalf("reload: %v, want an error naming %q", err, tt.errSub)
			}
			if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 0 {
				t.Errorf("kvload_config_last_reload_successful %v, want 0", v)
			}
			if st := d.Status(); st.ReloadOK || !strings.Contains(st.ReloadError, tt.errSub) {
				t.Errorf("landing page status: ok %v, error %q", st.ReloadOK, st.ReloadError)
			}
			if got := d.units[unitKey{"w", "t-w"}]; got != before || len(d.units) != 1 {
				t.Errorf("the rejected reload changed the units: %v", d.units)
			}
			sent := srv.Count("/w/v1/chat/completions")
			testutil.Eventually(t, "the old workload still sending", func() (bool, string) {
				n := srv.Count("/w/v1/chat/completions")
				return n > sent, fmt.Sprintf("%d requests, %d at the reload", n, sent)
			})
		})
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
			u := d.units[unitKey{"w", "t"}] // read after Reload answered: the owner is idle
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

// loadEmulated loads, as a reload would, a configuration of one target with
// the given emulate block (on line 3); path is the file's.
func loadEmulated(t *testing.T, block string) (cfg *config.Config, path string, err error) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "kvload.yml")
	data := fmt.Sprintf("targets:\n  - name: emu\n    emulate: %s\nworkloads:\n  - {name: w, trace: %s, targets: [emu], block_size: 16}\n",
		block, fixture(t, "tiny.jsonl"))
	cfg, _, _, err = loadConfig(context.Background(), path, []byte(data), newTraceCache())
	return cfg, path, err
}

// TestEmulateConfig: every key of the emulator's configuration can be set
// in a target's emulate block and reaches the emulator as it would from
// the emulator's own YAML.
func TestEmulateConfig(t *testing.T) {
	// Every key, each with a value other than its zero.
	const block = "{model: m, max_model_len: 1, max_body_bytes: 2, engine: sglang, block_size: 3, capacity_blocks: 4, slots: 5, cache_ram_tokens: 13, hide_cache_config: true, " +
		"bos: true, disable_prefix_cache: true, omit_cached_tokens: true, metrics_double_count_hits: true, max_running: 6, overhead: 7ms, prefill_per_token: 8us, inter_token: 9ms, " +
		"faults: {error_500: 0.1, error_429: 0.2, disconnect: 0.3, malformed: 0.4, hang: 0.05, slow_first_token: 0.6, slow_first_token_delay: 10s, after_tokens: 11}, seed: 12, " +
		"kv_events: 'tcp://127.0.0.1:0', kv_events_topic: kv, kv_events_format: array}"
	var want emulate.Config
	if err := yaml.Unmarshal([]byte(block), &want); err != nil {
		t.Fatal(err)
	}
	if zero := zeroFields(reflect.ValueOf(want), "emulate.Config"); len(zero) > 0 {
		t.Fatalf("the block leaves %v unset: give it the new keys (and config.Emulate the new fields)", zero)
	}
	cfg, _, err := loadEmulated(t, block)
	if err != nil {
		t.Fatal(err)
	}
	got, err := emulateConfig(&cfg.Targets[0])
	if err != nil || got != want {
		t.Errorf("converted: %v\n%+v\nwant:\n%+v", err, got, want)
	}
}

// zeroFields lists the fields of struct v, nested ones included, that hold
// their zero value.
func zeroFields(v reflect.Value, path string) []string {
	var out []string
	for i := range v.NumField() {
		f, name := v.Field(i), path+"."+v.Type().Field(i).Name
		switch {
		case f.Kind() == reflect.Struct:
			out = append(out, zeroFields(f, name)...)
		case f.IsZero():
			out = append(out, name)
		}
	}
	return out
}

// TestEmulateModelAndEngine: an emulated target without a model is named
// after its emulate.model, else the engine's default; an engine the
// emulator does not know fails the load, named by path and line.
func TestEmulateModelAndEngine(t *testing.T) {
	tests := []struct {
		block, model, problem string // problem: %s is the file
	}{
		{"{}", emulate.DefaultModel, ""},
		{"{model: m}", "m", ""},
		{"{engine: llamacpp}", emulate.DefaultModel, ""},
		{"{engine: tgi}", "", `%s: targets[0].emulate.engine: unknown engine "tgi" (want vllm, sglang, trtllm or llamacpp) (line 3)`},
	}
	for _, tt := range tests {
		t.Run(tt.block, func(t *testing.T) {
			cfg, path, err := loadEmulated(t, tt.block)
			if tt.problem != "" {
				if want := fmt.Sprintf(tt.problem, path); err == nil || err.Error() != want {
					t.Errorf("load: %v\nwant %s", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tg := &cfg.Targets[0]
			ecfg, err := emulateConfig(tg)
			if err != nil || tg.Model != tt.model || ecfg.Model != tt.model {
				t.Errorf("model %q, the emulator's %q (%v), want %q", tg.Model, ecfg.Model, err, tt.model)
			}
		})
	}
}

// TestUnboundedEmulatorWarning: an emulated engine whose cache has no bound,
// fed new prompts every pass, grows for ever; the daemon says so when it
// starts the engine.
func TestUnboundedEmulatorWarning(t *testing.T) {
	t.Parallel()
	const warning = "prefix cache is unbounded"
	tests := []struct {
		name     string
		capacity int
		loop     string
		warn     bool
	}{
		{"unbounded, fresh", 0, "fresh", true},
		{"bounded, fresh", 4096, "fresh", false},
		{"unbounded, repeat", 0, "repeat", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "kvload.yml")
			w := daemontest.Workload("w", fixture(t, "tiny.jsonl"), "emu")
			daemontest.SetString(&w.Loop, tt.loop)
			daemontest.WriteConfig(t, path, config.Config{
				Targets:   []config.Target{{Name: "emu", Emulate: &config.Emulate{CapacityBlocks: tt.capacity, InterToken: time.Millisecond}}},
				Workloads: []config.Workload{w},
			})
			var logs testutil.Buffer
			// Start returns once the engines and units are started: the
			// warning, if any, is logged by then.
			if _, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) }); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(logs.String(), "replay started") {
				t.Fatalf("no replay started:\n%s", logs.String())
			}
			if got := strings.Contains(logs.String(), warning); got != tt.warn {
				t.Errorf("warning logged: %v, want %v:\n%s", got, tt.warn, logs.String())
			}
		})
	}
}
