package cachetruth

import (
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

func TestPreambleTokens(t *testing.T) {
	tests := []struct {
		name    string
		samples []int
		want    int
	}{
		{"none", nil, 0},
		{"too few", []int{1, 1, 1, 1, 1, 1, 1}, 0},
		{"BOS on every unrelated prompt", []int{1, 1, 1, 1, 1, 1, 1, 1}, 1},
		{"chat header", []int{5, 5, 7, 5, 5, 5, 9, 5, 5}, 5},
		{"one cold answer does not hide it", []int{5, 5, 5, 5, 5, 5, 5, 5, 0}, 5},
		{"a cold engine does", []int{0, 0, 0, 5, 5, 5, 5, 5}, 0},
		{"chance hits do not raise it", []int{5, 5, 6, 7, 6, 9, 6, 8}, 6},
		{"a cold engine ages out", append(repeat(0, 8), repeat(5, preambleWindow)...), 5},
		{"too large to be a preamble", []int{500, 500, 500, 500, 500, 500, 500, 500}, 0},
		{"at the bound", []int{64, 64, 64, 64, 64, 64, 64, 64}, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p preamble
			for _, v := range tt.samples {
				p.observe(v)
			}
			if got := p.tokens(); got != tt.want {
				t.Errorf("tokens() = %d, want %d", got, tt.want)
			}
		})
	}
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestPreambleLeftOutOfEfficiency: on a trace that shares nothing, an
// engine that reports its BOS as cached would read an observed hit rate
// above a theoretical one of 0; once learned, the BOS is on neither side.
// A request that really shares a prefix keeps its hit less the preamble.
func TestPreambleLeftOutOfEfficiency(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := collector.New(reg)
	tr := New(c)
	c.SetTarget("llama", "m", "completions", "llamacpp")
	tr.SetTarget("llama", "llamacpp", "usage")
	t0 := time.Unix(1_700_000_000, 0)
	finish := func(cached, theoretical int) {
		r := &replay.Result{
			Response: openai.Response{Sent: t0, FirstToken: t0.Add(time.Millisecond), LastToken: t0.Add(time.Second), Outcome: openai.OutcomeSuccess, PromptTokens: 1001, PromptKnown: true, CachedTokens: cached, CachedKnown: true}, Workload: "w", Target: "llama",
			TraceInputLength: 1000, TheoreticalCachedTokens: theoretical, TheoreticalKnown: true}
		c.Start("w", "llama")
		tr.Sent("w", "llama", t0, t0)
		tr.Finished(r)
	}
	// The first unrelated prompt finds an empty slot; the next ones hit the
	// BOS only. From the 8th sample (the 7th BOS hit) on, the lower
	// quartile is 1: the first 6 BOS hits counted, no later one.
	finish(0, 0)
	for range preambleMinSamples {
		finish(1, 0)
	}
	if got := testutil.Gather(t, reg).Sum("kvload_cache_reported_cached_prompt_tokens_total"); got != 6 {
		t.Fatalf("cached while the preamble was learned: %v, want 6", got)
	}
	if got := testutil.Gather(t, reg).Sum("kvload_target_cache_preamble_tokens"); got != 1 {
		t.Fatalf("preamble: %v, want 1", got)
	}
	for range preambleWindow {
		finish(1, 0)
	}
	mid := testutil.Gather(t, reg).Sum("kvload_cache_reported_cached_prompt_tokens_total")
	// A shared prefix of 512 trace tokens: the server reports BOS + 512.
	finish(513, 512)
	if got := testutil.Gather(t, reg).Sum("kvload_cache_reported_cached_prompt_tokens_total") - mid; got != 512 {
		t.Errorf("shared request credited %v cached tokens, want 512", got)
	}
	if mid != 6 {
		t.Errorf("cached after the second loop: %v, want 6", mid)
	}
	// The BOS left out of the last two learning requests, the whole
	// second loop and the shared request.
	wantPrompt := float64((1+preambleMinSamples+preambleWindow+1)*1001 - (2 + preambleWindow + 1))
	if got := testutil.Gather(t, reg).Sum("kvload_cache_reported_prompt_tokens_total"); got != wantPrompt {
		t.Errorf("reported prompt tokens %v, want %v", got, wantPrompt)
	}
}
