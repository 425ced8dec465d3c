// Package daemontest builds what a daemon under test reads: configuration
// files marshalled from config.Config (tweaked by the test as Go values,
// not text), traces, and emulated engines to aim it at.
//
// It is apart from package testutil because it imports config and emulate:
// testutil, importing neither, stays usable by the internal tests of the
// packages those two build on (replay, collector, synth).
package daemontest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/engine"
)

// Target is a vLLM target named name at url, serving model "m".
func Target(name, url string) config.Target {
	return config.Target{Name: name, URL: url, Model: "m", Dialect: "vllm"}
}

// Workload replays trace once against targets, in 16-token blocks (the
// block size of the project's small fixtures).
func Workload(name, trace string, targets ...string) config.Workload {
	return config.Workload{Name: name, Trace: trace, Targets: targets, BlockSize: 16, Loop: "once"}
}

// ManyTargets is a configuration of n vLLM targets at url, t000 on, and
// one workload "w" replaying trace to all of them. With scraped set every
// one is observed through its server metrics, read under url's /hang/.
func ManyTargets(url, trace string, n int, scraped bool) config.Config {
	w := Workload("w", trace)
	var cfg config.Config
	for i := range n {
		tg := Target(fmt.Sprintf("t%03d", i), url)
		if scraped {
			tg.Cache.Observed = engine.ObservedServerMetrics
			tg.Cache.MetricsURL = url + "/hang/metrics"
		}
		cfg.Targets = append(cfg.Targets, tg)
		w.Targets = append(w.Targets, tg.Name)
	}
	cfg.Workloads = []config.Workload{w}
	return cfg
}

// Config is the common case: workload "w" replays trace once against
// target "t", a vLLM at url.
func Config(url, trace string) config.Config {
	return config.Config{
		Targets:   []config.Target{Target("t", url)},
		Workloads: []config.Workload{Workload("w", trace, "t")},
	}
}

// SetString stores s in a field of a named string type (a dialect, an
// api, a loop mode), for a test that holds the value as a plain string,
// without naming the package that declares the type.
func SetString[T ~string](field *T, s string) { *field = T(s) }

// Marshal is cfg as a configuration file.
func Marshal(t testing.TB, cfg config.Config) []byte {
	t.Helper()
	b, err := yaml.Marshal(&cfg)
	if err != nil {
		t.Fatalf("marshalling the configuration: %v", err)
	}
	return b
}

// WriteConfig writes cfg to path as a configuration file.
func WriteConfig(t testing.TB, path string, cfg config.Config) {
	t.Helper()
	WriteFile(t, path, Marshal(t, cfg))
}

// WriteFile writes data (text or bytes) to path: a trace, or a
// configuration whose point is the text itself (malformed input, comments,
// the bytes a reload sees).
func WriteFile[D ~string | ~[]byte](t testing.TB, path string, data D) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// SteadyTrace writes a trace of rows every 20 ms into dir: replayed with
// loop: repeat, a request leaves every 20 ms for as long as the workload
// runs.
func SteadyTrace(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "steady.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		fmt.Fprintf(f, `{"timestamp": %d, "input_length": 20, "output_length": 1, "hash_ids": [%d, %d]}`+"\n", i*20, 2*i+1, 2*i+2)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// Emulator is an emulated engine serving on loopback, apart from any
// daemon.
type Emulator struct {
	*emulate.Engine
	URL    string // http://127.0.0.1:PORT
	cancel context.CancelFunc
	wait   func() error
}

// StartEmulator serves an engine of cfg on a free loopback port until the
// test's cleanup (or Stop).
func StartEmulator(t testing.TB, cfg emulate.Config) *Emulator {
	t.Helper()
	return StartEmulatorAt(t, cfg, "127.0.0.1:0")
}

// StartEmulatorAt is StartEmulator on addr: an engine restarted on the
// address of one stopped.
func StartEmulatorAt(t testing.TB, cfg emulate.Config, addr string) *Emulator {
	t.Helper()
	eng, err := emulate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	url, wait, err := eng.Start(ctx, addr)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e := &Emulator{Engine: eng, URL: url, cancel: cancel, wait: wait}
	t.Cleanup(e.Stop)
	return e
}

// Stop ends the engine's server and waits until it has; once stopped, it
// does nothing.
func (e *Emulator) Stop() {
	e.cancel()
	_ = e.wait() // the server's end, not a failure of the test
}
