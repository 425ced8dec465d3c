package config

import (
	"fmt"
	"net"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/kvevents"
)

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
		path := fmt.Sprintf("%s.cache.kv_events[%d]", p, i)
		if len(t.Cache.KVEvents) == 1 {
			path = p + ".cache.kv_events"
		}
		if _, err := kvevents.Address(ep); err != nil {
			bad(path, "%v", err)
		}
		if seen[ep] {
			bad(path, "%q is listed twice", ep)
		}
		seen[ep] = true
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
