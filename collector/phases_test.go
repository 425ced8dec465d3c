package collector

import (
	"fmt"
	"math"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// openMetrics renders reg as the /metrics handler does for a scraper that
// asks for OpenMetrics, the exposition that carries exemplars.
func openMetrics(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("content type %q", ct)
	}
	return rec.Body.String()
}

// TestTraceExemplars: the TTFT and duration buckets of a sampled request
// carry its trace id as an exemplar; an unsampled request's do not.
func TestTraceExemplars(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	c.Start("canary", "vllm-a")
	sent := time.Unix(1_700_000_000, 0)
	result := func(ttft time.Duration, id byte, sampled bool) *replay.Result {
		var flags trace.TraceFlags
		if sampled {
			flags = trace.FlagsSampled
		}
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{15: id}, SpanID: trace.SpanID{7: 1}, TraceFlags: flags})
		return &replay.Result{Workload: "canary", Target: "vllm-a", Response: openai.Response{
			Sent: sent, FirstToken: sent.Add(ttft), LastToken: sent.Add(2 * ttft), Outcome: openai.OutcomeSuccess, OutputTokens: 4, Trace: sc}}
	}
	c.Sent("canary", "vllm-a", sent, sent)
	c.Finished(result(30*time.Millisecond, 0xab, true))
	c.Sent("canary", "vllm-a", sent, sent)
	c.Finished(result(3*time.Second, 0xcd, false))
	out := openMetrics(t, reg)
	for _, metric := range []string{"kvload_time_to_first_token_seconds_bucket", "kvload_request_duration_seconds_bucket"} {
		re := regexp.MustCompile(metric + `\{[^}]*\} \d+ # \{trace_id="([0-9a-f]{32})"\}`)
		m := re.FindAllStringSubmatch(out, -1)
		if len(m) != 1 || m[0][1] != "000000000000000000000000000000ab" {
			t.Errorf("%s exemplars: %v, want the sampled request's trace only", metric, m)
		}
	}
	if strings.Contains(out, "0000000000cd") {
		t.Errorf("an unsampled request's trace id is an exemplar")
	}
}

// exemplarRequest is a sampled request: its TTFT, its trace id's last
// byte, and when it finished after the test's start.
type exemplarRequest struct {
	ttft time.Duration
	id   byte
	at   time.Duration
}

// TestExemplarsPerBucketAtMostEverySecond: a bucket of a series takes a
// sampled request's trace, then no other for exemplarEvery; another
// bucket, hit meanwhile, takes its own at once; after exemplarEvery the
// first bucket takes the next request's.
func TestExemplarsPerBucketAtMostEverySecond(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name     string
		requests []exemplarRequest
		want     map[string]string // bucket (le) → the exemplar's trace id's last byte, in hex
	}{
		{"one bucket, within a second: the first request's trace", []exemplarRequest{{30 * time.Millisecond, 0x01, 0}, {40 * time.Millisecond, 0x02, 10 * time.Millisecond}, {45 * time.Millisecond, 0x03, 900 * time.Millisecond}},
			map[string]string{"0.05": "01"}},
		{"the slow tail takes its trace at once", []exemplarRequest{{30 * time.Millisecond, 0x01, 0}, {3 * time.Second, 0x02, 10 * time.Millisecond}, {40 * time.Millisecond, 0x03, 20 * time.Millisecond}},
			map[string]string{"0.05": "01", "5.0": "02"}},
		{"a second later the bucket takes a new one", []exemplarRequest{{30 * time.Millisecond, 0x01, 0}, {40 * time.Millisecond, 0x02, 999 * time.Millisecond}, {45 * time.Millisecond, 0x03, 1000 * time.Millisecond}},
			map[string]string{"0.05": "03"}},
		{"a clock that went back does not hold the bucket", []exemplarRequest{{30 * time.Millisecond, 0x01, time.Second}, {40 * time.Millisecond, 0x02, 0}},
			map[string]string{"0.05": "02"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := New(reg)
			c.Start("canary", "vllm-a")
			var now time.Time
			c.now = func() time.Time { return now }
			for _, rq := range tt.requests {
				now = start.Add(rq.at)
				sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{15: rq.id}, SpanID: trace.SpanID{7: 1}, TraceFlags: trace.FlagsSampled})
				c.Sent("canary", "vllm-a", start, start)
				c.Finished(&replay.Result{Workload: "canary", Target: "vllm-a", Response: openai.Response{
					Sent: start, FirstToken: start.Add(rq.ttft), LastToken: start.Add(rq.ttft), Outcome: openai.OutcomeSuccess, OutputTokens: 1, Trace: sc}})
			}
			re := regexp.MustCompile(`kvload_time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"\} \d+ # \{trace_id="0{30}([0-9a-f]{2})"\}`)
			got := map[string]string{}
			for _, m := range re.FindAllStringSubmatch(openMetrics(t, reg), -1) {
				got[m[1]] = m[2]
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("exemplars by bucket %v, want %v", got, tt.want)
			}
		})
	}
}

// TestExemplarGateOddValues: values outside the buckets (below the first,
// past the last, NaN) have a slot of their own and are gated like others.
func TestExemplarGateOddValues(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, v := range []float64{-1, 0, 600, 601, math.Inf(1), math.NaN()} {
		var g exemplarGate
		if !g.due(v, now) || g.due(v, now.Add(time.Millisecond)) || !g.due(v, now.Add(exemplarEvery)) {
			t.Errorf("value %v: want due, then not within %v, then due again", v, exemplarEvery)
		}
	}
}

// TestHTTPPhaseSeries: every phase a request went through is observed,
// and its connection counted as new or reused.
func TestHTTPPhaseSeries(t *testing.T) {
	srv := httptest.NewServer(nil) // only for a real request's phases: 404 is an answer
	defer srv.Close()
	client, err := openai.New(openai.TargetConfig{Name: "t", URL: srv.URL, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	reg := prometheus.NewRegistry()
	c := New(reg)
	c.Start("canary", "t")
	for range 2 {
		r := &replay.Result{Workload: "canary", Target: "t"}
		client.Do(t.Context(), openai.Request{Prompt: "hi", MaxTokens: 1}, &r.Response)
		if r.Outcome != openai.OutcomeHTTPError || r.HTTPStatus != 404 {
			t.Fatalf("outcome %s %d: %s", r.Outcome, r.HTTPStatus, r.Error)
		}
		c.Sent("canary", "t", r.Sent, r.Sent)
		c.Finished(r)
	}
	counts := map[string]uint64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvload_http_phase_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" {
					counts[l.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	want := map[string]uint64{"connect": 1, "write_request": 2, "first_byte": 2}
	for _, p := range openai.Phases {
		if counts[p.String()] != want[p.String()] {
			t.Errorf("phase %s: %d samples, want %d", p, counts[p.String()], want[p.String()])
		}
	}
	for kind, n := range map[ConnectionKind]float64{ConnectionNew: 1, ConnectionReused: 1} {
		if got := promtestutil.ToFloat64(c.phases.connections.WithLabelValues("canary", "t", string(kind))); got != n {
			t.Errorf("%s connections: %v, want %v", kind, got, n)
		}
	}
	c.Forget("canary", "t")
	if n := promtestutil.CollectAndCount(c.phases.seconds) + promtestutil.CollectAndCount(c.phases.connections); n != 0 {
		t.Errorf("%d phase series left after Forget", n)
	}
	if strings.Contains(openMetrics(t, reg), `target="t"`) {
		t.Errorf("series of the forgotten pair remain")
	}
}
