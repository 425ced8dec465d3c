package replay

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// BenchmarkDispatchClock replays two seconds of evenly spaced 32-token
// requests per iteration against a local SSE server, as
// BenchmarkDispatchLag does, once on the runtime's timers and once on
// preciseTimer (SystemClock), and reports the schedule lag percentiles and
// the process's CPU per request: the accuracy preciseTimer buys and what
// it costs.
func BenchmarkDispatchClock(b *testing.B) {
	for _, rate := range []int{1000, 5000} {
		for _, clk := range []struct {
			name  string
			clock DispatchClock
		}{{"runtime", runtimeDispatchClock{}}, {"precise", SystemClock()}} {
			b.Run(fmt.Sprintf("rps=%d/clock=%s", rate, clk.name), func(b *testing.B) {
				benchDispatch(b, rate, clk.clock)
			})
		}
	}
}

func benchDispatch(b *testing.B, rate int, clock DispatchClock) {
	srv := wlTestSSEServer()
	defer srv.Close()
	client, err := openai.New(openai.TargetConfig{Name: "bench", URL: srv.URL, Model: "m"})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	n := 2 * rate
	recs := make([]trace.Record, n)
	for i := range recs {
		recs[i] = trace.Record{
			Timestamp:    trace.Ptr(float64(i) * 1000 / float64(rate)),
			InputLength:  trace.Ptr(8),
			OutputLength: trace.Ptr(32),
			Line:         i + 1,
		}
	}
	obs := &wlTestLagObserver{}
	cpu0, cpuOK := testutil.ProcessCPUSeconds()
	b.ResetTimer()
	for range b.N {
		p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce})
		if err != nil {
			b.Fatal(err)
		}
		w, err := NewWorkload(WorkloadConfig{Name: "bench", Target: "bench", MaxInFlight: 1024, Clock: clock},
			p, SendWith(client), wlTestPromptBuilder{}, obs)
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Run(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu1, cpuOK1 := testutil.ProcessCPUSeconds()
	slices.Sort(obs.lags)
	pct := func(q float64) float64 {
		if len(obs.lags) == 0 {
			return 0
		}
		return float64(obs.lags[int(q*float64(len(obs.lags)-1))]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-lag-µs")
	b.ReportMetric(pct(0.99), "p99-lag-µs")
	b.ReportMetric(pct(1), "max-lag-µs")
	b.ReportMetric(float64(obs.dropped), "dropped")
	if cpuOK && cpuOK1 && len(obs.lags) > 0 {
		b.ReportMetric((cpu1-cpu0)/float64(len(obs.lags))*1e6, "cpu-µs/req")
	}
}

// BenchmarkDispatchAlarmSlack: the accuracy and CPU per request of
// preciseTimer for several alarmSlack values.
func BenchmarkDispatchAlarmSlack(b *testing.B) {
	saved := alarmSlack
	defer func() { alarmSlack = saved }()
	for _, rate := range []int{1000, 5000} {
		for _, slack := range []time.Duration{0, 100 * time.Microsecond, 200 * time.Microsecond, 400 * time.Microsecond} {
			b.Run(fmt.Sprintf("rps=%d/slack=%v", rate, slack), func(b *testing.B) {
				alarmSlack = slack
				benchDispatch(b, rate, SystemClock())
			})
		}
	}
}
