// Package servedcache is the accounting of what an engine's cache served,
// beside the theoretical cache of package idealcache. It holds every
// judgement of the observed side, so that the collector only adds up and
// exports what it is handed:
//
//   - Truth, the cache-truth step in front of the collector: how each
//     response's cached tokens count, the always-cached preamble left out,
//     and a replica's share of the engine's own cached-token counter;
//   - Reconciliation: per target, the engine's own counters set beside its
//     responses and the model (cache.reconcile), and the state that says
//     whether they can be compared;
//   - EffectiveCapacity: per (workload, target), the LRU capacity whose
//     theoretical hits equal what the engine served;
//   - CostWindows: per (workload, target), the sliding window of requests
//     that package costfit fits the cost of a cached prompt token on.
//
// Nothing here registers a metric: each part returns figures, and the
// collector owns the descriptors.
package servedcache
