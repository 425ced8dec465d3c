package config

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestReconcileKey: cache.reconcile takes auto, true or false; auto
// reconciles where the dialect's engine counts both its cached and its
// prompt tokens; true on a dialect without them is refused, with its path.
func TestReconcileKey(t *testing.T) {
	tests := []struct {
		target  string
		want    Reconcile
		on      bool
		metrics string
		problem string
	}{
		{"{dialect: vllm}", ReconcileAuto, true, "http://h:1/metrics", ""},
		{"{dialect: sglang, cache: {reconcile: auto}}", ReconcileAuto, true, "http://h:1/metrics", ""},
		{"{dialect: llamacpp}", ReconcileAuto, true, "http://h:1/metrics", ""},
		{"{dialect: openai}", ReconcileAuto, false, "http://h:1/metrics", ""},
		{"{dialect: trtllm}", ReconcileAuto, false, "http://h:1/metrics", ""},
		{"{dialect: dynamo}", ReconcileAuto, false, "http://h:1/metrics", ""},
		{"{dialect: vllm, cache: {reconcile: false}}", ReconcileOff, false, "http://h:1/metrics", ""},
		{"{dialect: vllm, cache: {reconcile: true, metrics_url: 'http://m:2/metrics'}}", ReconcileOn, true, "http://m:2/metrics", ""},
		{"{dialect: vllm, cache: {reconcile: true, observed: server_metrics}}", ReconcileOn, true, "http://h:1/metrics", ""},
		{"{dialect: openai, cache: {reconcile: true}}", "", false, "", `targets[0].cache.reconcile: true needs a dialect whose server counts both its cached and its prompt tokens (vllm, sglang, llamacpp), got "openai"`},
		{"{dialect: trtllm, cache: {reconcile: true}}", "", false, "", `targets[0].cache.reconcile: true needs a dialect`},
		{"{dialect: vllm, cache: {reconcile: yes}}", "", false, "", `"yes" is neither auto, true nor false`},
		{"{dialect: vllm, cache: {reconcile: [true]}}", "", false, "", `is neither auto, true nor false`},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			target := strings.Replace(tt.target, "{", "{name: a, url: 'http://h:1/', model: m, ", 1)
			yml := "targets: [" + target + "]\nworkloads: [{name: w, trace: t.jsonl, targets: [a]}]\n"
			cfg, err := Parse([]byte(yml), ".")
			if tt.problem != "" {
				if err == nil || !strings.Contains(err.Error(), tt.problem) {
					t.Fatalf("error %v, want one containing %q", err, tt.problem)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tg := &cfg.Targets[0]
			if tg.Cache.Reconcile != tt.want || tg.Reconciles() != tt.on || tg.EngineMetricsURL() != tt.metrics {
				t.Errorf("reconcile %q, reconciles %v, metrics at %q; want %q, %v, %q",
					tg.Cache.Reconcile, tg.Reconciles(), tg.EngineMetricsURL(), tt.want, tt.on, tt.metrics)
			}
		})
	}
}

// TestReconcileRoundTrip: the value is written back as it was given, and
// auto is left out, so that a configuration without the key keeps its
// fingerprint.
func TestReconcileRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		in   Reconcile
		want string
	}{{ReconcileAuto, "{}\n"}, {"", "{}\n"}, {ReconcileOn, "reconcile: true\n"}, {ReconcileOff, "reconcile: false\n"}} {
		out, err := yaml.Marshal(struct {
			R Reconcile `yaml:"reconcile,omitempty"`
		}{tt.in})
		if err != nil || string(out) != tt.want {
			t.Errorf("Marshal(%q) = %q, %v; want %q", tt.in, out, err, tt.want)
		}
	}
}

// FuzzReconcile: any value of cache.reconcile decodes to one of the three
// or to an error, and a decoded one is written back to itself.
func FuzzReconcile(f *testing.F) {
	for _, s := range []string{"auto", "true", "false", "yes", "'true'", "[1]", "{a: b}", "~", "1", "!!bool true", "&a true"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		var got struct {
			R Reconcile `yaml:"reconcile"`
		}
		if yaml.Unmarshal([]byte("reconcile: "+value+"\n"), &got) != nil {
			return
		}
		switch got.R {
		case "", ReconcileAuto, ReconcileOn, ReconcileOff:
		default:
			t.Fatalf("%q decoded to %q", value, got.R)
		}
		out, err := yaml.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		var back struct {
			R Reconcile `yaml:"reconcile"`
		}
		if err := yaml.Unmarshal(out, &back); err != nil || back.R.IsZero() != got.R.IsZero() || !back.R.IsZero() && back.R != got.R {
			t.Fatalf("%q: %q written as %q read back as %q (%v)", value, got.R, out, back.R, err)
		}
	})
}
