package collector

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// sloResult is a finished request of (w, t): ttft to its first token,
// last to its last, out output tokens.
func sloResult(w, t string, o openai.Outcome, ttft, last time.Duration, out int) *replay.Result {
	sent := time.Unix(1_700_000_000, 0)
	r := &replay.Result{Workload: w, Target: t, Scheduled: sent}
	r.Sent, r.Outcome, r.OutputTokens = sent, o, out
	if ttft > 0 {
		r.FirstToken = sent.Add(ttft)
	}
	if last > 0 {
		r.LastToken = sent.Add(last)
	}
	return r
}

func TestSLOGood(t *testing.T) {
	all := SLO{TTFT: time.Second, InterToken: 100 * time.Millisecond, Request: 5 * time.Second, Objective: 0.99}
	for _, tt := range []struct {
		name string
		slo  SLO
		r    *replay.Result
		want bool
	}{
		{"within every threshold", all, sloResult("w", "t", openai.OutcomeSuccess, 500*time.Millisecond, 1400*time.Millisecond, 10), true},
		{"at the thresholds", all, sloResult("w", "t", openai.OutcomeSuccess, time.Second, 1900*time.Millisecond, 10), true},
		{"ttft over", all, sloResult("w", "t", openai.OutcomeSuccess, 1001*time.Millisecond, 1500*time.Millisecond, 10), false},
		{"inter-token mean over", all, sloResult("w", "t", openai.OutcomeSuccess, 100*time.Millisecond, 2*time.Second, 10), false},
		{"request over", SLO{Request: time.Second, Objective: 0.9}, sloResult("w", "t", openai.OutcomeSuccess, 100*time.Millisecond, 1100*time.Millisecond, 1), false},
		{"one token has no inter-token latency to miss", all, sloResult("w", "t", openai.OutcomeSuccess, 900*time.Millisecond, 900*time.Millisecond, 1), true},
		{"no first token misses ttft", all, sloResult("w", "t", openai.OutcomeSuccess, 0, 0, 0), false},
		{"no threshold: any success", SLO{Objective: 0.99}, sloResult("w", "t", openai.OutcomeSuccess, time.Hour, 2*time.Hour, 10), true},
		{"a failure is never good", SLO{Objective: 0.99}, sloResult("w", "t", openai.OutcomeStreamError, 10*time.Millisecond, 20*time.Millisecond, 2), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.slo.Good(tt.r); got != tt.want {
				t.Errorf("Good = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSLOCounters: only pairs with an objective are judged; canceled and
// abandoned requests are not; the gauges carry the thresholds given; a
// pair forgotten on reload loses every series.
func TestSLOCounters(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	c.Start("fast", "t")
	c.Start("plain", "t")
	c.SLOs().Set("fast", "t", &SLO{TTFT: time.Second, Objective: 0.99})
	c.SLOs().Set("plain", "t", nil)
	for _, r := range []*replay.Result{
		sloResult("fast", "t", openai.OutcomeSuccess, 100*time.Millisecond, 200*time.Millisecond, 2),
		sloResult("fast", "t", openai.OutcomeSuccess, 2*time.Second, 3*time.Second, 2),
		sloResult("fast", "t", openai.OutcomeHTTPError, 0, 0, 0),
		sloResult("fast", "t", openai.OutcomeTimeout, 0, 0, 0),
		sloResult("fast", "t", openai.OutcomeCanceled, 0, 0, 0),
		sloResult("fast", "t", openai.OutcomeAbandoned, 100*time.Millisecond, 150*time.Millisecond, 2),
		sloResult("plain", "t", openai.OutcomeSuccess, 100*time.Millisecond, 200*time.Millisecond, 2),
	} {
		c.Sent(r.Workload, r.Target, r.Scheduled, r.Sent)
		c.Finished(r)
	}
	mfs := testutil.Gather(t, reg)
	for _, tt := range []struct {
		name  string
		pairs []string
		want  float64
		n     int
	}{
		{"kvload_slo_requests_total", []string{"workload", "fast"}, 4, 1},
		{"kvload_slo_good_requests_total", []string{"workload", "fast"}, 1, 1},
		{"kvload_slo_objective_ratio", []string{"workload", "fast"}, 0.99, 1},
		{"kvload_slo_threshold_seconds", []string{"workload", "fast", "threshold", "ttft"}, 1, 1},
		{"kvload_slo_threshold_seconds", []string{"workload", "fast"}, 1, 1}, // no other threshold given
		{"kvload_slo_requests_total", []string{"workload", "plain"}, 0, 0},
		{"kvload_slo_objective_ratio", []string{"workload", "plain"}, 0, 0},
		{"kvload_requests_total", []string{"workload", "fast", "outcome", "abandoned"}, 1, 1},
	} {
		if got, n := mfs.Value(tt.name, tt.pairs...); got != tt.want || n != tt.n {
			t.Errorf("%s%v = %v over %d series, want %v over %d", tt.name, tt.pairs, got, n, tt.want, tt.n)
		}
	}

	c.Forget("fast", "t")
	c.Finished(sloResult("fast", "t", openai.OutcomeSuccess, 100*time.Millisecond, 200*time.Millisecond, 2))
	mfs = testutil.Gather(t, reg)
	for _, name := range []string{"kvload_slo_requests_total", "kvload_slo_good_requests_total", "kvload_slo_objective_ratio", "kvload_slo_threshold_seconds"} {
		if _, n := mfs.Value(name, "workload", "fast"); n != 0 {
			t.Errorf("%s: %d series after Forget, want none", name, n)
		}
	}
}
