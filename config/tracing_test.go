package config

import (
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// TestTracingKey: the tracing key's defaults and its problems.
func TestTracingKey(t *testing.T) {
	const head = "targets:\n  - {name: t, url: http://t:8000, model: m}\nworkloads:\n  - {name: w, trace: x.jsonl, targets: [t]}\n"
	tests := []struct {
		name    string
		yaml    string
		want    tracing.Config
		problem string // "" means valid
	}{
		{"absent", "", tracing.Config{SampleRatio: 1}, ""},
		{"endpoint only", "tracing: {endpoint: http://otel:4318/v1/traces}\n", tracing.Config{Endpoint: "http://otel:4318/v1/traces", SampleRatio: 1}, ""},
		{"ratio only", "tracing: {sample_ratio: 0.25}\n", tracing.Config{SampleRatio: 0.25}, ""},
		{"ratio zero", "tracing: {endpoint: https://otel/v1/traces, sample_ratio: 0}\n", tracing.Config{Endpoint: "https://otel/v1/traces"}, ""},
		{"ratio above one", "tracing: {sample_ratio: 1.5}\n", tracing.Config{}, "tracing.sample_ratio: 1.5: want a number from 0 to 1"},
		{"ratio negative", "tracing: {sample_ratio: -0.1}\n", tracing.Config{}, "tracing.sample_ratio: -0.1: want a number from 0 to 1"},
		{"grpc scheme", "tracing: {endpoint: grpc://otel:4317}\n", tracing.Config{}, "tracing.endpoint: grpc://otel:4317: scheme must be http or https (OTLP over HTTP)"},
		{"no host", "tracing: {endpoint: 'http:///v1/traces'}\n", tracing.Config{}, "tracing.endpoint: http:///v1/traces: has no host"},
		{"unknown key", "tracing: {endpoint: http://otel:4318/v1/traces, insecure: true}\n", tracing.Config{}, "insecure"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(head+tt.yaml), t.TempDir())
			if tt.problem != "" {
				if err == nil || !strings.Contains(err.Error(), tt.problem) {
					t.Fatalf("Parse: %v, want a problem with %q", err, tt.problem)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Tracing.Config(); got != tt.want {
				t.Errorf("tracing %+v, want %+v", got, tt.want)
			}
		})
	}
}
