package emulate

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsDoubleCountHits: the hit counter of /metrics reads twice the
// hits, every personality that exports one; the prompt counters, usage
// and Stats stay true.
func TestMetricsDoubleCountHits(t *testing.T) {
	for _, p := range []Personality{PersonalityVLLM, PersonalitySGLang, PersonalityLlamaCpp} {
		for _, double := range []bool{false, true} {
			cfg := Config{Engine: p, MetricsDoubleCountHits: double}
			if p != PersonalityLlamaCpp {
				cfg.BlockSize = 4
			}
			e, srv := newTestServer(t, cfg)
			var cached int
			for _, ids := range [][]int{seq(1, 17), seq(1, 17), seq(1, 30)} {
				cached += complete(t, srv.URL, ids, nil).cached(t)
			}
			st := e.Stats()
			if cached == 0 || int64(cached) != st.CachedTokens || st.CacheHitTokens != st.CachedTokens {
				t.Fatalf("%v: usage cached %d, stats %+v", p, cached, st)
			}
			want := float64(st.CacheHitTokens)
			if double {
				want *= 2
			}
			if got := testutil.ToFloat64(e.m.hits); got != want {
				t.Errorf("%v, double %v: hit counter %v, want %v", p, double, got, want)
			}
			if got := testutil.ToFloat64(e.m.queries); got != float64(st.CacheQueryTokens) {
				t.Errorf("%v, double %v: query counter %v, want %v", p, double, got, st.CacheQueryTokens)
			}
			if got := testutil.ToFloat64(e.m.computedTokens); got != float64(st.CacheQueryTokens-st.CacheHitTokens) {
				t.Errorf("%v, double %v: computed-token counter %v, want %v", p, double, got, st.CacheQueryTokens-st.CacheHitTokens)
			}
		}
	}
}
