package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestE2EServerMetricsCleanCounter: with observed: server_metrics against
// a vLLM whose vllm:prefix_cache_hits_total counts half its hits once
// more (vLLM issue 25780: a preempted request's lookups are counted
// again), the exporter reads vllm:prompt_tokens_cached_total, which counts
// each request once, and the efficiency is the truth. Read from the hit
// counter, it was 1.5 times the truth.
//
// One pass (loop: once) of a short trace, so that the run ends: the
// engine counts a prompt at admission and the exporter when its response
// ends, so the credit runs behind while requests are in flight and makes
// it up once they have finished.
func TestE2EServerMetricsCleanCounter(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	url, eng := ctEngine(t, emulate.Config{InterToken: time.Millisecond, MetricsHitsOvercount: 0.5})
	cfg := ctConfigOf(url, "once")
	cfg.Workloads[0].Synthesis.SpeedupRatio = 1
	cfg.Targets[0].Cache.Observed = "server_metrics"
	d := e2eStart(t, ctConfigTrace(t, cfg, sharedPrefixTrace(cleanCounterRows)))
	var c ctCounters
	testutil.Eventually(t, "the pass done", func() (bool, string) {
		c = ctRead(t, d.base)
		return c.success == cleanCounterRows, c.String()
	})
	// Then the last reads of the engine's counters (every 5 s).
	engine := float64(eng.Stats().CacheHitTokens)
	testutil.Eventually(t, "the engine's hits credited", func() (bool, string) {
		c = ctRead(t, d.base)
		return c.cached >= 0.99*engine, fmt.Sprintf("credited %.0f of the engine's %.0f", c.cached, engine)
	})
	t.Logf("the engine served %.0f cached tokens, its hit counter says %.0f; the exporter was credited %.0f (%.4f)",
		engine, 1.5*engine, c.cached, c.cached/engine)
	e := c.efficiency()
	t.Logf("%v", c)
	if !(e >= 0.85 && e <= 1.05) {
		t.Errorf("efficiency %.4f, want within [0.85, 1.05]", e)
	}
}

// cleanCounterRows is the rows of TestE2EServerMetricsCleanCounter's
// trace: a few seconds of requests.
const cleanCounterRows = 60

// sharedPrefixTrace is n Mooncake rows 100 ms apart of two 512-token
// blocks each, the first shared by every row and the second by none:
// short prompts, half of each cached after the first.
func sharedPrefixTrace(n int) []byte {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1024, "output_length": 8, "hash_ids": [0, %d]}`+"\n", 100*i, i+1)
	}
	return []byte(b.String())
}
