package cli

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/collector"
)

// TestLandingReconcile: the landing page's cache reconciliation table, one
// row per compared target: a disagreement is marked as the engine's
// metrics disagreeing, a state without ratios shows dashes and its reason,
// and without reconciled targets there is no table.
func TestLandingReconcile(t *testing.T) {
	render := func(rows []collector.ReconcileStatus) string {
		mux := newMux(webDeps{gatherer: prometheus.NewRegistry(), telemetryPath: "/metrics", ready: func() bool { return true },
			reload:  func(context.Context) error { return nil },
			landing: func() landingData { return landingData{Reconcile: rows} }})
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		return rec.Body.String()
	}
	body := render([]collector.ReconcileStatus{
		{Target: "double", State: collector.ReconcileCompared, Disagree: true, Reason: "the engine's metrics disagree <b>", Window: 5 * time.Minute,
			CanaryShare: 1, ShareKnown: true, EngineHitRate: 0.4, UsageHitRate: 0.2, TheoreticalRate: 0.2, EngineOverUsage: 2,
			UsageOverModel: 1, EngineOverModel: 2, ModelKnown: true},
		{Target: "shared", State: collector.ReconcileSharedEngine, Reason: "this exporter sent 50.0%", Window: time.Minute, CanaryShare: 0.5, ShareKnown: true},
	})
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?s)<tr data-target="double">.*?<span class="state warn">engine's metrics disagree</span><span class="reason">the engine&#39;s metrics disagree &lt;b&gt;</span>` +
			`.*?<td>100.0%</td>\s*<td>40.0%</td><td>20.0%</td><td>20.0%</td>\s*<td>2.00</td><td>1.00</td><td>2.00</td>\s*<td>300 s</td>`),
		regexp.MustCompile(`(?s)<tr data-target="shared">.*?<span class="state none">shared engine</span><span class="reason">this exporter sent 50.0%</span>` +
			`.*?<td>50.0%</td>\s*<td>–</td><td>–</td><td>–</td><td>–</td><td>–</td><td>–</td>\s*<td>60 s</td>`),
	} {
		if !want.MatchString(body) {
			t.Errorf("the page does not match %s:\n%s", want, body)
		}
	}
	if body := render(nil); strings.Contains(body, "Cache reconciliation") {
		t.Errorf("a table without reconciled targets:\n%s", body)
	}
}
