package e2e

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// costTrace is rows conversations, 20 a second: five lanes take turns,
// each a conversation of 1 to 6 turns that adds 1 to 8 blocks of 64
// tokens to the prompt before it, then a new conversation. A turn comes
// 250 ms after the one before it in its lane, after that one's prefill
// ended on an engine that is not saturated, so that its prefix is cached.
func costTrace(rows int) []byte {
	const lanes = 5
	r := rand.New(rand.NewPCG(23, 5))
	type lane struct {
		ids  []int
		left int
	}
	var ls [lanes]lane
	next := 0
	var b strings.Builder
	for i := range rows {
		l := &ls[i%lanes]
		if l.left == 0 {
			l.ids, l.left = nil, 1+r.IntN(6)
		}
		for range 1 + r.IntN(8) {
			next++
			l.ids = append(l.ids, next)
		}
		l.left--
		ids := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(l.ids)), ", "), "[]")
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 4, "hash_ids": [%s]}`+"\n", i*50, 64*len(l.ids), ids)
	}
	return []byte(b.String())
}

// TestE2ECachedTokenCost: the cost of a cached prompt
// token against an uncached one, fitted by the exporter from nothing but
// each request's time and its theoretical tokens, against emulated
// engines that report no cached tokens (a vLLM without
// --enable-prompt-tokens-details) and the emulated llama.cpp, which
// reports its prefill time (timings.prompt_ms). Prefill costs 200 µs per
// computed token. A working cache reads near 0, one disabled
// (POST /emulator/cache) near 1. On an engine that runs one request at a
// time and gets more than it serves, TTFT is mostly its queue: with the
// engine's prefill time the fit still separates the two; with TTFT alone
// it may say it cannot tell, but never a confident wrong answer.
func TestE2ECachedTokenCost(t *testing.T) {
	t.Parallel()
	if testutil.RaceEnabled {
		t.Skip("a replay at speed against six engines: too slow under -race; run by `make test-e2e`")
	}
	e2eReplaySlot(t)
	const rows = 400
	cases := []struct {
		name       string
		engine     emulate.Config
		dialect    string
		off        bool // the cache disabled
		saturated  bool
		prefill    bool // the fit must use the engine's prefill time
		lo, hi     float64
		mayAbstain bool
	}{
		{name: "silent", engine: emulate.Config{OmitCachedTokens: true}, dialect: "vllm", lo: -0.1, hi: 0.2},
		{name: "silent-off", engine: emulate.Config{OmitCachedTokens: true}, dialect: "vllm", off: true, lo: 0.8, hi: 1.2},
		{name: "llama-saturated", engine: emulate.Config{Engine: emulate.PersonalityLlamaCpp, Slots: 8, MaxRunning: 1}, dialect: "llamacpp",
			saturated: true, prefill: true, lo: -0.1, hi: 0.2},
		{name: "llama-saturated-off", engine: emulate.Config{Engine: emulate.PersonalityLlamaCpp, Slots: 8, MaxRunning: 1}, dialect: "llamacpp",
			off: true, saturated: true, prefill: true, lo: 0.8, hi: 1.2},
		{name: "silent-saturated", engine: emulate.Config{OmitCachedTokens: true, MaxRunning: 1}, dialect: "vllm",
			saturated: true, lo: -0.1, hi: 0.3, mayAbstain: true},
		{name: "silent-saturated-off", engine: emulate.Config{OmitCachedTokens: true, MaxRunning: 1}, dialect: "vllm",
			off: true, saturated: true, lo: 0.7, hi: 1.3, mayAbstain: true},
	}
	cfg := config.Config{Workloads: []config.Workload{{Name: "chat", Trace: "head.jsonl", BlockSize: 64, Loop: "once"}}}
	for _, c := range cases {
		ec := c.engine
		ec.Overhead, ec.PrefillPerToken, ec.InterToken = 2*time.Millisecond, 200*time.Microsecond, time.Millisecond
		e := daemontest.StartEmulator(t, ec)
		if c.off {
			e2ePost(t, e.URL+"/emulator/cache", `{"enabled": false}`)
		}
		target := config.Target{Name: c.name, URL: e.URL, Model: emulate.DefaultModel, API: "completions"}
		daemontest.SetString(&target.Dialect, c.dialect)
		cfg.Targets = append(cfg.Targets, target)
		cfg.Workloads[0].Targets = append(cfg.Workloads[0].Targets, c.name)
	}
	d := e2eStart(t, ctConfigTrace(t, cfg, costTrace(rows)))
	var m testutil.Families
	testutil.EventuallyWithin(t, "every row sent or dropped", e2eDeadline, func() (bool, string) {
		m = testutil.Scrape(t, d.base)
		var status []string
		done := true
		for _, c := range cases {
			n := m.Sum("kvload_requests_total", "target", c.name) + m.Sum("kvload_requests_dropped_total", "target", c.name) -
				m.Sum("kvload_requests_in_flight", "target", c.name)
			done = done && n >= rows
			status = append(status, fmt.Sprintf("%s %.0f", c.name, n))
		}
		return done, strings.Join(status, ", ")
	})
	for _, c := range cases {
		state := ""
		for _, s := range []string{"decided", "too_few_requests", "too_little_spread", "no_uncached_cost", "too_uncertain"} {
			if m.Sum("kvload_cache_cost_fit_state", "target", c.name, "state", s) == 1 {
				state = s
			}
		}
		ratio, n := m.Value("kvload_cache_cached_token_cost_ratio", "target", c.name)
		ttft := costMeanTTFT(m, c.name)
		t.Logf("%s: the TTFT contrast of the cache classes (most over none, per trace token) reads %.2f", c.name, costContrast(m, c.name))
		t.Logf("%s: %s, ratio %.3f ± %.3f (%d series), %.0f requests fitted, prefill timed %.0f, %.3g s per uncached token, mean TTFT %.2f s, %.0f successes, %.0f dropped",
			c.name, state, ratio, m.Sum("kvload_cache_cached_token_cost_ratio_stderr", "target", c.name), n,
			m.Sum("kvload_cache_cost_fit_requests", "target", c.name), m.Sum("kvload_cache_cost_fit_prefill_timed", "target", c.name),
			m.Sum("kvload_cache_uncached_token_cost_seconds", "target", c.name), ttft,
			m.Sum("kvload_requests_total", "target", c.name, "outcome", "success"), m.Sum("kvload_requests_dropped_total", "target", c.name))
		if c.saturated && !(ttft > 1) {
			t.Errorf("%s: mean TTFT %.2f s: the engine is not saturated, its queue does not dominate", c.name, ttft)
		}
		if got := m.Sum("kvload_cache_cost_fit_prefill_timed", "target", c.name); (got == 1) != c.prefill {
			t.Errorf("%s: prefill timed %v, want %v", c.name, got, c.prefill)
		}
		switch {
		case state == "decided" && n == 1:
			if !(ratio >= c.lo && ratio <= c.hi) {
				t.Errorf("%s: ratio %.3f, want within [%g, %g]", c.name, ratio, c.lo, c.hi)
			}
		case c.mayAbstain && n == 0 && state != "" && state != "too_few_requests":
			// Undecided, and says why.
		default:
			t.Errorf("%s: state %q, %d ratio series", c.name, state, n)
		}
	}
}

// costMeanTTFT is the mean TTFT of target's successful requests.
func costMeanTTFT(m testutil.Families, target string) float64 {
	sum, n := costTTFTSum(m, "kvload_time_to_first_token_seconds", target)
	return sum / n
}

// costContrast is what the rule workload_target:kvload_cache_ttft_contrast
// reads over the whole run: the TTFT per trace token of class most over
// that of class none.
func costContrast(m testutil.Families, target string) float64 {
	perToken := func(class string) float64 {
		sum, _ := costTTFTSum(m, "kvload_cache_class_time_to_first_token_seconds", target, "cache_class", class)
		return sum / m.Sum("kvload_cache_class_trace_prompt_tokens_total", "target", target, "cache_class", class)
	}
	return perToken("most") / perToken("none")
}

// costTTFTSum adds up the sums and counts of the histogram name's series
// carrying target and the label pairs.
func costTTFTSum(m testutil.Families, name, target string, pairs ...string) (sum, n float64) {
	want := append([]string{"target", target}, pairs...)
	for _, s := range m[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			ok = ok && labels[want[i]] == want[i+1]
		}
		if ok {
			sum += s.GetHistogram().GetSampleSum()
			n += float64(s.GetHistogram().GetSampleCount())
		}
	}
	return sum, n
}
