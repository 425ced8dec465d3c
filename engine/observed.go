package engine

// Observed is where a target's observed cached tokens come from
// (target.cache.observed).
type Observed string

// The sources of observed cached tokens.
const (
	ObservedUsage         Observed = "usage"          // each response's usage
	ObservedServerMetrics Observed = "server_metrics" // the engine's own counter on its /metrics
	ObservedNone          Observed = "none"
)

// ObservedSources lists every source.
var ObservedSources = [...]Observed{ObservedUsage, ObservedServerMetrics, ObservedNone}
