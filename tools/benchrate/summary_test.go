package main

import (
	"math"
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
	// p99 ms, the rate achieved and the rows dropped.
	run := func(cpu, p99, achieved, dropped float64) *outcome {
		return &outcome{sent: 1000, toolCPU: cpu, p99: time.Duration(p99 * float64(time.Millisecond)), achieved: achieved, dropped: dropped}
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
