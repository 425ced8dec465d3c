package daemontest

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	promconfig "github.com/prometheus/common/config"
	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
)

// TestConfigRoundTrips: a configuration written by WriteConfig loads as the
// same configuration as the file a person would write, for every kind of
// key the tests set: auto-able integers (fixed and auto), durations,
// the typed strings (dialect, api, loop, ...), an emulate block (whose
// keys have no omitempty), synthesis, shard, extra_body and an HTTP client
// configuration.
func TestConfigRoundTrips(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	WriteFile(t, trace, `{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}`+"\n")

	cfg := Config("http://127.0.0.1:1", trace)
	cfg.Targets[0].Cache = config.Cache{BlockSize: config.Fixed(32), Observed: "server_metrics"}
	cfg.Targets[0].RequestTimeout = config.Duration(90 * time.Second)
	cfg.Targets[0].ExtraBody = map[string]any{"top_k": 1}
	cfg.Targets[0].HTTPClientConfig = &promconfig.HTTPClientConfig{FollowRedirects: true, EnableHTTP2: true}
	ids := Target("ids", "http://127.0.0.1:2")
	ids.API, ids.PromptFormat, ids.Dialect = "completions", "token_ids", "sglang"
	cfg.Targets = append(cfg.Targets, ids, config.Target{Name: "emu", Emulate: &config.Emulate{
		CapacityBlocks: 4096, InterToken: time.Millisecond, Faults: emulate.Faults{Error500: 0.5, SlowFirstTokenDelay: 2 * time.Second},
	}})
	w := Workload("fresh", trace, "ids", "emu")
	w.Loop, w.MaxInFlight, w.OnSaturation = "fresh", 4, "queue"
	w.MaxQueueLag = config.Duration(1500 * time.Millisecond)
	w.Synthesis = config.Synthesis{SpeedupRatio: 20, MaxOSL: 4}
	w.Shard = config.Shard{Index: 1, Count: 3}
	w.Seed = 7
	cfg.Workloads = append(cfg.Workloads, w)

	byHand := `targets:
  - name: t
    url: http://127.0.0.1:1
    model: m
    dialect: vllm
    request_timeout: 1m30s
    extra_body: {top_k: 1}
    cache: {block_size: 32, capacity_blocks: auto, observed: server_metrics}
  - {name: ids, url: "http://127.0.0.1:2", model: m, api: completions, dialect: sglang, prompt_format: token_ids}
  - name: emu
    emulate: {capacity_blocks: 4096, inter_token: 1ms, faults: {error_500: 0.5, slow_first_token_delay: 2s}}
workloads:
  - {name: w, trace: ` + trace + `, targets: [t], block_size: 16, loop: once}
  - name: fresh
    trace: ` + trace + `
    targets: [ids, emu]
    block_size: 16
    seed: 7
    synthesis: {speedup_ratio: 20, max_osl: 4}
    loop: fresh
    max_in_flight: 4
    on_saturation: queue
    max_queue_lag: 1500ms
    shard: {index: 1, count: 3}
`
	written := filepath.Join(dir, "written.yml")
	WriteConfig(t, written, cfg)
	got, err := config.Load(written)
	if err != nil {
		text, _ := os.ReadFile(written)
		t.Fatalf("the written configuration does not load: %v\n%s", err, text)
	}
	want, err := config.Parse([]byte(byHand), dir)
	if err != nil {
		t.Fatalf("the configuration by hand: %v", err)
	}
	// Both as loaded (defaults applied), compared by their every exported
	// field.
	g, w2 := Marshal(t, *got), Marshal(t, *want)
	if !bytes.Equal(g, w2) {
		t.Errorf("loaded from the written file:\n%s\nfrom the file by hand:\n%s", g, w2)
	}
	if got.Targets[0].Cache.CapacityBlocks.Auto() != true || got.Targets[0].Cache.BlockSize != config.Fixed(32) {
		t.Errorf("cache: %+v, want block size 32 fixed and capacity auto", got.Targets[0].Cache)
	}
}

// TestConfigIsValid: Config, as it is, loads.
func TestConfigIsValid(t *testing.T) {
	dir := t.TempDir()
	trace := SteadyTrace(t, dir)
	path := filepath.Join(dir, "kvload.yml")
	WriteConfig(t, path, Config("http://127.0.0.1:1", trace))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if tg, wl := cfg.Targets[0], cfg.Workloads[0]; tg.Dialect != "vllm" || wl.Loop != "once" || wl.BlockSize != 16 || wl.Trace != trace {
		t.Errorf("loaded %+v and %+v", tg, wl)
	}
}

// TestStartEmulator: the engine answers on loopback until Stop, which the
// cleanup may call again.
func TestStartEmulator(t *testing.T) {
	e := StartEmulator(t, emulate.Config{})
	resp, err := http.Get(e.URL + "/emulator/stats")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /emulator/stats: %s", resp.Status)
	}
	e.Stop()
	if resp, err := http.Get(e.URL + "/emulator/stats"); err == nil {
		resp.Body.Close()
		t.Errorf("the engine still answers after Stop: %s", resp.Status)
	}
}

// TestMarshalLeavesSecretsOut: client_golang's Secret is written as
// <secret>, so a configuration with credentials must be written as text;
// this test notices if that changes.
func TestMarshalLeavesSecretsOut(t *testing.T) {
	cfg := Config("http://127.0.0.1:1", "t.jsonl")
	cfg.Targets[0].HTTPClientConfig = &promconfig.HTTPClientConfig{BasicAuth: &promconfig.BasicAuth{Username: "u", Password: "hunter2"}}
	if b := Marshal(t, cfg); bytes.Contains(b, []byte("hunter2")) {
		var v any
		_ = yaml.Unmarshal(b, &v)
		t.Errorf("the password is written: %v", v)
	}
}
