package lifecycle

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestEngineReadsForReconcile: cache.reconcile reads the engine counters
// of the targets it resolves on (auto: where the dialect has both
// counters; true), beside or without observed: server_metrics. A page
// that does not answer is counted under kvload_cache_reconcile_errors_total
// and logged once, as information with auto and as a warning with true,
// never under kvload_server_metrics_errors_total; the target's requests go
// on as before. A reload that turns it off stops the reads and deletes the
// series.
func TestEngineReadsForReconcile(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, func(f *testutil.FakeServer) { f.Metrics = "" }) // no /metrics page
	path := filepath.Join(t.TempDir(), "kvload.yml")
	emulated := func(name string) config.Target { return config.Target{Name: name, Emulate: &config.Emulate{}} }
	both := emulated("both")
	both.Cache.Observed = "server_metrics"
	off := emulated("off")
	off.Cache.Reconcile = config.ReconcileOff
	plain := daemontest.Target("plain", srv.URL+"/plain")
	plain.Dialect = "openai"
	explicit := daemontest.Target("explicit", srv.URL+"/explicit")
	explicit.Cache.Reconcile = config.ReconcileOn
	cfg := config.Config{Targets: []config.Target{emulated("emu"), both, off, plain, explicit, daemontest.Target("nopage", srv.URL+"/nopage")}}
	var names []string
	for _, tg := range cfg.Targets {
		names = append(names, tg.Name)
	}
	w := daemontest.Workload("w", fixture(t, "tiny.jsonl"), names...)
	daemontest.SetString(&w.Loop, "fresh")
	cfg.Workloads = []config.Workload{w}
	daemontest.WriteConfig(t, path, cfg)
	var logs testutil.Buffer
	d, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keys(maps(d.scrapers.running)), []string{"both", "emu", "explicit", "nopage"}; !slices.Equal(got, want) {
		t.Errorf("scrapers of %v, want %v", got, want)
	}
	// Each awaited fact is read off the series themselves: a state that
	// is not exported yet is no good read, and a request still in flight
	// is no success.
	testutil.Eventually(t, "two failed reads of each absent page, a good one of each emulator, a success of each target", func() (bool, string) {
		m := testutil.Gather(t, d.reg)
		nopage, _ := m.Value("kvload_cache_reconcile_errors_total", "target", "nopage", "reason", "scrape")
		expl, _ := m.Value("kvload_cache_reconcile_errors_total", "target", "explicit", "reason", "scrape")
		var unread, unanswered []string
		for _, name := range []string{"emu", "both"} {
			_, states := m.Value("kvload_cache_reconcile_state", "target", name)
			if none, _ := m.Value("kvload_cache_reconcile_state", "target", name, "state", string(collector.ReconcileNoEngineCounter)); states == 0 || none != 0 {
				unread = append(unread, name)
			}
		}
		for _, name := range names {
			if ok, _ := m.Value("kvload_requests_total", "target", name, "outcome", "success"); ok == 0 {
				unanswered = append(unanswered, name)
			}
		}
		return nopage >= 2 && expl >= 2 && len(unread) == 0 && len(unanswered) == 0,
			fmt.Sprintf("failed reads %v and %v; emulators unread: %v; targets without a success: %v", nopage, expl, unread, unanswered)
	})
	m := testutil.Gather(t, d.reg)
	for _, name := range names {
		_, n := m.Value("kvload_cache_reconcile_state", "target", name)
		if want := !slices.Contains([]string{"off", "plain"}, name); (n > 0) != want {
			t.Errorf("target %s: %d state series, want them: %v", name, n, want)
		}
	}
	for _, name := range []string{"nopage", "explicit"} {
		if _, n := m.Value("kvload_server_metrics_errors_total", "target", name); n != 0 {
			t.Errorf("target %s: its failed reads counted under kvload_server_metrics_errors_total", name)
		}
	}
	logged := logs.String()
	for _, want := range []struct{ target, level string }{{"nopage", "info"}, {"explicit", "warn"}} {
		re := regexp.MustCompile(`level=(\w+) .*msg="cache reconciliation: the engine's counters not read;.* target=` + want.target + ` `)
		lines := re.FindAllStringSubmatch(logged, -1)
		if len(lines) != 1 || lines[0][1] != want.level {
			t.Errorf("target %s: logged %v, want one line at level %s:\n%s", want.target, lines, want.level, logged)
		}
	}
	if strings.Contains(logged, "server metrics scrape failed") {
		t.Errorf("a failed read logged as server metrics':\n%s", logged)
	}

	// Off by a reload: the reads stop and the series go.
	for i := range cfg.Targets {
		cfg.Targets[i].Cache.Reconcile = config.ReconcileOff
	}
	daemontest.WriteConfig(t, path, cfg)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := keys(maps(d.scrapers.running)); !slices.Equal(got, []string{"both"}) {
		t.Errorf("after turning it off, scrapers of %v, want [both]", got)
	}
	m = testutil.Gather(t, d.reg)
	for _, name := range names {
		for _, series := range m.SeriesWith("target", name) {
			if strings.HasPrefix(series, "kvload_cache_reconcile_") {
				t.Errorf("after turning it off: %s", series)
			}
		}
	}
}
