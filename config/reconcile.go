package config

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// Reconcile says whether a target's engine counters are read beside the
// responses' usage, to compare the two (targets[].cache.reconcile).
type Reconcile string

// The values of cache.reconcile. The zero value is ReconcileAuto.
const (
	// ReconcileAuto reads the counters where the dialect's engine has
	// them; a page that does not answer is counted and otherwise quiet.
	ReconcileAuto Reconcile = "auto"
	ReconcileOn   Reconcile = "true"
	ReconcileOff  Reconcile = "false"
)

// UnmarshalYAML takes auto, true or false; anything else is a type
// error, so that decoding goes on and every other problem is reported too.
func (r *Reconcile) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == string(ReconcileAuto) {
		*r = ReconcileAuto
		return nil
	}
	var on bool
	// Only YAML's own booleans: yes and on would read as true here and as
	// strings elsewhere.
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&on) != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %q is neither auto, true nor false", n.Line, n.Value)}}
	}
	*r = ReconcileOff
	if on {
		*r = ReconcileOn
	}
	return nil
}

// MarshalYAML writes the value back in the same form.
func (r Reconcile) MarshalYAML() (any, error) {
	switch r {
	case ReconcileOn:
		return true, nil
	case ReconcileOff:
		return false, nil
	}
	return string(ReconcileAuto), nil
}

// IsZero makes omitempty leave out an auto value.
func (r Reconcile) IsZero() bool { return r == "" || r == ReconcileAuto }

// Reconciles tells whether t's engine counters are read for the
// reconciliation: always with true (Validate makes sure the dialect has
// them), where the dialect's engine counts both its cached and its
// prompt tokens with auto.
func (t *Target) Reconciles() bool {
	switch t.Cache.Reconcile {
	case ReconcileOn:
		return true
	case ReconcileOff:
		return false
	}
	return engine.For(t.Dialect).CountsPromptTokens()
}

// EngineMetricsURL is where t's engine counters are read: cache.metrics_url,
// else the target's url with /metrics; empty for an emulated engine, whose
// address the daemon knows.
func (t *Target) EngineMetricsURL() string {
	if t.Cache.MetricsURL != "" || t.URL == "" {
		return t.Cache.MetricsURL
	}
	return strings.TrimSuffix(t.URL, "/") + "/metrics"
}

// validateReconcile checks cache.reconcile: true needs both of the
// engine's counters, the share of its traffic being unknowable otherwise.
func validateReconcile(t *Target, p string, bad func(string, string, ...any)) {
	if t.Cache.Reconcile == ReconcileOn && !engine.For(t.Dialect).CountsPromptTokens() {
		bad(p+".cache.reconcile", "true needs a dialect whose server counts both its cached and its prompt tokens (%s), got %q",
			joinValues(engine.CountingPromptTokens()), t.Dialect)
	}
}
