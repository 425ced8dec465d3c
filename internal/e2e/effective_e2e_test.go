package e2e

import (
	"testing"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestE2ECacheTruthEffectiveCapacity: against the emulated engine with an
// LRU cache of 160,000 blocks of 16 tokens (2.56M tokens), the exporter's
// effective capacity is within 15 % of it: with default settings, which
// read the capacity from the engine, and as an OpenAI-compatible target,
// whose capacity the exporter cannot read (its model is then unbounded,
// and the effective capacity is the only measure of the cache). On the
// first 500 rows of the conversation trace the capacity binds there: a
// cache of 2.2M tokens serves 7.1 % of the prompt tokens, one of 2.56M
// 8.1 %, one of 3M 11.3 %; below 1M the curve is flat (3.6 % at 20k
// tokens as at 400k: the shared first block), and the hits could not
// tell one capacity from another.
func TestE2ECacheTruthEffectiveCapacity(t *testing.T) {
	const blocks = 160_000
	const capacityTokens = blocks * 16
	for _, dialect := range []string{"vllm", "openai"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			e2eReplayAlone(t)
			url, _ := ctEngine(t, emulate.Config{CapacityBlocks: blocks})
			cfg := ctConfigOf(url, "fresh")
			cfg.Targets[0].Dialect = "openai"
			if dialect == "vllm" {
				cfg.Targets[0].Dialect = "vllm"
			}
			d := e2eStart(t, ctConfigTrace(t, cfg, e2eHead(t, e2eExamples+"/traces/conversation_head1000.jsonl", ctRows)))
			start := ctNextPass(t, ctRead(t, d.base), d.base)
			end := ctNextPass(t, start, d.base)
			m := testutil.Scrape(t, d.base)
			got := m.Sum("kvload_cache_effective_capacity_tokens")
			window := m.Sum("kvload_cache_effective_capacity_window_seconds")
			t.Logf("%s: effective capacity %.0f tokens (%.3f of the engine's %d) over %.0f s; %v", dialect, got, got/capacityTokens, capacityTokens, window, end.minus(start))
			if v, n := m.Value("kvload_cache_effective_capacity_state", "state", "measured"); v != 1 || n != 1 {
				t.Fatalf("state measured is %v (%d series), want 1", v, n)
			}
			if got < 0.85*capacityTokens || got > 1.15*capacityTokens {
				t.Errorf("effective capacity %.0f tokens, want within 15 %% of %d", got, capacityTokens)
			}
		})
	}
}
