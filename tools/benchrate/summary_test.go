package main

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestSpreadOf(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want spread
	}{
		{"odd", []float64{3, 1, 2}, spread{median: 2, lo: 1, hi: 3, n: 3}},
		{"even", []float64{4, 1, 3, 2}, spread{median: 2.5, lo: 1, hi: 4, n: 4}},
		{"NaN left out", []float64{math.NaN(), 5, 1}, spread{median: 3, lo: 1, hi: 5, n: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := spreadOf(tt.in); got != tt.want {
				t.Errorf("spreadOf(%v) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
	if got := spreadOf(nil); got.n != 0 || !math.IsNaN(got.median) {
		t.Errorf("spreadOf(nil) = %+v, want no figures", got)
	}
}

func TestSummarize(t *testing.T) {
	// run is one tool's run of 1,000 requests: cpu CPU-seconds, a p99 of
	// p99 ms at the sink, the rate achieved and the rows dropped.
	run := func(cpu, p99, achieved, dropped float64) *outcome {
		lag := time.Duration(p99 * float64(time.Millisecond))
		// The tool's own p99 is the opposite of the sink's: only the
		// sink's may decide.
		return &outcome{sent: 1000, toolCPU: cpu, sinkP99: lag, p99: 10*time.Millisecond - lag, achieved: achieved, dropped: dropped}
	}
	tests := []struct {
		name      string
		rounds    []pairedRound
		wantRatio float64
		verdict   string
	}{
		{"under on every figure", []pairedRound{
			{run(0.9, 0.1, 1000, 0), run(1.0, 1.0, 1000, 0)},
			{run(1.0, 0.2, 1000, 0), run(1.0, 1.0, 1000, 0)},
			{run(1.2, 0.1, 1000, 0), run(1.0, 1.0, 1000, 0)},
		}, 1.0, "yes"},
		{"one round over does not decide", []pairedRound{
			{run(0.9, 0.1, 1000, 0), run(1.0, 1.0, 1000, 0)},
			{run(1.5, 3.0, 1000, 0), run(1.0, 1.0, 1000, 0)},
			{run(0.8, 0.1, 1000, 0), run(1.0, 1.0, 1000, 0)},
		}, 0.9, "yes"},
		{"the ratio is taken within each round", []pairedRound{
			{run(2.0, 0.1, 1000, 0), run(2.2, 1.0, 1000, 0)},
			{run(1.0, 0.1, 1000, 0), run(1.1, 1.0, 1000, 0)},
			{run(1.0, 0.1, 1000, 0), run(1.05, 1.0, 1000, 0)},
		}, 1 / 1.1, "yes"},
		{"over on CPU and lag", []pairedRound{
			{run(1.1, 2.0, 1000, 0), run(1.0, 1.0, 1000, 0)},
			{run(1.2, 2.0, 1000, 0), run(1.0, 1.0, 1000, 0)},
		}, 1.15, "no: CPU, lag p99"},
		{"a dropped row in one round fails", []pairedRound{
			{run(0.9, 0.1, 1000, 0), run(1.0, 1.0, 1000, 0)},
			{run(0.9, 0.1, 1000, 1), run(1.0, 1.0, 1000, 0)},
		}, 0.9, "no: dropped requests"},
		{"vegeta's unsent requests do not decide", []pairedRound{
			{run(0.9, 0.1, 1000, 0), run(1.0, 1.0, 1000, 500)},
		}, 0.9, "yes"},
		{"a tenth of a request a second is the clock's", []pairedRound{
			{run(0.9, 0.1, 999.96, 0), run(1.0, 1.0, 1000.1, 0)},
		}, 0.9, "yes"},
		{"more than the rate asked is not more", []pairedRound{
			{run(0.9, 0.1, 1000.2, 0), run(1.0, 1.0, 1001.3, 0)},
		}, 0.9, "yes"},
		{"a lower rate fails", []pairedRound{
			{run(0.9, 0.1, 989, 0), run(1.0, 1.0, 1000, 0)},
		}, 0.9, "no: achieved rate"},
		{"a round missing a tool is left out", []pairedRound{
			{run(0.9, 0.1, 1000, 0), nil},
			{nil, run(1.0, 1.0, 1000, 0)},
		}, math.NaN(), "no paired round"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := summarize(1000, tt.rounds)
			if got := m.cpuRatio.median; math.Abs(got-tt.wantRatio) > 1e-9 && !(math.IsNaN(got) && math.IsNaN(tt.wantRatio)) {
				t.Errorf("CPU ratio median %v, want %v", got, tt.wantRatio)
			}
			if got := m.verdict(); got != tt.verdict {
				t.Errorf("verdict %q, want %q", got, tt.verdict)
			}
		})
	}
}

func TestSummarizeCountsBothToolsUnsent(t *testing.T) {
	k := &outcome{sent: 1000, toolCPU: 1, achieved: 1000, dropped: 2}
	v := &outcome{sent: 600, toolCPU: 1, achieved: 600, dropped: 400}
	m := summarize(1000, []pairedRound{{k, v}, {k, v}})
	if m.dropped != 4 || m.vegetaDropped != 800 {
		t.Errorf("dropped %v / %v, want 4 / 800", m.dropped, m.vegetaDropped)
	}
}

func TestNeverSent(t *testing.T) {
	tests := []struct {
		rate int
		dur  time.Duration
		sent int64
		want float64
	}{
		{5000, 10 * time.Second, 50000, 0},
		{5000, 10 * time.Second, 13566, 36434},
		{5000, 10 * time.Second, 50003, 0}, // a hit more than asked is not a negative shortfall
		{1000, 1500 * time.Millisecond, 1000, 500},
	}
	for _, tt := range tests {
		if got := neverSent(tt.rate, tt.dur, tt.sent); got != tt.want {
			t.Errorf("neverSent(%d, %v, %d) = %v, want %v", tt.rate, tt.dur, tt.sent, got, tt.want)
		}
	}
}

func TestMachineNote(t *testing.T) {
	// round pairs a kvload and a vegeta run, each with the machine's busy
	// share of the machine the sink and the tool used.
	round := func(kvloadBusy, vegetaBusy float64) pairedRound {
		k := &outcome{sent: 1000, toolCPU: 1, achieved: 1000, machineBusy: kvloadBusy}
		v := &outcome{sent: 1000, toolCPU: 1, achieved: 1000, machineBusy: vegetaBusy}
		return pairedRound{k, v}
	}
	tests := []struct {
		name     string
		rounds   []pairedRound
		wantNote bool
	}{
		{"an idle machine", []pairedRound{round(0.3, 0.3), round(0.4, 0.35)}, false},
		{"full during kvload's runs", []pairedRound{round(0.9, 0.7), round(0.92, 0.75), round(0.5, 0.7)}, true},
		{"full during vegeta's runs", []pairedRound{round(0.6, 0.85), round(0.6, 0.9)}, true},
		{"one full round does not decide", []pairedRound{round(0.95, 0.95), round(0.4, 0.4), round(0.5, 0.5)}, false},
		{"busy share unknown", []pairedRound{round(math.NaN(), math.NaN())}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := summarize(5000, tt.rounds)
			if got := m.machineNote() != ""; got != tt.wantNote {
				t.Errorf("note %q, want one: %v", m.machineNote(), tt.wantNote)
			}
			if m.verdict() != "yes" {
				t.Errorf("verdict %q: the machine's load must not change it", m.verdict())
			}
		})
	}
}

func TestMachineShare(t *testing.T) {
	tests := []struct {
		name string
		cpu  float64
		cpus int
		wall time.Duration
		want float64
	}{
		{"both CPUs full", 20, 2, 10 * time.Second, 1},
		{"a quarter of four", 10, 4, 10 * time.Second, 0.25},
		{"no time", 1, 2, 0, math.NaN()},
		{"no CPU", 1, 0, time.Second, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := machineShare(tt.cpu, tt.cpus, tt.wall)
			if !(got == tt.want || math.IsNaN(got) && math.IsNaN(tt.want)) {
				t.Errorf("machineShare(%v, %d, %v) = %v, want %v", tt.cpu, tt.cpus, tt.wall, got, tt.want)
			}
		})
	}
}

func TestArrivalLag(t *testing.T) {
	const rate = 1000 // a slot every millisecond
	ms := func(xs ...float64) []time.Duration {
		d := make([]time.Duration, len(xs))
		for i, x := range xs {
			d[i] = time.Duration(x * float64(time.Millisecond))
		}
		return d
	}
	tests := []struct {
		name     string
		times    []time.Duration
		p50, p99 time.Duration
	}{
		{"on time, from any origin", ms(5, 6, 7, 8, 9), 0, 0},
		{"order does not matter", ms(9, 5, 7, 6, 8), 0, 0},
		{"all late alike is on time", ms(5.3, 6.3, 7.3), 0, 0},
		// Offsets 0, 0, 0, 2.5: the p99 of four is the third smallest.
		{"one late in four", ms(0, 1, 2, 5.5), 0, 0},
		// Offsets 0, 0.5, 0.5, 0.5, 0.5 against the best-kept first.
		{"all but the first late", ms(0, 1.5, 2.5, 3.5, 4.5), 500 * time.Microsecond, 500 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p50, p99 := arrivalLag(tt.times, rate)
			if p50 != tt.p50 || p99 != tt.p99 {
				t.Errorf("arrivalLag = p50 %v p99 %v, want %v %v", p50, p99, tt.p50, tt.p99)
			}
		})
	}
}

func TestArrivalRate(t *testing.T) {
	every := func(n int, gap time.Duration) []time.Duration {
		d := make([]time.Duration, n)
		for i := range d {
			d[i] = time.Duration(i) * gap
		}
		return d
	}
	lateLast := every(5000, 200*time.Microsecond)
	lateLast[len(lateLast)-1] += 5 * time.Millisecond
	halfRate := every(5000, 400*time.Microsecond)
	tests := []struct {
		name  string
		times []time.Duration
		want  float64
	}{
		{"evenly spaced", every(5000, 200*time.Microsecond), 5000},
		{"the last one late does not make a lower rate", lateLast, 5000},
		{"a rate not held is seen", halfRate, 2500},
		{"one arrival has no rate", every(1, time.Millisecond), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := arrivalRate(tt.times); math.Round(got) != tt.want {
				t.Errorf("arrivalRate = %.3f, want %v", got, tt.want)
			}
		})
	}
}

func TestCheckRunSize(t *testing.T) {
	tests := []struct {
		name  string
		rates []int
		opt   options
		ok    bool
	}{
		{"the largest run the log holds", []int{20000}, options{dur: 10 * time.Second}, true},
		{"one request more", []int{20001}, options{dur: 10 * time.Second}, false},
		{"a long run at a low rate", []int{1000}, options{dur: 201 * time.Second}, false},
		{"the storm's rate counts when there is a storm", []int{1000}, options{dur: 10 * time.Second, storm: 1, stormRate: 30000}, false},
		{"and not without one", []int{1000}, options{dur: 10 * time.Second, stormRate: 30000}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkRunSize(tt.rates, tt.opt); (err == nil) != tt.ok {
				t.Errorf("checkRunSize(%v) = %v, want ok %v", tt.rates, err, tt.ok)
			}
		})
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	good := options{rounds: 1, rates: "1000", onSaturation: "queue", stream: streamShape{tokens: 32, perWrite: 1}}
	tests := []struct {
		name string
		edit func(*options)
		want string
	}{
		{"no rounds", func(o *options) { o.rounds = 0 }, "-rounds 0"},
		{"a misspelt saturation policy", func(o *options) { o.onSaturation = "Queue" }, `-on-saturation "Queue"`},
		{"no saturation policy", func(o *options) { o.onSaturation = "" }, `-on-saturation ""`},
		{"no tokens", func(o *options) { o.stream.tokens = 0 }, "tokens 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good
			tt.edit(&o)
			err := run(o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run: %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

func TestMedianUpperBound(t *testing.T) {
	// upTo is 1, 2, ..., n in a shuffled order: the bound is its index.
	upTo := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64((i*7)%n + 1)
		}
		return xs
	}
	// The one-sided 95 % bounds of the sign test's tables: the 5th of 5
	// (31/32 = 96.9 %), the 9th of 11, the 12th of 15, the 18th of 25.
	tests := []struct {
		name string
		in   []float64
		want float64
	}{
		{"four are too few", upTo(4), math.NaN()},
		{"five: the largest", upTo(5), 5},
		{"eleven", upTo(11), 9},
		{"fifteen", upTo(15), 12},
		{"twenty-five", upTo(25), 18},
		{"NaN left out", append(upTo(5), math.NaN()), 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := medianUpperBound(tt.in, 0.95)
			if got != tt.want && !(math.IsNaN(got) && math.IsNaN(tt.want)) {
				t.Errorf("medianUpperBound(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestMedianUpperBoundCovers draws rounds from a skewed distribution whose
// median is known and counts how often the bound falls under it: at most 5
// % of the time, and not far under that, or the bound is needlessly loose.
func TestMedianUpperBoundCovers(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const trials, n = 20000, 15
	median := math.Ln2 // of the exponential distribution with mean 1
	missed := 0
	xs := make([]float64, n)
	for range trials {
		for i := range xs {
			xs[i] = rng.ExpFloat64()
		}
		if medianUpperBound(xs, 0.95) < median {
			missed++
		}
	}
	// The 12th of 15 lies under the median with chance P(B >= 12) = 1.76 %.
	if got := float64(missed) / trials; got > 0.05 || got < 0.01 {
		t.Errorf("the bound fell under the median in %.2f %% of %d trials, want about 1.76 %%", 100*got, trials)
	}
}

func TestBoundNote(t *testing.T) {
	// rounds makes one pair a ratio, each tool at the rate where held, at a
	// third of it where not.
	type r struct {
		ratio float64
		held  bool
	}
	summary := func(rs ...r) rateSummary {
		var pairs []pairedRound
		for _, x := range rs {
			vegeta := &outcome{sent: 1000, toolCPU: 1, achieved: 5000}
			if !x.held {
				vegeta.achieved, vegeta.toolCPU = 1700, 4
			}
			pairs = append(pairs, pairedRound{&outcome{sent: 1000, toolCPU: x.ratio * vegeta.toolCPU, achieved: 5000}, vegeta})
		}
		return summarize(5000, pairs)
	}
	tests := []struct {
		name string
		m    rateSummary
		want []string
	}{
		{"shown under", summary(r{0.90, true}, r{0.95, true}, r{0.97, true}, r{0.98, true}, r{0.99, true}),
			[]string{"over 5 paired rounds, the CPU ratio's median is at most 0.99 with 95 % confidence", "By the rounds, kvload-exporter's CPU per request is under vegeta's."}},
		{"one round over leaves it unshown", summary(r{0.90, true}, r{0.95, true}, r{0.97, true}, r{0.98, true}, r{1.01, true}),
			[]string{"at most 1.01", "By the rounds, kvload-exporter's CPU per request is not shown under vegeta's."}},
		{"too few", summary(r{0.9, true}, r{0.9, true}),
			[]string{"not bounded (under 5 rounds)", "Too few of the rounds"}},
		{"rounds behind the rate do not decide", summary(r{0.90, true}, r{0.95, true}, r{0.97, true}, r{0.98, true}, r{1.01, true}, r{0.5, false}, r{0.5, false}),
			[]string{"In the 5 where both tools held the rate (within 1 %), the ratio was 0.97 (0.90–1.01), its median at most 1.01", "By the rounds where both held the rate, kvload-exporter's CPU per request is not shown"}},
		{"few held rounds", summary(r{0.90, true}, r{0.5, false}, r{0.5, false}, r{0.5, false}, r{0.5, false}),
			[]string{"median is at most 0.90", "Too few of the rounds where both held the rate"}},
		{"no round where both held", summary(r{0.5, false}, r{0.5, false}, r{0.5, false}, r{0.5, false}, r{0.5, false}),
			[]string{"median is at most 0.50", "In no round did both tools hold the rate (within 1 %). Too few of the rounds where both held the rate"}},
		{"no round", rateSummary{rate: 5000}, []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.m.boundNote()
			for _, w := range tt.want {
				if w == "" && got != "" || !strings.Contains(got, w) {
					t.Errorf("boundNote() = %q, want it to hold %q", got, w)
				}
			}
		})
	}
}
