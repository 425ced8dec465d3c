package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestKVEventsKeys: cache.kv_events takes one endpoint or a list, and a
// bad endpoint (or emulate key) is refused, named by its key.
func TestKVEventsKeys(t *testing.T) {
	parse := func(target string) (*Config, error) {
		data := fmt.Sprintf("targets:\n  - {name: t, %s}\nworkloads:\n  - {name: w, trace: x.jsonl, targets: [t]}\n", target)
		return Parse([]byte(data), t.TempDir())
	}
	for _, c := range []struct {
		target string
		want   Endpoints
	}{
		{"url: 'http://e:8000', model: m, cache: {kv_events: 'tcp://e:5557'}", Endpoints{"tcp://e:5557"}},
		{"url: 'http://r:8000', model: m, cache: {kv_events: ['tcp://a:5557', 'tcp://b:5557'], kv_events_max_blocks: 65536}", Endpoints{"tcp://a:5557", "tcp://b:5557"}},
	} {
		cfg, err := parse(c.target)
		if err != nil {
			t.Fatalf("%s: %v", c.target, err)
		}
		if got := cfg.Targets[0].Cache.KVEvents; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.target, got, c.want)
		}
	}
	for _, c := range []struct{ target, want string }{
		{"url: 'http://e:8000', model: m, cache: {kv_events: 'tcp://engine'}", "targets[0].cache.kv_events:"},
		{"url: 'http://e:8000', model: m, cache: {kv_events: 'tcp://e:0'}", "a host and a port"},
		{"url: 'http://e:8000', model: m, cache: {kv_events: ['tcp://a:1', 'tcp://a:1']}", "targets[0].cache.kv_events[1]: \"tcp://a:1\" is listed twice"},
		{"url: 'http://e:8000', model: m, cache: {kv_events: 'ipc:///x'}", "only tcp://host:port"},
		{"emulate: {kv_events: 'engine:1'}", "targets[0].emulate.kv_events:"},
		{"emulate: {kv_events_format: json}", "targets[0].emulate.kv_events_format:"},
		{"url: 'http://e:8000', model: m, cache: {kv_events: 'tcp://e:1', kv_events_max_blocks: -1}", "targets[0].cache.kv_events_max_blocks: -1 is not between 1 and 16777216"},
		{"url: 'http://e:8000', model: m, cache: {kv_events: 'tcp://e:1', kv_events_max_blocks: 16777217}", "targets[0].cache.kv_events_max_blocks: 16777217 is not"},
	} {
		if _, err := parse(c.target); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.target, err, c.want)
		}
	}
}
