package emulate

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestVLLMPromptCounters: vLLM's per-request counts of cached prompt
// tokens follow the cache's hits, and its hit counter alone overcounts
// with MetricsHitsOvercount; MetricsDoubleCountHits doubles every hit
// counter.
func TestVLLMPromptCounters(t *testing.T) {
	tests := []struct {
		name      string
		double    bool
		overcount float64
		// The hit counter's and the cached counters' reading over the
		// true hits.
		hitsOver, cachedOver float64
	}{
		{"true", false, 0, 1, 1},
		{"hits overcount by half", false, 0.5, 1.5, 1},
		{"hits counted twice", true, 0, 2, 2},
		{"both", true, 0.5, 2.5, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, srv := newTestServer(t, Config{BlockSize: 4, MetricsDoubleCountHits: tt.double, MetricsHitsOvercount: tt.overcount})
			for _, ids := range [][]int{seq(1, 17), seq(1, 17), seq(1, 30)} {
				complete(t, srv.URL, ids, nil)
			}
			st := e.Stats()
			if st.CacheHitTokens == 0 || st.CachedTokens != st.CacheHitTokens {
				t.Fatalf("stats %+v: no hit, or usage other than the hits", st)
			}
			hits, queried := float64(st.CacheHitTokens), float64(st.CacheQueryTokens)
			page := `# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="` + e.cfg.Model + `",source="external_kv_transfer"} 0
vllm:prompt_tokens_by_source_total{engine="0",model_name="` + e.cfg.Model + `",source="local_cache_hit"} ` + num(tt.cachedOver*hits) + `
vllm:prompt_tokens_by_source_total{engine="0",model_name="` + e.cfg.Model + `",source="local_compute"} ` + num(queried-hits) + `
# HELP vllm:prompt_tokens_cached_total Number of cached prompt tokens (local + external).
# TYPE vllm:prompt_tokens_cached_total counter
vllm:prompt_tokens_cached_total{engine="0",model_name="` + e.cfg.Model + `"} ` + num(tt.cachedOver*hits) + `
`
			if err := testutil.GatherAndCompare(e.Gatherer(), strings.NewReader(page), "vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_by_source_total"); err != nil {
				t.Error(err)
			}
			if got := testutil.ToFloat64(e.m.hits); got != tt.hitsOver*hits {
				t.Errorf("vllm:prefix_cache_hits_total %v, want %v (%v × %v hits)", got, tt.hitsOver*hits, tt.hitsOver, hits)
			}
		})
	}
}

// TestVLLMPromptCountersOnlyVLLM: the other personalities export no vllm:
// counter.
func TestVLLMPromptCountersOnlyVLLM(t *testing.T) {
	for _, p := range []Personality{PersonalitySGLang, PersonalityTRTLLM, PersonalityLlamaCpp} {
		e, _ := newTestServer(t, Config{Engine: p})
		mfs, err := e.Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "vllm:") {
				t.Errorf("%v exports %s", p, mf.GetName())
			}
		}
	}
}

// TestMetricsHitsOvercountBounds: a negative or absurd overcount is
// refused.
func TestMetricsHitsOvercountBounds(t *testing.T) {
	for _, v := range []float64{-0.1, maxHitsOvercount + 1} {
		if _, err := (Config{MetricsHitsOvercount: v}).withDefaults(); err == nil || !strings.Contains(err.Error(), "metrics_hits_overcount") {
			t.Errorf("overcount %v: %v, want refused naming the key", v, err)
		}
	}
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
