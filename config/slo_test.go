package config

import (
	"strings"
	"testing"
	"time"
)

func TestSLOAndAbandonKeys(t *testing.T) {
	tests := []struct {
		name, workload string
		want           string // a problem the error must name; "" means valid
	}{
		{"slo every threshold", `slo: {ttft: 2s, inter_token: 50ms, request: 30s, objective: 0.99}`, ""},
		{"slo objective only", `slo: {objective: 0.9}`, ""},
		{"slo objective missing", `slo: {ttft: 2s}`, "workloads[0].slo.objective: must be above 0 and below 1"},
		{"slo objective one", `slo: {objective: 1}`, "workloads[0].slo.objective: must be above 0 and below 1"},
		{"slo threshold above a day", `slo: {request: 25h, objective: 0.99}`, "workloads[0].slo.request: must be from 0 (not judged) to 1d"},
		{"abandon after tokens", `abandon: {share: 0.5, after_tokens: 2}`, ""},
		{"abandon after", `abandon: {share: 1, after: 500ms}`, ""},
		{"abandon both", `abandon: {share: 0.5, after_tokens: 2, after: 1s}`, "workloads[0].abandon: after_tokens and after exclude each other"},
		{"abandon neither", `abandon: {share: 0.5}`, "workloads[0].abandon: after_tokens or after is required"},
		{"abandon share zero", `abandon: {share: 0, after_tokens: 2}`, "workloads[0].abandon.share: must be above 0 and at most 1"},
		{"abandon share above one", `abandon: {share: 1.5, after_tokens: 2}`, "workloads[0].abandon.share"},
		{"abandon after above a day", `abandon: {share: 0.5, after: 2d}`, "workloads[0].abandon.after: must be at most 1d, got 2d"},
		{"abandon negative tokens", `abandon: {share: 0.5, after_tokens: -1}`, "workloads[0].abandon.after_tokens: must be from 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(`
targets:
  - {name: t, url: "http://t:8000", model: m}
workloads:
  - {name: w, trace: t.jsonl, targets: [t], `+tt.workload+`}
`), t.TempDir())
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Parse: %v\nwant a problem containing %q (config %+v)", err, tt.want, cfg)
			}
		})
	}
}

func TestSLOValuesRead(t *testing.T) {
	cfg, err := Parse([]byte(`
targets:
  - {name: t, url: "http://t:8000", model: m}
workloads:
  - {name: w, trace: t.jsonl, targets: [t], slo: {ttft: 2s, inter_token: 50ms, objective: 0.99}, abandon: {share: 0.25, after: 1500ms}}
  - {name: plain, trace: t.jsonl, targets: [t]}
`), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Workloads[0]
	if want := (SLO{TTFT: Duration(2 * time.Second), InterToken: Duration(50 * time.Millisecond), Objective: 0.99}); w.SLO == nil || *w.SLO != want {
		t.Errorf("slo = %+v, want %+v", w.SLO, want)
	}
	if want := (Abandon{Share: 0.25, After: Duration(1500 * time.Millisecond)}); w.Abandon == nil || *w.Abandon != want {
		t.Errorf("abandon = %+v, want %+v", w.Abandon, want)
	}
	if cfg.Workloads[1].SLO != nil || cfg.Workloads[1].Abandon != nil {
		t.Errorf("a workload without slo or abandon has %+v, %+v", cfg.Workloads[1].SLO, cfg.Workloads[1].Abandon)
	}
}
