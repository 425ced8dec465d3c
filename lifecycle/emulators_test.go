package lifecycle

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"
	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

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
		"bos: true, disable_prefix_cache: true, omit_cached_tokens: true, metrics_double_count_hits: true, metrics_hits_overcount: 0.5, hold_abandoned_slots: true, max_running: 6, overhead: 7ms, prefill_per_token: 8us, inter_token: 9ms, " +
		"faults: {error_500: 0.1, error_429: 0.2, disconnect: 0.3, malformed: 0.4, hang: 0.05, slow_first_token: 0.6, slow_first_token_delay: 10s, after_tokens: 11}, seed: 12, " +
		"kv_events: 'tcp://127.0.0.1:0', kv_events_topic: kv, kv_events_format: array, kv_events_replay_endpoint: 'tcp://127.0.0.1:0', kv_events_drop: 0.1}"
	var want emulate.Config
	if err := yaml.Unmarshal([]byte(block), &want); err != nil {
		t.Fatal(err)
	}
	if zero := zeroFields(reflect.ValueOf(want), "emulate.Config"); len(zero) > 0 {
		t.Fatalf("the block leaves %v unset: give it the new keys", zero)
	}
	cfg, _, err := loadEmulated(t, block)
	if err != nil {
		t.Fatal(err)
	}
	if got := emulateConfig(&cfg.Targets[0]); got != want {
		t.Errorf("the emulator's configuration:\n%+v\nwant:\n%+v", got, want)
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
			if ecfg := emulateConfig(tg); tg.Model != tt.model || ecfg.Model != tt.model {
				t.Errorf("model %q, the emulator's %q, want %q", tg.Model, ecfg.Model, tt.model)
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

// TestUnbuildableEngineKeepsRunning: a reload to an emulate block the
// emulator refuses (which the configuration's own checks let through) is
// refused before the swap, naming its YAML path, by --config.check too;
// the running engine and its unit go on, the same ones, and keep serving.
func TestUnbuildableEngineKeepsRunning(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "kvload.yml")
	w := daemontest.Workload("w", daemontest.SteadyTrace(t, dir), "emu")
	daemontest.SetString(&w.Loop, "repeat")
	cfg := config.Config{
		Targets:   []config.Target{{Name: "emu", Emulate: &config.Emulate{CapacityBlocks: 4096, InterToken: time.Millisecond}}},
		Workloads: []config.Workload{w},
	}
	daemontest.WriteConfig(t, path, cfg)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	engine, unit := d.emulators.running["emu"], d.units.byKey[unitKey{"w", "emu"}]

	cfg.Targets[0].Emulate.Engine = emulate.PersonalityLlamaCpp
	cfg.Targets[0].Emulate.BlockSize = 16 // llama.cpp's blocks are single tokens
	daemontest.WriteConfig(t, path, cfg)
	const want = "targets[0].emulate: emulate: invalid config: block_size must be 1"
	if _, err := Check(path); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("--config.check: %v, want an error naming %q", err, want)
	}
	if err := d.Reload(t.Context()); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("reload: %v, want an error naming %q", err, want)
	}
	if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 0 {
		t.Errorf("kvload_config_last_reload_successful %v, want 0", v)
	}
	if d.emulators.running["emu"] != engine || d.units.byKey[unitKey{"w", "emu"}] != unit {
		t.Fatal("the refused reload replaced the running engine or unit")
	}
	sent := func() float64 { return testutil.Gather(t, d.reg).Sum("kvload_requests_total", "workload", "w") }
	before := sent()
	testutil.Eventually(t, "the old unit still answered by its engine", func() (bool, string) {
		n := sent()
		return n > before, fmt.Sprintf("%v requests, %v at the reload", n, before)
	})
}
