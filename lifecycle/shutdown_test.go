package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// twoWorkloads is a configuration whose workloads (one for each name) each
// send to their own path of srvURL, so that the server tells which
// configuration runs.
func twoWorkloads(srvURL, trace string, names ...string) config.Config {
	var cfg config.Config
	for _, n := range names {
		cfg.Targets = append(cfg.Targets, daemontest.Target("t-"+n, srvURL+"/"+n))
		cfg.Workloads = append(cfg.Workloads, daemontest.Workload(n, trace, "t-"+n))
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
			srv := newFakeServer(t, nil)
			path := filepath.Join(t.TempDir(), "kvload.yml")
			trace := fixture(t, "future.jsonl")
			daemontest.WriteConfig(t, path, twoWorkloads(srv.URL, trace, "old"))
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
			testutil.Eventually(t, "the first configuration sending", func() (bool, string) {
				n := srv.Count("/old/v1/chat/completions")
				return n == 2, fmt.Sprint(n)
			})
			daemontest.WriteConfig(t, path, twoWorkloads(srv.URL, trace, "new"))

			reloaded := make(chan error, 1)
			if tt.during {
				go func() { reloaded <- d.Reload(context.Background()) }()
				<-entered
				d.stop()
			} else {
				d.stop()
				reloaded <- d.Reload(context.Background())
			}
			if err := testutil.Wait(t, "the reload's answer", reloaded); !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload: %v, want ErrShuttingDown", err)
			}
			testutil.Wait(t, "the daemon stopped", d.Done())
			if err := d.Reload(context.Background()); !errors.Is(err, ErrShuttingDown) {
				t.Errorf("reload after the stop: %v, want ErrShuttingDown", err)
			}
			if d.Ready() {
				t.Error("ready after the shutdown")
			}
			if n := srv.Count("/new/v1/chat/completions"); n != 0 {
				t.Errorf("the configuration asked for during the shutdown sent %d requests", n)
			}
			if v, _ := testutil.Gather(t, d.reg).Value("kvload_config_last_reload_successful"); v != 1 {
				t.Errorf("kvload_config_last_reload_successful %v: an abandoned reload is not a failed one", v)
			}
		})
	}
}
