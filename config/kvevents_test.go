package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/kvevents"
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

// TestKVEventsRefusedWhereUseless: kv_events is refused, naming the key,
// where it cannot work: without each response's usage to say what was
// missed, on a dialect whose engine publishes no events in vLLM's format,
// and for one engine's stream written two ways; the replay endpoints go
// one an engine.
func TestKVEventsRefusedWhereUseless(t *testing.T) {
	parse := func(targets string) error {
		data := fmt.Sprintf("targets:\n%s\nworkloads:\n  - {name: w, trace: x.jsonl, targets: [a]}\n", targets)
		_, err := Parse([]byte(data), t.TempDir())
		return err
	}
	const vllm = "url: 'http://e:8000', model: m, dialect: vllm"
	for _, c := range []struct{ targets, want string }{
		{"  - {name: a, " + vllm + ", cache: {kv_events: 'tcp://e:1', observed: server_metrics, metrics_url: 'http://e:8000/metrics'}}",
			"targets[0].cache.kv_events: explains the hits that each response's usage says were missed, and cache.observed is server_metrics"},
		{"  - {name: a, " + vllm + ", cache: {kv_events: 'tcp://e:1', observed: none}}", "targets[0].cache.kv_events: explains"},
		{"  - {name: a, url: 'http://e:8000', model: m, dialect: llamacpp, cache: {kv_events: 'tcp://e:1'}}",
			"targets[0].cache.kv_events: dialect llamacpp publishes no KV events"},
		{"  - {name: a, url: 'http://e:8000', model: m, dialect: ollama, cache: {kv_events: 'tcp://e:1'}}", "dialect ollama publishes no"},
		{"  - {name: a, url: 'http://e:8000', model: m, dialect: trtllm, cache: {kv_events: 'tcp://e:1'}}", "dialect trtllm publishes no"},
		{"  - {name: a, " + vllm + ", cache: {kv_events: 'tcp://localhost:5557'}}\n  - {name: b, " + vllm + ", cache: {kv_events: 'tcp://127.0.0.1:5557'}}",
			`targets[1].cache.kv_events: "tcp://127.0.0.1:5557" is the stream of targets[0].cache.kv_events ("tcp://localhost:5557"), written another way`},
		{"  - {name: a, " + vllm + ", cache: {kv_events: ['tcp://Engine.example.:5557', 'tcp://engine.example:05557']}}",
			"targets[0].cache.kv_events[1]: \"tcp://engine.example:05557\" is the stream of targets[0].cache.kv_events[0]"},
		{"  - {name: a, " + vllm + ", cache: {kv_events: ['tcp://[::1]:5557', 'tcp://127.0.0.2:5557']}}", "targets[0].cache.kv_events[1]:"},
		{"  - {name: a, " + vllm + ", cache: {kv_events: ['tcp://e:1', 'tcp://f:1'], kv_events_replay_endpoint: 'tcp://e:2'}}",
			"targets[0].cache.kv_events_replay_endpoint: lists 1 endpoints for the 2 of cache.kv_events"},
		{"  - {name: a, " + vllm + ", cache: {kv_events: 'tcp://e:1', kv_events_replay_endpoint: 'e:2'}}",
			"targets[0].cache.kv_events_replay_endpoint: \"e:2\": only tcp://host:port"},
	} {
		if err := parse(c.targets); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n%v\nwant an error with %q", c.targets, err, c.want)
		}
	}
	for _, ok := range []string{
		"  - {name: a, " + vllm + ", cache: {kv_events: ['tcp://e:1', 'tcp://f:1'], kv_events_replay_endpoint: ['tcp://e:2', '']}}",
		"  - {name: a, " + vllm + ", cache: {kv_events: 'tcp://127.0.0.1:5557'}}\n  - {name: b, " + vllm + ", cache: {kv_events: 'tcp://127.0.0.1:5558'}}",
		"  - {name: a, url: 'http://e:8000', model: m, dialect: sglang, cache: {kv_events: 'tcp://e:1'}}",
		"  - {name: a, url: 'http://e:8000', model: m, cache: {kv_events: 'tcp://e:1'}}",
	} {
		if err := parse(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// FuzzCanonicalEndpoint: an endpoint has a canonical form exactly when
// it is one the subscriber takes, and the form is its own.
func FuzzCanonicalEndpoint(f *testing.F) {
	for _, ep := range []string{"tcp://localhost:5557", "tcp://127.0.0.1:05557", "tcp://[::1]:1", "tcp://[::ffff:10.0.0.1]:2",
		"tcp://Engine.Example.:3", "tcp://e:http", "ipc:///x", "tcp://:1", "tcp://[fe80::1%eth0]:4"} {
		f.Add(ep)
	}
	f.Fuzz(func(t *testing.T, ep string) {
		canon, ok := canonicalEndpoint(ep)
		if _, err := kvevents.Address(ep); (err == nil) != ok {
			t.Fatalf("%q: canonical %v, but Address says %v", ep, ok, err)
		}
		if !ok {
			return
		}
		again, ok := canonicalEndpoint("tcp://" + canon)
		if !ok || again != canon {
			t.Fatalf("%q: canonical %q, whose own is %q (%v)", ep, canon, again, ok)
		}
	})
}
