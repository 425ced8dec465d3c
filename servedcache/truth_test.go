package servedcache

import (
	"sync"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// recorder is a Counter that keeps what it is given.
type recorder struct {
	mu        sync.Mutex
	finished  []replay.Counted
	sent      int
	credited  map[string]float64 // workload → cached tokens
	preambles []int
	errors    int
}

func (r *recorder) Sent(string, string, time.Time, time.Time) {
	r.mu.Lock()
	r.sent++
	r.mu.Unlock()
}

func (r *recorder) Finished(res *replay.Result) {
	r.mu.Lock()
	r.finished = append(r.finished, res.Counted)
	r.mu.Unlock()
}
func (r *recorder) Dropped(string, string, replay.DropReason, time.Time) {}
func (r *recorder) PassCompleted(string, string, int)                    {}

func (r *recorder) AddServerCredit(workload, _ string, cached, _ float64) {
	r.mu.Lock()
	if r.credited == nil {
		r.credited = map[string]float64{}
	}
	r.credited[workload] += cached
	r.mu.Unlock()
}

func (r *recorder) ServerMetricsError(string, engine.ServerMetricsErrorReason) {
	r.mu.Lock()
	r.errors++
	r.mu.Unlock()
}

func (r *recorder) SetPreamble(_ string, tokens int) {
	r.mu.Lock()
	r.preambles = append(r.preambles, tokens)
	r.mu.Unlock()
}

// TestCounted: how a result counts follows from its target's source of
// observed cached tokens and what the response and the model knew.
func TestCounted(t *testing.T) {
	tests := []struct {
		name        string
		observed    engine.Observed // "": a target never set
		outcome     openai.Outcome
		cachedKnown bool
		theoKnown   bool
		want        replay.Counted
	}{
		{"usage, both known", engine.ObservedUsage, openai.OutcomeSuccess, true, true,
			replay.Counted{UsageCached: true, Reported: true}},
		{"usage, no cached count", engine.ObservedUsage, openai.OutcomeSuccess, false, true,
			replay.Counted{Unreported: true}},
		{"usage, no theoretical count", engine.ObservedUsage, openai.OutcomeSuccess, true, false,
			replay.Counted{UsageCached: true}},
		{"usage, failed", engine.ObservedUsage, openai.OutcomeHTTPError, true, true,
			replay.Counted{UsageCached: true}},
		{"server metrics ignore usage", engine.ObservedServerMetrics, openai.OutcomeSuccess, true, true,
			replay.Counted{Reported: true}},
		{"server metrics, no theoretical count", engine.ObservedServerMetrics, openai.OutcomeSuccess, false, false,
			replay.Counted{}},
		{"none", engine.ObservedNone, openai.OutcomeSuccess, true, true,
			replay.Counted{Unreported: true}},
		{"a target never set reads usage", "", openai.OutcomeSuccess, true, true,
			replay.Counted{UsageCached: true, Reported: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			tr := New(rec)
			if tt.observed != "" {
				tr.SetTarget("t", "vllm", tt.observed)
			}
			tr.Finished(&replay.Result{Workload: "w", Target: "t", TraceInputLength: 100,
				TheoreticalCachedTokens: 50, TheoreticalKnown: tt.theoKnown,
				Response: openai.Response{Outcome: tt.outcome, PromptTokens: 110, PromptKnown: true, CachedTokens: 60, CachedKnown: tt.cachedKnown}})
			if len(rec.finished) != 1 || rec.finished[0] != tt.want {
				t.Errorf("counted %+v, want %+v", rec.finished, tt.want)
			}
		})
	}
}

// TestChangedTargetStartsOver: a target whose source or dialect changes
// is told of again when its responses carry no cached count, and its
// preamble is published afresh; the same settings again change nothing.
func TestChangedTargetStartsOver(t *testing.T) {
	rec := &recorder{}
	tr := New(rec)
	var told int
	tr.NotifyUnreported = func(string, engine.Dialect) { told++ }
	unreported := &replay.Result{Workload: "w", Target: "t", Response: openai.Response{Outcome: openai.OutcomeSuccess}}
	for _, step := range []struct {
		observed             engine.Observed
		wantTold, wantResets int
	}{
		{engine.ObservedUsage, 1, 1},
		{engine.ObservedUsage, 1, 1},
		{engine.ObservedNone, 1, 2}, // nothing to switch on with none
		{engine.ObservedUsage, 2, 3},
	} {
		tr.SetTarget("t", "vllm", step.observed)
		tr.Finished(unreported)
		tr.Finished(unreported)
		if told != step.wantTold || len(rec.preambles) != step.wantResets {
			t.Errorf("observed %s: told %d times, preamble set %v; want %d and %d resets",
				step.observed, told, rec.preambles, step.wantTold, step.wantResets)
		}
	}
}

// TestConcurrentUse: the replay's goroutines, the scraper and the reload
// call the step at once; run with -race. Every result reaches the
// collector, and the hits of a read are credited at most once.
func TestConcurrentUse(t *testing.T) {
	rec := &recorder{}
	tr := New(rec)
	tr.SetTarget("t", "vllm", engine.ObservedServerMetrics)
	const workers, each = 4, 200
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				tr.Sent("w", "t", time.Time{}, time.Time{})
				tr.Finished(&replay.Result{Workload: "w", Target: "t", TraceInputLength: 100, TheoreticalKnown: i%2 == 0,
					Response: openai.Response{Outcome: openai.OutcomeSuccess}})
			}
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for range each {
			tr.AddServerCached("t", 1)
			tr.ServerMetricsError("t", engine.ServerErrorScrape)
		}
	}()
	go func() {
		defer wg.Done()
		for range each {
			tr.SetTarget("t", "vllm", engine.ObservedServerMetrics)
			tr.SetTarget("u", "sglang", engine.ObservedUsage)
			tr.ForgetTarget("u")
		}
	}()
	wg.Wait()
	tr.AddServerCached("t", 1) // a read after every result: some read found shares
	if rec.sent != workers*each || len(rec.finished) != workers*each || rec.errors != each {
		t.Errorf("forwarded %d sent, %d finished, %d errors; want %d, %d, %d",
			rec.sent, len(rec.finished), rec.errors, workers*each, workers*each, each)
	}
	if got := rec.credited["w"]; got <= 0 || got > each+1 {
		t.Errorf("credited %v cached tokens of %d read", got, each+1)
	}
}
