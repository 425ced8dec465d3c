package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestE2ESLOGoodRatios: two workloads on one target, one with an objective
// every request misses (a first token within 1 ms of an engine that takes
// 20 ms) and one with an objective every request meets, read good ratios
// of at most 0.05 and at least 0.95.
func TestE2ESLOGoodRatios(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	url, _ := ctEngine(t, emulate.Config{Overhead: 20 * time.Millisecond})
	cfg := ctConfigOf(url, "fresh")
	meets, misses := cfg.Workloads[0], cfg.Workloads[0]
	meets.Name, meets.SLO = "meets", &config.SLO{TTFT: config.Duration(time.Minute), Request: config.Duration(time.Hour), Objective: 0.99}
	misses.Name, misses.SLO = "misses", &config.SLO{TTFT: config.Duration(time.Millisecond), Objective: 0.99}
	cfg.Workloads = []config.Workload{meets, misses}
	d := e2eStart(t, ctConfigTrace(t, cfg, e2eHead(t, e2eExamples+"/traces/conversation_head1000.jsonl", ctRows)))

	ratio := func(m testutil.Families, w string) (good, judged float64) {
		return m.Sum("kvload_slo_good_requests_total", "workload", w), m.Sum("kvload_slo_requests_total", "workload", w)
	}
	testutil.Eventually(t, "50 requests judged in each workload", func() (bool, string) {
		m := testutil.Scrape(t, d.base)
		_, a := ratio(m, "meets")
		_, b := ratio(m, "misses")
		return a >= 50 && b >= 50, fmt.Sprintf("judged: meets %v, misses %v", a, b)
	})
	m := testutil.Scrape(t, d.base)
	for _, tt := range []struct {
		workload string
		min, max float64
	}{{"meets", 0.95, 1}, {"misses", 0, 0.05}} {
		good, judged := ratio(m, tt.workload)
		t.Logf("%s: %v good of %v judged", tt.workload, good, judged)
		if r := good / judged; r < tt.min || r > tt.max {
			t.Errorf("%s: good ratio %.3f (%v of %v), want %v to %v", tt.workload, r, good, judged, tt.min, tt.max)
		}
		if obj, n := m.Value("kvload_slo_objective_ratio", "workload", tt.workload); obj != 0.99 || n != 1 {
			t.Errorf("%s: kvload_slo_objective_ratio %v over %d series, want 0.99 over 1", tt.workload, obj, n)
		}
	}
}

// TestE2EAbandon: abandon: {share: 0.5, after_tokens: 2} closes 35-65 %
// of the streams, with no errors, and the cache efficiency stays that of a
// healthy engine: the engine keeps an abandoned request's prompt, and so
// does the model.
func TestE2EAbandon(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	url, _ := ctEngine(t, emulate.Config{})
	cfg := ctConfigOf(url, "fresh")
	cfg.Workloads[0].Seed = 7
	cfg.Workloads[0].Abandon = &config.Abandon{Share: 0.5, AfterTokens: 2}
	d := e2eStart(t, ctConfigTrace(t, cfg, e2eHead(t, e2eExamples+"/traces/conversation_head1000.jsonl", ctRows)))

	outcomes := func() (abandoned, errors, all float64) {
		m := testutil.Scrape(t, d.base)
		for _, o := range []string{"http_error", "stream_error", "timeout", "connection_error"} {
			errors += m.Sum("kvload_requests_total", "outcome", o)
		}
		return m.Sum("kvload_requests_total", "outcome", "abandoned"), errors, m.Sum("kvload_requests_total")
	}
	start := ctNextPass(t, ctRead(t, d.base), d.base)
	a0, e0, n0 := outcomes()
	// Three passes, so that the half that succeeds is enough for ctBand.
	end := start
	for range 3 {
		end = ctNextPass(t, end, d.base)
	}
	a1, e1, n1 := outcomes()
	abandoned, errs, all := a1-a0, e1-e0, n1-n0
	t.Logf("over three passes: %v requests, %v abandoned, %v errors", all, abandoned, errs)
	if share := abandoned / all; share < 0.35 || share > 0.65 {
		t.Errorf("abandoned %.3f of the requests (%v of %v), want 0.35 to 0.65", share, abandoned, all)
	}
	if errs != 0 {
		t.Errorf("%v errors, want none", errs)
	}
	ctBand(t, "with half the streams abandoned", end.minus(start), 0.93, 1.01)
}
