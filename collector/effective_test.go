package collector

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/servedcache/servedcachetest"
)

// TestEffectiveCapacitySeries: the landing page's figure is what the
// series say: one state series at 1, and the capacity with its lower-bound
// flag only where measured (servedcache works the figures out).
func TestEffectiveCapacitySeries(t *testing.T) {
	step := replay.CapacityStep{Capacity: 4096, Tokens: 500}
	tests := []struct {
		name       string
		results    []*replay.Result
		state      EffectiveCapacityState
		lowerBound bool
	}{
		{"nothing yet", nil, EffectiveNotReported, false},
		{"measured", []*replay.Result{servedcachetest.Counted(1000, 1000, 300, step)}, EffectiveMeasured, false},
		{"measured, at least", []*replay.Result{servedcachetest.Counted(1000, 1000, 500, step)}, EffectiveMeasured, true},
		{"above the model", []*replay.Result{servedcachetest.Counted(1000, 1000, 600, step)}, EffectiveAboveModel, false},
		{"nothing to share", []*replay.Result{servedcachetest.Counted(1000, 1000, 0)}, EffectiveNothingToShare, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := New(reg)
			start := time.Unix(3000, 0)
			now := start
			c.now = func() time.Time { return now }
			c.Start("w", "t")
			for _, r := range tt.results {
				c.Finished(r)
			}
			now = start.Add(time.Minute)
			st := c.Status()[0]
			if st.EffectiveCapacityState != tt.state || st.EffectiveCapacityLowerBound != tt.lowerBound {
				t.Fatalf("landing page: %s, lower bound %v; want %s, %v", st.EffectiveCapacityState, st.EffectiveCapacityLowerBound, tt.state, tt.lowerBound)
			}
			m := testutil.Gather(t, reg)
			for _, s := range EffectiveCapacityStates {
				want := 0.0
				if s == tt.state {
					want = 1
				}
				if got, n := m.Value("kvload_cache_effective_capacity_state", "workload", "w", "target", "t", "state", string(s)); n != 1 || got != want {
					t.Errorf("state series %s: %v (%d series), want %v", s, got, n, want)
				}
			}
			bound, nb := m.Value("kvload_cache_effective_capacity_lower_bound", "workload", "w", "target", "t")
			switch {
			case tt.state != EffectiveMeasured && nb != 0:
				t.Errorf("a lower-bound series in state %s", tt.state)
			case tt.state == EffectiveMeasured && (nb != 1 || (bound == 1) != tt.lowerBound):
				t.Errorf("lower-bound series %v (%d series), want %v", bound, nb, tt.lowerBound)
			}
			got, n := m.Value("kvload_cache_effective_capacity_tokens", "workload", "w", "target", "t")
			if tt.state != EffectiveMeasured && n != 0 {
				t.Errorf("a capacity of %v tokens exported in state %s", got, tt.state)
			}
			if tt.state == EffectiveMeasured && (n != 1 || got != st.EffectiveCapacityTokens) {
				t.Errorf("exported %v (%d series), the landing page says %v", got, n, st.EffectiveCapacityTokens)
			}
			if got := m.Sum("kvload_cache_effective_capacity_window_seconds"); got != st.EffectiveCapacityWindow.Seconds() || got != 60 {
				t.Errorf("window %v s exported, the landing page says %v, want 60 s", got, st.EffectiveCapacityWindow)
			}
		})
	}
}

// TestEffectiveCapacityForget: a pair removed by a reload takes its series
// with it.
func TestEffectiveCapacityForget(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	c.Start("w", "t")
	c.Finished(servedcachetest.Counted(1000, 1000, 300, replay.CapacityStep{Capacity: 4096, Tokens: 500}))
	if n := len(testutil.Gather(t, reg).SeriesWith("target", "t")); n == 0 {
		t.Fatal("no series of the pair")
	}
	c.Forget("w", "t")
	for _, s := range testutil.Gather(t, reg).SeriesWith("target", "t") {
		t.Errorf("left after Forget: %s", s)
	}
}
