package collector

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/servedcache"
)

// TestStatusHealth: the landing page's health state and its reason, from
// the window's outcomes, schedule lag and cache efficiency.
func TestStatusHealth(t *testing.T) {
	ok := func(lag time.Duration, cached int) *replay.Result {
		return &replay.Result{
			Response: openai.Response{Outcome: openai.OutcomeSuccess, PromptTokens: 1000, PromptKnown: true, CachedTokens: cached, CachedKnown: cached >= 0, Sent: time.Unix(0, 0).Add(lag)}, TraceInputLength: 1000,
			TheoreticalCachedTokens: 500, TheoreticalKnown: true, Scheduled: time.Unix(0, 0)}
	}
	fail := &replay.Result{Response: openai.Response{Outcome: openai.OutcomeHTTPError, HTTPStatus: 503, Error: strings.Repeat("x", 1000)}}
	many := func(n int, r *replay.Result) []*replay.Result {
		out := make([]*replay.Result, n)
		for i := range out {
			out[i] = r
		}
		return out
	}
	tests := []struct {
		name       string
		results    []*replay.Result
		health     Health
		reason     string
		efficiency EfficiencyState
	}{
		{"healthy", many(10, ok(0, 500)), HealthOK, "10 requests, none failed", EfficiencyOK},
		{"a few errors", append(many(99, ok(0, 500)), fail), HealthOK, "1 of 100 requests failed", EfficiencyOK},
		{"degraded by errors", append(many(9, ok(0, 500)), fail), HealthDegraded, "1 of 10 requests failed (10.0%), mostly http_error", EfficiencyOK},
		{"failing", append(many(1, ok(0, 500)), many(3, fail)...), HealthFailing, "3 of 4 requests failed (75.0%), mostly http_error", EfficiencyOK},
		{"every request fails", many(3, fail), HealthFailing, "3 of 3 requests failed (100.0%), mostly http_error", EfficiencyNoSuccess},
		{"behind schedule", many(10, ok(2*time.Second, 500)), HealthDegraded, "schedule lag p99 2000 ms", EfficiencyOK},
		{"cache regression", many(10, ok(0, 100)), HealthDegraded, "the cache serves 20% of what the trace allows", EfficiencyLow},
		{"above the model", many(10, ok(0, 900)), HealthOK, "none failed", EfficiencyAbove},
		// Back after an outage: 30 failures, then successes in a row.
		{"recovering", append(many(30, fail), many(5, ok(0, 500))...), HealthRecovering, "the last 5 requests succeeded", EfficiencyOK},
		{"recovering but behind schedule", append(many(30, fail), many(5, ok(2*time.Second, 500))...), HealthDegraded, "schedule lag p99 2000 ms", EfficiencyOK},
		{"not yet recovering", append(many(30, fail), many(4, ok(0, 500))...), HealthFailing, "30 of 34 requests failed", EfficiencyOK},
		// At 23% errors, 15 successes in a row are luck one time in 50:
		// 27 are needed. At 5.3%, 127.
		{"a lucky run is no recovery", append(many(4, fail), append(many(12, ok(0, 500)), append(many(4, fail), many(15, ok(0, 500))...)...)...), HealthDegraded, "8 of 35 requests failed", EfficiencyOK},
		{"a long run is", append(many(4, fail), append(many(12, ok(0, 500)), append(many(4, fail), many(130, ok(0, 500))...)...)...), HealthRecovering, "the last 130 requests succeeded", EfficiencyOK},
		{"cached tokens not reported", many(10, ok(0, -1)), HealthOK, "none failed", EfficiencyNotReported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(prometheus.NewRegistry())
			tr := servedcache.New(c)
			now := time.Unix(1000, 0)
			c.now = func() time.Time { return now }
			for _, r := range tt.results {
				r := *r
				r.Workload, r.Target = "w", "t"
				tr.Finished(&r)
			}
			st := c.Status()
			if len(st) != 1 {
				t.Fatalf("%d rows", len(st))
			}
			s := st[0]
			if s.Health != tt.health || !strings.Contains(s.HealthReason, tt.reason) {
				t.Errorf("health %q (%s), want %q with %q", s.Health, s.HealthReason, tt.health, tt.reason)
			}
			if s.EfficiencyState != tt.efficiency {
				t.Errorf("efficiency %q (%.2f), want %q", s.EfficiencyState, s.Efficiency, tt.efficiency)
			}
			if known := tt.efficiency != EfficiencyNoSuccess; s.TheoreticalKnown != known {
				t.Errorf("theoretical known %v, want %v", s.TheoreticalKnown, known)
			}
			if len(s.LastError) > maxErrorLen+len("…") {
				t.Errorf("last error not bounded: %d bytes", len(s.LastError))
			}
			var sum int
			for _, o := range s.Outcomes {
				sum += o.Count
			}
			if sum != len(tt.results) || len(s.Outcomes) != len(openai.Outcomes) {
				t.Errorf("outcomes %v for %d requests", s.Outcomes, len(tt.results))
			}
		})
	}
	// Drops: KvloadGeneratorBehind pages on any; the landing page agrees.
	for _, tt := range []struct {
		name          string
		finished      int
		drops         int
		age           time.Duration // of the drops
		health        Health
		reason        string
		dropsInWindow int
	}{
		{"drops beside successes", 10, 3, 0, HealthDegraded, "3 scheduled requests dropped in the last 1m0s", 3},
		{"every request dropped", 0, 5, 0, HealthFailing, "no request finished in the last 1m0s, and 5 scheduled requests were dropped", 5},
		{"old drops forgotten", 10, 3, 2 * statusAge, HealthOK, "10 requests, none failed", 0},
		{"drops bounded", 10, 3 * statusWindow, 0, HealthDegraded, "1024 scheduled requests dropped", statusWindow},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := New(prometheus.NewRegistry())
			tr := servedcache.New(c)
			now := time.Unix(1000, 0)
			c.now = func() time.Time { return now }
			for range tt.drops {
				c.Dropped("w", "t", replay.DropMaxInFlight, now)
			}
			now = now.Add(tt.age)
			for range tt.finished {
				r := *ok(0, 500)
				r.Workload, r.Target = "w", "t"
				tr.Finished(&r)
			}
			s := c.Status()[0]
			if s.Health != tt.health || !strings.Contains(s.HealthReason, tt.reason) {
				t.Errorf("health %q (%s), want %q with %q", s.Health, s.HealthReason, tt.health, tt.reason)
			}
			if s.Dropped != tt.dropsInWindow {
				t.Errorf("%d drops in the window, want %d", s.Dropped, tt.dropsInWindow)
			}
		})
	}
	t.Run("nothing in the window", func(t *testing.T) {
		c := New(prometheus.NewRegistry())
		now := time.Unix(1000, 0)
		c.now = func() time.Time { return now }
		servedcache.New(c).Finished(&replay.Result{Workload: "w", Target: "t", Response: openai.Response{Outcome: openai.OutcomeSuccess}})
		now = now.Add(2 * statusAge)
		if s := c.Status()[0]; s.Health != HealthNotReported {
			t.Errorf("health %q, want %q", s.Health, HealthNotReported)
		}
	})
}
