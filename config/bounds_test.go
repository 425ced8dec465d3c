package config

import (
	"strings"
	"testing"
)

// TestBounds: a value that would take the daemon past a bound at start
// (a slice of 2^60 prefixes, rows of billions of hash ids, 5e8 in-flight
// slots, a prompt no request may hold, a schedule past the replay's time
// axis) is refused by validation, named by its YAML path, before
// anything is generated or started; values at the bounds pass.
func TestBounds(t *testing.T) {
	const head = "targets:\n  - {name: t, url: http://t:8000, model: m}\nworkloads:\n  - name: w\n    targets: [t]\n"
	// gen is a workload generating its rows, with fields (key: value
	// pairs, ";"-separated) over a small valid generator.
	gen := func(block, fields string) string {
		keys := []string{"prefixes", "prefix_tokens", "requests", "input_tokens", "output_tokens", "rate"}
		values := map[string]string{"prefixes": "4", "prefix_tokens": "100", "requests": "100",
			"input_tokens": "{mean: 10}", "output_tokens": "{mean: 10}", "rate": "1"}
		for _, f := range strings.Split(fields, ";") {
			k, v, _ := strings.Cut(f, ":")
			k = strings.TrimSpace(k)
			if _, ok := values[k]; !ok {
				keys = append(keys, k)
			}
			values[k] = strings.TrimSpace(v)
		}
		y := head + "    block_size: " + block + "\n    generate:\n"
		for _, k := range keys {
			y += "      " + k + ": " + values[k] + "\n"
		}
		return y
	}
	tr := func(fields string) string { return head + "    trace: t.jsonl\n" + fields }
	for _, tc := range []struct {
		name, yaml string
		path       string // the YAML path refused; "" for a valid config
	}{
		{"prefixes 2^60", gen("16", "prefixes: 1152921504606846976"), "workloads[0].generate.prefixes"},
		{"prefixes 2^33", gen("16", "prefixes: 8589934592"), "workloads[0].generate.prefixes"},
		{"16M-token prefixes in 1-token blocks", gen("1", "prefix_tokens: 16000000; requests: 200"), "workloads[0].generate.requests"},
		{"a prefix past a request", gen("1048576", "prefix_tokens: 20000000; requests: 3"), "workloads[0].generate.prefix_tokens"},
		{"an input past a request", gen("1048576", "input_tokens: {mean: 6e8}; requests: 3"), "workloads[0].generate.input_tokens.mean"},
		{"an output past a request", gen("1048576", "output_tokens: {mean: 2e7}; requests: 3"), "workloads[0].generate.output_tokens.mean"},
		{"output draws past a request", gen("1048576", "output_tokens: {mean: 1000, stddev: 1e300}; requests: 3"), "workloads[0].generate.output_tokens.stddev"},
		{"turns grow past a request", gen("1048576", "input_tokens: {mean: 536870912}; turns: 3; requests: 3"), "workloads[0].generate.input_tokens.mean"},
		{"a rate past the time axis", gen("16", "rate: 1e-300; requests: 3"), "workloads[0].generate.rate"},
		{"a speed-up past the time axis", gen("16", "rate: 0.000001; requests: 10") + "    synthesis: {speedup_ratio: 0.01}\n", "workloads[0].synthesis.speedup_ratio"},
		{"a prompt multiplier past a request", gen("16", "input_tokens: {mean: 1000}; requests: 3") + "    synthesis: {prompt_len_multiplier: 100000}\n", "workloads[0].synthesis.prompt_len_multiplier"},
		{"a prompt multiplier capped by max_isl", gen("16", "input_tokens: {mean: 1000}; requests: 3") + "    synthesis: {prompt_len_multiplier: 100000, max_isl: 32000}\n", ""},
		{"a prefix multiplier past a request", gen("16", "prefix_tokens: 1000; requests: 3") + "    synthesis: {prefix_len_multiplier: 100000}\n", "workloads[0].synthesis.prefix_len_multiplier"},
		{"an output multiplier past a request", gen("16", "output_tokens: {mean: 1000}; requests: 3") + "    synthesis: {output_len_multiplier: 10000000}\n", "workloads[0].synthesis.output_len_multiplier"},
		{"generate at its bounds", gen("1", "prefixes: 134217728; prefix_tokens: 1000; input_tokens: {mean: 23}; output_tokens: {mean: 1}; requests: 65536"), ""},
		{"max_in_flight 5e8", tr("    max_in_flight: 500000000\n"), "workloads[0].max_in_flight"},
		{"users 5e8", tr("    max_in_flight: 500000000\n    schedule: {users: 500000000}\n"), "workloads[0].schedule.users"},
		{"max_in_flight and users at the bound", tr("    max_in_flight: 65536\n    schedule: {users: 65536}\n"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "")
			if tc.path == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains("\n"+err.Error(), "\n"+tc.path+": ") {
				t.Errorf("no problem at %s in:\n%v", tc.path, err)
			}
			if strings.Contains(err.Error(), "{") {
				t.Errorf("a Go value in the message:\n%v", err)
			}
		})
	}
}
