package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// twoWorkloads is a configuration whose workloads each send to their own
// path of srvURL, so that the server tells which configuration runs.
func twoWorkloads(srvURL, trace string, names ...string) string {
	cfg := "targets:\n"
	for _, n := range names {
		cfg += fmt.Sprintf("  - {name: t-%s, url: %s/%s, model: m, dialect: vllm}\n", n, srvURL, n)
	}
	cfg += "workloads:\n"
	for _, n := range names {
		cfg += fmt.Sprintf("  - {name: %s, trace: %s, targets: [t-%s], block_size: 16, loop: once}\n", n, trace, n)
	}
	return cfg
}

// TestShutdownIsAState: once the shutdown began, a reload, asked for
// before or after it, answers ErrShuttingDown and starts nothing; a
// reload being applied when it begins is abandoned before any unit starts.
func TestShutdownIsAState(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// during: cancel while the reload is between parsing and applying.
		during bool
	}{
		{"reload after the shutdown began", false},
		{"shutdown during a slow reload", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t)
			path := filepath.Join(t.TempDir(), "kvload.yml")
			trace := fixture(t, "future.jsonl")
			writeConfig(t, path, twoWorkloads(srv.URL, trace, "old"))
			entered := make(chan struct{}, 1)
			var armed bool
			d, err := startDaemon(t, path, func(o *Options) {
				o.beforeApply = func(ctx context.Context) {
					if !armed { // the first configuration goes through
						armed = true
						return
					}
					entered <- struct{}{}
					<-ctx.Done() // slow until the shutdown
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the first configuration sending", func() (bool, string) {
				n := srv.count("/old/v1/chat/completions")
				return n == 2, fmt.Sprint(n)
			})
			writeConfig(t, path, twoWorkloads(srv.URL, trace, "new"))

			reloaded := make(chan error, 1)
			if tt.during {
				go func() { reloaded <- d.Reload(context.Background()) }()
				<-entered
				d.stop()
			} else {
				d.stop()
				reloaded <- d.Reload(context.Background())
			}
			select {
			case err := <-reloaded:
				if !errors.Is(err, ErrShuttingDown) {
					t.Errorf("reload: %v, want ErrShuttingDown", err)
				}
			case <-time.After(pollDeadline):
				t.Fatal("the reload never answered")
			}
			select {
			case <-d.Done():
			case <-time.After(pollDeadline):
				t.Fatal("the daemon never stopped")
			}
			if err := d.Reload(context.Background()); !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload after the stop: %v, want ErrShuttingDown", err)
			}
			if d.Ready() {
				t.Error("ready after the shutdown")
			}
			if n := srv.count("/new/v1/chat/completions"); n != 0 {
				t.Errorf("the configuration asked for during the shutdown sent %d requests", n)
			}
			if v, _ := gatherFamilies(t, d.reg).value("kvload_config_last_reload_successful"); v != 1 {
				t.Errorf("kvload_config_last_reload_successful %v: an abandoned reload is not a failed one", v)
			}
		})
	}
}
