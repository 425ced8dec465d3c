package config

import (
	"strings"
	"testing"
)

// isolationYAML is a configuration of one target, whose cache mapping is
// cache, replayed by one workload.
func isolationYAML(target, cache string) string {
	return "targets:\n  - {name: t, url: 'http://t:8000', model: m, " + target + "cache: " + cache + "}\n" +
		"workloads:\n  - {name: w, trace: t.jsonl, targets: [t]}\n"
}

// TestIsolationAccepted: isolate is taken where the dialect takes a cache
// salt on the target's API, with or without an epoch, and defaults off.
func TestIsolationAccepted(t *testing.T) {
	tests := []struct {
		target, cache string
		isolate       bool
		epoch         string
	}{
		{"dialect: vllm, ", "{}", false, ""},
		{"dialect: vllm, ", "{isolate: true}", true, ""},
		{"dialect: vllm, api: completions, ", "{isolate: true, isolation_epoch: fleet-a}", true, "fleet-a"},
		{"dialect: sglang, api: completions, ", "{isolate: true}", true, ""},
		{"dialect: trtllm, ", "{isolate: true}", true, ""},
		{"dialect: dynamo, ", "{isolate: true, isolation_epoch: '2026-11'}", true, "2026-11"},
	}
	for _, tt := range tests {
		t.Run(tt.target+tt.cache, func(t *testing.T) {
			cfg, err := Parse([]byte(isolationYAML(tt.target, tt.cache)), "")
			if err != nil {
				t.Fatal(err)
			}
			if c := cfg.Targets[0].Cache; c.Isolate != tt.isolate || c.IsolationEpoch != tt.epoch {
				t.Errorf("isolate %v, epoch %q; want %v, %q", c.Isolate, c.IsolationEpoch, tt.isolate, tt.epoch)
			}
		})
	}
}

// TestCheckShardIsolation: run as one of several replicas (--shard), a
// target that isolates with a salt of each start is refused, naming its
// key and line; with an epoch, or as the only replica, it is not.
func TestCheckShardIsolation(t *testing.T) {
	perStart, err := ParseFile("kvload.yml", []byte(isolationYAML("dialect: vllm, ", "{isolate: true}")))
	if err != nil {
		t.Fatal(err)
	}
	err = perStart.CheckShardIsolation(2)
	const want = "kvload.yml: targets[0].cache.isolate: with --shard the 2 replicas build the same prompts and must share a cache salt: set targets[0].cache.isolation_epoch, the same in every replica (line 2)"
	if err == nil || err.Error() != want {
		t.Errorf("CheckShardIsolation(2) = %v,\nwant %s", err, want)
	}
	if err := perStart.CheckShardIsolation(1); err != nil {
		t.Errorf("CheckShardIsolation(1) = %v, want nil", err)
	}
	shared, err := Parse([]byte(isolationYAML("dialect: vllm, ", "{isolate: true, isolation_epoch: fleet}")), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := shared.CheckShardIsolation(3); err != nil {
		t.Errorf("with an epoch: CheckShardIsolation(3) = %v, want nil", err)
	}
}

// TestIsolationFingerprint: a reload that turns isolation on or off, or
// changes the epoch, changes the target's fingerprint, so that its units
// restart with their new salt.
func TestIsolationFingerprint(t *testing.T) {
	caches := []string{"{}", "{isolate: true}", "{isolate: true, isolation_epoch: a}", "{isolate: true, isolation_epoch: b}"}
	seen := map[string]string{}
	for _, c := range caches {
		cfg, err := Parse([]byte(isolationYAML("dialect: vllm, ", c)), "")
		if err != nil {
			t.Fatal(err)
		}
		fp := cfg.Fingerprint("target", "t")
		if other, ok := seen[fp]; ok || fp == "" {
			t.Errorf("cache %s has the fingerprint of %s", c, other)
		}
		seen[fp] = c
		if !strings.Contains(fp, "isolate") && c != "{}" {
			t.Errorf("cache %s: fingerprint %q does not hold it", c, fp)
		}
	}
}
