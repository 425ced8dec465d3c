package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// quickstartSpeedup replays the quickstart faster than shipped, so that three
// passes take about a minute and a half; the cache holds the same blocks whatever the
// speed.
const quickstartSpeedup = 10

// TestE2EQuickstartHitRate runs examples/quickstart.yml as shipped (its
// trace, cache sizes and fresh passes), only faster, with no prefill time
// and no row dropped, for three passes, and
// checks that the hit rate it observes is within 3 points of the share of
// prompt tokens `analyze` says the trace lets a cache serve: the bounded
// cache must fit what the trace reuses.
func TestE2EQuickstartHitRate(t *testing.T) {
	t.Parallel()
	e2eReplaySlot(t)
	if testutil.RaceEnabled {
		t.Skip("three passes of 13.7M prompt tokens: too slow under -race; run by `make test-e2e`")
	}
	src, err := os.ReadFile(filepath.Join(e2eExamples, "quickstart.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(src, &cfg); err != nil {
		t.Fatal(err)
	}
	w := cfg["workloads"].([]any)[0].(map[string]any)
	workload, target := w["name"].(string), w["targets"].([]any)[0].(string)
	trace, err := filepath.Abs(filepath.Join(e2eExamples, w["trace"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	w["trace"] = trace
	w["synthesis"].(map[string]any)["speedup_ratio"] = quickstartSpeedup
	// What a slow machine would move is taken out. A prompt that reaches
	// the engine while the one whose prefix it shares is in prefill
	// misses it, as often as prefills are slow, so the engine has no
	// prefill time and stores a prompt's blocks as it admits it; and rows
	// wait for a slot instead of being dropped, so that every pass sends
	// the whole trace that analyze reads.
	em := cfg["targets"].([]any)[0].(map[string]any)["emulate"].(map[string]any)
	delete(em, "overhead")
	delete(em, "prefill_per_token")
	w["on_saturation"] = "queue"
	w["max_queue_lag"] = "1h"
	edited, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// What analyze says of the trace.
	var out bytes.Buffer
	if code := cli.Run(context.Background(), []string{"analyze", trace}, &out, &out); code != cli.ExitOK {
		t.Fatalf("analyze exited %d: %s", code, out.String())
	}
	m := regexp.MustCompile(`(?m)^Token hit rate: +(\S+)$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("analyze printed no token hit rate:\n%s", out.String())
	}
	want, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}

	dir := e2eDir(t, map[string][]byte{"quickstart.yml": edited})
	d := e2eStart(t, filepath.Join(dir, "quickstart.yml"), target)
	// The rates of the second and third passes, from the counters at the
	// end of the first and of the third: steady state, the cache already
	// holding a pass's blocks, and each boundary's requests still in
	// flight balancing out.
	at := func(passes float64) e2eTotals {
		var tt e2eTotals
		testutil.Eventually(t, fmt.Sprintf("%v passes of the quickstart", passes), func() (bool, string) {
			m := testutil.Scrape(t, d.base)
			done := m.Sum("kvload_trace_loops_total", "workload", workload)
			tt = e2eTotalsOf(m, target, workload)
			return done >= passes, fmt.Sprintf("%v passes, %+v", done, tt)
		})
		return tt
	}
	first, third := at(1), at(3)
	observed := (third.CachedTokens - first.CachedTokens) / (third.PromptTokens - first.PromptTokens)
	theoretical := (third.Theoretical - first.Theoretical) / (third.TracePromptTokens - first.TracePromptTokens)
	t.Logf("analyze: %.1f%% of prompt tokens; quickstart: observed %.1f%%, theoretical %.1f%%", 100*want, 100*observed, 100*theoretical)
	for _, got := range []struct {
		name string
		rate float64
	}{{"observed", observed}, {"theoretical", theoretical}} {
		if math.Abs(got.rate-want) > 0.03 {
			t.Errorf("%s hit rate %.1f%%, more than 3 points from analyze's %.1f%%", got.name, 100*got.rate, 100*want)
		}
	}
}
