package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/kvevents"
)

// noKVEventDialects are the dialects whose engines publish no KV events in
// vLLM's format: llama.cpp and Ollama none at all, TensorRT-LLM its own
// (through its LLM API, not a ZMQ socket).
var noKVEventDialects = []engine.Dialect{engine.DialectLlamaCpp, engine.DialectOllama, engine.DialectTRTLLM}

// Endpoints are the ZMQ endpoints of a target's KV event streams
// (targets[].cache.kv_events): one engine's, or one per replica behind a
// router. YAML takes one endpoint as a string, or a list.
type Endpoints []string

// UnmarshalYAML takes a string or a list of strings.
func (e *Endpoints) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		var s string
		if err := n.Decode(&s); err != nil {
			return err
		}
		*e = Endpoints{s}
		return nil
	}
	var l []string
	if err := n.Decode(&l); err != nil {
		return err
	}
	*e = l
	return nil
}

// MarshalYAML writes one endpoint as a string, several as a list.
func (e Endpoints) MarshalYAML() (any, error) {
	if len(e) == 1 {
		return e[0], nil
	}
	return []string(e), nil
}

// validateKVEvents checks a target's KV event keys: the streams it
// subscribes to, and the endpoint its emulated engine publishes on.
func validateKVEvents(t *Target, p string, bad func(string, string, ...any)) {
	seen := map[string]bool{}
	for i, ep := range t.Cache.KVEvents {
		path := endpointPath(p+".cache.kv_events", i, len(t.Cache.KVEvents))
		if _, err := kvevents.Address(ep); err != nil {
			bad(path, "%v", err)
		}
		if seen[ep] {
			bad(path, "%q is listed twice", ep)
		}
		seen[ep] = true
	}
	replays := t.Cache.KVEventsReplayEndpoint
	if len(replays) > 0 && len(replays) != len(t.Cache.KVEvents) {
		bad(p+".cache.kv_events_replay_endpoint", "lists %d endpoints for the %d of cache.kv_events: one an engine, in their order (\"\" for an engine without one)",
			len(replays), len(t.Cache.KVEvents))
	}
	for i, ep := range replays {
		if ep == "" {
			continue
		}
		if _, err := kvevents.Address(ep); err != nil {
			bad(endpointPath(p+".cache.kv_events_replay_endpoint", i, len(replays)), "%v", err)
		}
	}
	if len(t.Cache.KVEvents) > 0 || (t.Emulate != nil && t.Emulate.KVEvents != "") {
		key := p + ".cache.kv_events"
		if len(t.Cache.KVEvents) == 0 {
			key = p + ".emulate.kv_events"
		}
		if t.Cache.Observed != "" && t.Cache.Observed != engine.ObservedUsage {
			bad(key, "explains the hits that each response's usage says were missed, and cache.observed is %s: it needs observed: usage", t.Cache.Observed)
		}
		if slices.Contains(noKVEventDialects, t.Dialect) {
			bad(key, "dialect %s publishes no KV events in vLLM's format (vllm and sglang do)", t.Dialect)
		}
	}
	if n := t.Cache.KVEventsMaxBlocks; n < 0 || n > kvevents.MaxMaxBlocks {
		bad(p+".cache.kv_events_max_blocks", "%d is not between 1 and %d (0 or unset: %d)", n, kvevents.MaxMaxBlocks, kvevents.DefaultMaxBlocks)
	}
	if t.Emulate == nil {
		return
	}
	if f := t.Emulate.KVEventsFormat; f != "" && f != "map" && f != "array" {
		bad(p+".emulate.kv_events_format", "%q is not one of map, array", f)
	}
	if t.Emulate.KVEvents == "" {
		return
	}
	// The emulated engine binds it: port 0 picks one.
	addr, ok := strings.CutPrefix(t.Emulate.KVEvents, "tcp://")
	if _, _, err := net.SplitHostPort(addr); !ok || err != nil {
		bad(p+".emulate.kv_events", "%q is not tcp://host:port", t.Emulate.KVEvents)
	}
}

// endpointPath names the i-th of n endpoints under key: the key alone
// when it holds one.
func endpointPath(key string, i, n int) string {
	if n == 1 {
		return key
	}
	return fmt.Sprintf("%s[%d]", key, i)
}

// validateKVEventsAcross refuses one engine's event stream followed by two
// targets (or twice by one), however its endpoint is written: its blocks
// would be counted as two engines'.
func validateKVEventsAcross(c *Config, bad func(string, string, ...any)) {
	type listed struct {
		path, raw string
		target    int
	}
	first := map[string]listed{} // by canonical endpoint
	for i := range c.Targets {
		t := &c.Targets[i]
		for j, ep := range t.Cache.KVEvents {
			canon, ok := canonicalEndpoint(ep)
			if !ok {
				continue // refused on its own
			}
			path := endpointPath(fmt.Sprintf("targets[%d].cache.kv_events", i), j, len(t.Cache.KVEvents))
			prev, dup := first[canon]
			switch {
			case !dup:
				first[canon] = listed{path, ep, i}
			case prev.target == i && prev.raw == ep:
				// Listed twice as such: validateKVEvents says so.
			default:
				bad(path, "%q is the stream of %s (%q), written another way: one engine's events followed twice", ep, prev.path, prev.raw)
			}
		}
	}
}

// canonicalEndpoint is one form of a tcp://host:port endpoint for every
// way of writing it: a host name in lower case without its final dots,
// every loopback address (localhost, 127.0.0.0/8, ::1) as one, an
// address in its shortest form, the port as a number.
func canonicalEndpoint(ep string) (string, bool) {
	addr, err := kvevents.Address(ep)
	if err != nil {
		return "", false
	}
	host, port, _ := net.SplitHostPort(addr)
	host = strings.ToLower(host)
	if h := strings.TrimRight(host, "."); h != "" {
		host = h
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		host = ip.WithZone("").String()
		if ip.IsLoopback() {
			host = "localhost"
		}
	}
	if n, err := strconv.ParseUint(port, 10, 16); err == nil {
		port = strconv.FormatUint(n, 10)
	}
	return net.JoinHostPort(host, port), true
}
