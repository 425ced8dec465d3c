package config

import (
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// TestScheduleKeys: a workload's schedule, prompts and a target's session
// header are read with their defaults, and the schedule reaches the replay
// seeded only where it draws at random.
func TestScheduleKeys(t *testing.T) {
	cfg, err := Parse([]byte(`
targets:
  - {name: t, url: "http://t:8000", model: m, session_header: X-Session-ID}
workloads:
  - {name: poisson, trace: t.jsonl, targets: [t], seed: 7, schedule: {rate: 5}}
  - {name: constant, trace: t.jsonl, targets: [t], seed: 7, schedule: {rate: 2.5, arrivals: constant}}
  - {name: users, trace: t.jsonl, targets: [t], seed: 7, schedule: {users: 8, think_time: 250ms}}
  - {name: timestamps, trace: t.jsonl, targets: [t], loop: once, prompts: {reproducible: true}}
`), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Targets[0].SessionHeader; got != "X-Session-ID" {
		t.Errorf("session_header = %q", got)
	}
	for i, want := range []replay.Schedule{
		{Rate: 5, Arrivals: replay.ArrivalsPoisson, Seed: 7},
		{Rate: 2.5, Arrivals: replay.ArrivalsConstant},
		{Users: 8, ThinkTime: 250 * time.Millisecond},
		{},
	} {
		w := &cfg.Workloads[i]
		if got := w.Schedule.Replay(w.Seed); got != want {
			t.Errorf("%s: schedule %+v, want %+v", w.Name, got, want)
		}
	}
	if !cfg.Workloads[3].Prompts.Reproducible || cfg.Workloads[0].Prompts.Reproducible {
		t.Errorf("prompts.reproducible not read: %+v, %+v", cfg.Workloads[3].Prompts, cfg.Workloads[0].Prompts)
	}
}
