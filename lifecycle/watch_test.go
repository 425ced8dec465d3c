package lifecycle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// watching is a daemon reloading on file changes, with its log.
func watching(t *testing.T, path string) (*started, *testutil.Buffer) {
	t.Helper()
	var logs testutil.Buffer
	d, err := startDaemon(t, path, func(o *Options) {
		o.Watch = true
		o.Logger = log.NewLogfmtLogger(&logs)
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, &logs
}

// appliedModel is the model of the running target t, and how many
// configurations were applied so far according to the log.
func appliedModel(d *started, logs *testutil.Buffer) (string, int) {
	model := ""
	for _, tg := range d.Status().Targets {
		if tg.Name == "t" {
			model = tg.Model
		}
	}
	return model, strings.Count(logs.String(), `msg="configuration applied"`)
}

// watchConfig is a valid configuration whose target model tells which
// version of the file was applied.
func watchConfig(srvURL, trace, model string) config.Config {
	cfg := daemontest.Config(srvURL, trace)
	cfg.Targets[0].Model = model
	return cfg
}

// TestWatchCoalescesWrites: ten writes of the file within a fraction of the
// debounce, each leaving it half-written (invalid) for a moment, give
// exactly one reload, of the last version, and no rejection.
func TestWatchCoalescesWrites(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	daemontest.WriteConfig(t, path, watchConfig(srv.URL, trace, "m-initial"))
	d, logs := watching(t, path)
	if model, applied := appliedModel(d, logs); model != "m-initial" || applied != 1 {
		t.Fatalf("at start: model %q, %d applied", model, applied)
	}

	// Paces the writes like an editor or a config tool would, 20 ms
	// apart, well under the 500 ms debounce; nothing waits on it.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := range 10 {
		if i > 0 {
			<-tick.C
		}
		content := string(daemontest.Marshal(t, watchConfig(srv.URL, trace, fmt.Sprintf("m-%d", i))))
		half := strings.Index(content, "workloads:") // targets only: invalid
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err1 := f.WriteString(content[:half])
		err2 := f.Sync()
		_, err3 := f.WriteString(content[half:])
		if err := errors.Join(err1, err2, err3, f.Close()); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "the last write applied", func() (bool, string) {
		model, applied := appliedModel(d, logs)
		return model == "m-9" && applied >= 2, fmt.Sprintf("model %q, %d applied", model, applied)
	})
	// A reload asked for now is served after any the writes caused: once
	// it answered, every one of those has been applied or skipped.
	if err := d.request(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	if _, applied := appliedModel(d, logs); applied != 2 {
		t.Errorf("%d configurations applied, want 2 (the initial one and one reload):\n%s", applied, logs)
	}
	if strings.Contains(logs.String(), "configuration rejected") {
		t.Errorf("a half-written file was loaded:\n%s", logs)
	}
	if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 1 {
		t.Errorf("kvload_config_last_reload_successful %v, want 1", v)
	}
}

// TestWatchSymlinkSwap: a ConfigMap volume's update, where the kubelet
// re-points ..data at a new directory in one rename, is applied, trace and
// all.
func TestWatchSymlinkSwap(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	trace, err := os.ReadFile(fixture(t, "future.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	version := func(name, model string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		daemontest.WriteConfig(t, filepath.Join(dir, name, "kvload.yml"), watchConfig(srv.URL, "trace.jsonl", model))
		daemontest.WriteFile(t, filepath.Join(dir, name, "trace.jsonl"), trace)
	}
	symlink := func(target, name string) {
		t.Helper()
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "m-v1")
	symlink("..v1", "..data")
	symlink("..data/kvload.yml", "kvload.yml")
	symlink("..data/trace.jsonl", "trace.jsonl")

	d, logs := watching(t, filepath.Join(dir, "kvload.yml"))
	if model, _ := appliedModel(d, logs); model != "m-v1" {
		t.Fatalf("at start: model %q", model)
	}
	version("..v2", "m-v2")
	symlink("..v2", "..data_tmp")
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the swapped configuration applied", func() (bool, string) {
		model, applied := appliedModel(d, logs)
		return model == "m-v2", fmt.Sprintf("model %q, %d applied", model, applied)
	})
	if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 1 {
		t.Errorf("kvload_config_last_reload_successful %v, want 1", v)
	}
}
