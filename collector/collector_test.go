package collector

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

var update = flag.Bool("update", false, "rewrite golden files")

// scripted feeds a fixed sequence of events with known numbers.
func scripted(c *Collector) {
	t0 := time.Unix(1_700_000_000, 0)
	c.SetTarget("vllm-a", "Qwen/Qwen3-0.6B", "chat", "vllm", "usage")
	c.Start("canary", "vllm-a")
	c.ReloadDone(true, t0)

	ok := func(sched, ttft, last time.Duration, out, prompt, cached, trace, theo int) *replay.Result {
		sent := t0.Add(sched + 2*time.Millisecond)
		return &replay.Result{
			Workload: "canary", Target: "vllm-a",
			Scheduled: t0.Add(sched), Sent: sent,
			FirstToken: sent.Add(ttft), LastToken: sent.Add(last),
			Outcome: replay.OutcomeSuccess, HTTPStatus: 200,
			OutputTokens: out, OutputFromUsage: true,
			PromptTokens: prompt, PromptKnown: true,
			CachedTokens: cached, CachedKnown: true,
			TraceInputLength: trace, TheoreticalCachedTokens: theo,
		}
	}
	results := []*replay.Result{
		ok(0, 40*time.Millisecond, 540*time.Millisecond, 11, 1312, 0, 1300, 0),
		ok(time.Second, 20*time.Millisecond, 220*time.Millisecond, 5, 1112, 1024, 1100, 1024),
		{Workload: "canary", Target: "vllm-a", Scheduled: t0.Add(2 * time.Second), Sent: t0.Add(2*time.Second + time.Millisecond),
			Outcome: replay.OutcomeHTTPError, HTTPStatus: 500, TraceInputLength: 900},
	}
	for _, r := range results {
		c.Sent(r.Workload, r.Target, r.Scheduled, r.Sent)
	}
	for _, r := range results {
		c.Finished(r)
	}
	c.Dropped("canary", "vllm-a", replay.DropMaxInFlight, t0)
	c.PassCompleted("canary", "vllm-a", 0)
	c.PassCompleted("canary", "other", 0) // the same pass from a second target is not counted again
}

func TestGoldenMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	scripted(c)

	golden := filepath.Join("testdata", "scripted.prom")
	if *update {
		out, err := gatherText(reg)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./collector -update)", err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(reg, f); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestForgetRemovesSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := New(reg)
	scripted(c)
	c.Start("canary", "vllm-b")
	c.Forget("canary", "vllm-a")
	c.ForgetTarget("vllm-a")
	out, err := gatherText(reg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), `target="vllm-a"`) {
		t.Errorf("series of the forgotten target remain:\n%s", out)
	}
	if !strings.Contains(string(out), `target="vllm-b"`) {
		t.Errorf("series of the kept target are gone")
	}
}

func TestReloadFailureKeepsTimestamp(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	at := time.Unix(1000, 0)
	c.ReloadDone(true, at)
	c.ReloadDone(false, at.Add(time.Hour))
	if got := testutil.ToFloat64(c.reloadOK); got != 0 {
		t.Errorf("reload gauge = %v, want 0", got)
	}
	if got := testutil.ToFloat64(c.reloadTime); got != 1000 {
		t.Errorf("last success = %v, want 1000", got)
	}
}

// gatherText renders reg in the text exposition format.
func gatherText(reg prometheus.Gatherer) ([]byte, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, err
		}
	}
	return b.Bytes(), nil
}

func TestStatus(t *testing.T) {
	c := New(prometheus.NewRegistry())
	now := time.Unix(5000, 0)
	c.now = func() time.Time { return now }
	scripted(c) // two successes, one failure, all "now"
	now = now.Add(10 * time.Second)
	st := c.Status()
	if len(st) != 1 {
		t.Fatalf("got %d rows", len(st))
	}
	s := st[0]
	if s.Window != 10*time.Second || s.RequestsPerSec != 0.3 {
		t.Errorf("window %v rate %v, want 10s and 0.3/s", s.Window, s.RequestsPerSec)
	}
	if s.TTFTP50 != 20*time.Millisecond || s.TTFTP99 != 40*time.Millisecond {
		t.Errorf("TTFT p50 %v p99 %v", s.TTFTP50, s.TTFTP99)
	}
	if want := 1024.0 / 2424; s.ObservedHitRate != want {
		t.Errorf("observed %v, want %v", s.ObservedHitRate, want)
	}
	if want := 1024.0 / 2400; s.TheoreticalRate != want {
		t.Errorf("theoretical %v, want %v", s.TheoreticalRate, want)
	}
	if s.ErrorRatio != 1.0/3 {
		t.Errorf("error ratio %v", s.ErrorRatio)
	}
	now = now.Add(2 * time.Minute)
	if st := c.Status(); st[0].RequestsPerSec != 0 {
		t.Errorf("old samples still counted: %+v", st[0])
	}
}
