package collector

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestCacheLayout: a watched target's counters exist at zero, count its
// changes and failed reads by reason, and go when it is unwatched or
// removed.
func TestCacheLayout(t *testing.T) {
	for _, remove := range []struct {
		name string
		do   func(c *Collector)
	}{
		{"unwatched", func(c *Collector) { c.CacheLayout().Unwatch("t") }},
		{"target removed", func(c *Collector) { c.ForgetTarget("t") }},
	} {
		t.Run(remove.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := New(reg)
			c.CacheLayout().Watch("t")
			m := testutil.Gather(t, reg)
			if v, n := m.Value("kvload_target_cache_layout_changes_total", "target", "t"); v != 0 || n != 1 {
				t.Errorf("changes %v (%d series), want one at 0", v, n)
			}
			if _, n := m.Value("kvload_target_cache_discovery_failures_total", "target", "t"); n != len(engine.LayoutFailures) {
				t.Errorf("%d failure series, want one per reason (%d)", n, len(engine.LayoutFailures))
			}
			c.CacheLayout().Changed("t")
			c.CacheLayout().DiscoveryFailed("t", engine.LayoutTimeout)
			c.CacheLayout().DiscoveryFailed("t", engine.LayoutTimeout)
			m = testutil.Gather(t, reg)
			if v, _ := m.Value("kvload_target_cache_layout_changes_total", "target", "t"); v != 1 {
				t.Errorf("changes %v, want 1", v)
			}
			if v, _ := m.Value("kvload_target_cache_discovery_failures_total", "target", "t", "reason", string(engine.LayoutTimeout)); v != 2 {
				t.Errorf("timeouts %v, want 2", v)
			}
			remove.do(c)
			if left := testutil.Gather(t, reg).SeriesWith("target", "t"); len(left) != 0 {
				t.Errorf("left: %v", left)
			}
		})
	}
}
