package servedcache

import (
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// costResult is a request of pair (w, target) sent at sent whose first
// token came 100 ms later.
func costResult(target string, sent time.Time, ok, theoretical bool) *replay.Result {
	r := &replay.Result{Workload: "w", Target: target,
		Response:         openai.Response{Outcome: openai.OutcomeSuccess, Sent: sent, FirstToken: sent.Add(100 * time.Millisecond), OutputTokens: 2},
		TraceInputLength: 1000, TheoreticalCachedTokens: 400, TheoreticalKnown: theoretical}
	if !ok {
		r.Outcome = openai.OutcomeHTTPError
	}
	return r
}

// TestCostWindows: a pair's window takes its usable requests only, is
// listed from Start on, starts over when its target's span changes, and
// keeps only the requests of its span.
func TestCostWindows(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	c := NewCostWindows()
	c.Start("w", "idle")
	for i := range 5 {
		at := t0.Add(time.Duration(i) * time.Second)
		c.Add(costResult("t", at, true, true), at)
	}
	c.Add(costResult("t", t0, false, true), t0) // failed
	c.Add(costResult("t", t0, true, false), t0) // no theoretical side
	est := c.Estimates(t0.Add(10 * time.Second))
	if len(est) != 2 {
		t.Fatalf("%d pairs, want 2 (one started, one with requests)", len(est))
	}
	if got := est[Pair{"w", "t"}].Requests; got != 5 {
		t.Errorf("requests %d, want the 5 usable", got)
	}
	if got := est[Pair{"w", "idle"}].Requests; got != 0 {
		t.Errorf("an idle pair rests on %d requests", got)
	}
	if got := c.Estimates(t0.Add(DefaultWindow + 3*time.Second))[Pair{"w", "t"}].Requests; got != 1 {
		t.Errorf("%d requests of the default 5-minute span, want 1", got)
	}
	c.SetWindow("t", time.Minute)
	if got := c.Estimates(t0.Add(10 * time.Second))[Pair{"w", "t"}].Requests; got != 0 {
		t.Errorf("%d requests after the span changed, want 0 (started over)", got)
	}
	c.Add(costResult("t", t0.Add(20*time.Second), true, true), t0.Add(20*time.Second))
	c.SetWindow("t", time.Minute) // the same span: nothing starts over
	if got := c.Estimates(t0.Add(30 * time.Second))[Pair{"w", "t"}].Requests; got != 1 {
		t.Errorf("%d requests after setting the same span, want 1", got)
	}
	if got := c.Estimates(t0.Add(90 * time.Second))[Pair{"w", "t"}].Requests; got != 0 {
		t.Errorf("%d requests 70 s on in a 1-minute span, want 0", got)
	}
	c.Forget("w", "t")
	c.ForgetTarget("t")
	if _, ok := c.Estimates(t0)[Pair{"w", "t"}]; ok {
		t.Error("a forgotten pair is still fitted")
	}
}
