package config

import (
	"strings"
	"testing"
)

// TestUnknownKeySuggestions: an unknown key names the closest valid key of
// its place when one is a typo away, and none otherwise.
func TestUnknownKeySuggestions(t *testing.T) {
	const base = "targets:\n  - name: t\n    url: http://x\n%s\nworkloads:\n  - name: w\n    trace: t.jsonl\n    targets: [t]\n%s\n"
	tests := []struct {
		target, workload string
		want             string
	}{
		{"", "    max_inflight: 3", `workloads[0]: unknown key "max_inflight" (line 9); did you mean "max_in_flight"?`},
		{"", "    Seed: 3", `workloads[0]: unknown key "Seed" (line 9); did you mean "seed"?`},
		{"", "    lopo: once", `workloads[0]: unknown key "lopo" (line 9); did you mean "loop"?`},
		{"    modle: m", "", `targets[0]: unknown key "modle" (line 4); did you mean "model"?`}, //nolint:misspell // the typo is the input
		{"    cache: {capacity_block: 3}", "", `targets[0].cache: unknown key "capacity_block" (line 4); did you mean "capacity_blocks"?`},
		{"", "    synthesis: {speedup: 2}", `workloads[0].synthesis: unknown key "speedup" (line 9); did you mean "speedup_ratio"?`},
		{"", "    synthesis: {max: 2}", `workloads[0].synthesis: unknown key "max" (line 9)`},
		{"", "    replicas: 3", `workloads[0]: unknown key "replicas" (line 9)`},
		{"", "    x: 3", `workloads[0]: unknown key "x" (line 9)`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			yml := strings.Replace(strings.Replace(base, "%s", tt.target, 1), "%s", tt.workload, 1)
			_, err := Parse([]byte(yml), "")
			if err == nil {
				t.Fatal("no error")
			}
			// The first problem; what follows from the unknown key (a
			// required key missing) comes after it.
			if got, _, _ := strings.Cut(err.Error(), "\n"); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestEditDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"a", "", 1}, {"max_inflight", "max_in_flight", 1}, {"cahce", "cache", 1},
		{"kitten", "sitting", 3}, {"seed", "speedup", 3},
	} {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
