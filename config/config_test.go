package config

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/synth"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestLoadGood(t *testing.T) {
	cfg, err := Load(filepath.Join("testdata", "good.yml"))
	if err != nil {
		t.Fatal(err)
	}
	a, ok := cfg.Target("vllm-a")
	if !ok {
		t.Fatal("target vllm-a missing")
	}
	if a.API != "chat" || a.PromptFormat != "text" || !a.Cache.BlockSize.Auto() || !a.Cache.CapacityBlocks.Auto() || a.Cache.Observed != "usage" ||
		time.Duration(a.RequestTimeout) != 10*time.Minute || !a.HTTPClientConfig.FollowRedirects {
		t.Errorf("defaults not applied: %+v", a)
	}
	if got := string(a.HTTPClientConfig.Authorization.Credentials); got != "s3cr3t-token" {
		t.Errorf("credentials = %q", got)
	}
	// An emulated target needs no model: the daemon names it after the
	// engine's default.
	demo, _ := cfg.Target("demo")
	if demo.Emulate == nil || demo.Model != "" {
		t.Errorf("emulated target: %+v", demo)
	}
	w := &cfg.Workloads[0]
	if w.BlockSize != 512 || w.Loop != "fresh" || w.MaxInFlight != 64 || w.OnSaturation != "drop" ||
		w.Shard != (Shard{0, 1}) || w.Synthesis.SpeedupRatio != 2 || w.Synthesis.PrefixLenMultiplier != 1 ||
		w.Synthesis.PrefixRootMultiplier != 1 || w.Seed != 42 {
		t.Errorf("workload defaults: %+v", w)
	}
	if got, want := cfg.TracePath(w), filepath.Join("testdata", "traces", "conversation_trace.jsonl"); got != want {
		t.Errorf("TracePath = %q, want %q", got, want)
	}
}

// TestBadConfigs checks that every bad-*.yml fails with all its problems,
// exactly as recorded in its golden file, and never echoes a secret.
func TestBadConfigs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "bad-*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad configs: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			_, err := Load(f)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			got := err.Error() + "\n"
			for _, secret := range []string{"hunter2", "s3cr3t"} {
				if strings.Contains(got, secret) {
					t.Errorf("error text holds a secret: %s", got)
				}
			}
			golden := strings.TrimSuffix(f, ".yml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./config -update)", err)
			}
			if got != string(want) {
				t.Errorf("problems differ from %s:\n got:\n%s\nwant:\n%s", golden, got, want)
			}
		})
	}
}

func TestValidateCountsEveryProblem(t *testing.T) {
	_, err := Load(filepath.Join("testdata", "bad-values.yml"))
	if err == nil {
		t.Fatal("bad-values.yml loaded")
	}
	if n := strings.Count(err.Error(), "\n") + 1; n < 20 {
		t.Errorf("only %d problems reported:\n%v", n, err)
	}
}

// TestParseNamesWhere covers the problems yaml.v3 reports without a path or
// a line: each must name where it is.
func TestParseNamesWhere(t *testing.T) {
	const head = "targets:\n  - {name: t, url: http://t:8000, model: m}\n"
	const wl = "workloads:\n  - {name: w, trace: t.jsonl, targets: [t]}\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"nul byte", head + wl + "# \x00\n", "line 5: control character U+0000 is not allowed in YAML"},
		{"invalid utf-8", head + "\xff" + wl, "line 3: invalid UTF-8"},
		{"top-level list", "- targets: []\n", "line 1: the file must be a mapping with targets and workloads, not a list"},
		{"top-level scalar", "hello\n", "line 1: the file must be a mapping with targets and workloads, not a scalar"},
		{"http client config", "targets:\n  - name: t\n    url: http://t:8000\n    model: m\n    http_client_config: {bearer_token: a, authorization: {credentials: b}}\n" + wl,
			"targets[0].http_client_config: authorization is not compatible with bearer_token & bearer_token_file (line 5)"},
		// Two keys on one line: yaml.v3 gives the line only, so the path is
		// their parent rather than whichever key came last.
		{"flow mapping", head + "workloads:\n  - {name: w, trace: t.jsonl, targets: [t], synthesis: {max_isl: x, speedup_ratio: 2}}\n",
			`workloads[0]: expected a whole number, got the string "x" (line 4)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "")
			if err == nil || err.Error() != tt.want {
				t.Errorf("Parse: %v, want %q", err, tt.want)
			}
		})
	}
}

func TestCommonParent(t *testing.T) {
	for _, tt := range [][3]string{
		{"workloads[0].synthesis.max_isl", "workloads[0].synthesis.speedup_ratio", "workloads[0].synthesis"},
		{"workloads[1].name", "workloads[10].name", "workloads"},
		{"targets[0].cache", "workloads[0]", ""},
		{"targets[0]", "targets[0].cache.block_size", "targets[0]"},
	} {
		if got := commonParent(tt[0], tt[1]); got != tt[2] {
			t.Errorf("commonParent(%q, %q) = %q, want %q", tt[0], tt[1], got, tt[2])
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"good.yml", "bad-values.yml", "bad-types.yml", "bad-unknown-keys.yml", "bad-generate.yml", "bad-schedule.yml", "bad-syntax.yml", "bad-references.yml"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "")
		if err == nil {
			// An accepted config is complete: every workload names known targets.
			for _, w := range cfg.Workloads {
				for _, name := range w.Targets {
					if _, ok := cfg.Target(name); !ok {
						t.Fatalf("accepted unknown target %q", name)
					}
				}
			}
		}
	})
}

// TestCacheAutoValues: block_size and capacity_blocks take auto (also the
// default) or a number; anything else names its path.
func TestCacheAutoValues(t *testing.T) {
	tests := []struct {
		cache         string
		block, blocks AutoInt
		problem       string
	}{
		{"{}", AutoInt{}, AutoInt{}, ""},
		{"{block_size: auto, capacity_blocks: auto}", AutoInt{}, AutoInt{}, ""},
		{"{block_size: 32, capacity_blocks: 0}", Fixed(32), Fixed(0), ""},
		{"{capacity_blocks: 65536}", AutoInt{}, Fixed(65536), ""},
		{"{block_size: 0}", AutoInt{}, AutoInt{}, "targets[0].cache.block_size: must be auto or at least 1, got 0"},
		// Beyond any server: no overflow in the model's arithmetic.
		{"{block_size: 2147483648}", AutoInt{}, AutoInt{}, "targets[0].cache.block_size: must be auto or at most 65536 tokens, got 2147483648"},
		{"{block_size: 1024, capacity_blocks: 4611686018427387904}", AutoInt{}, AutoInt{}, "targets[0].cache.capacity_blocks: must hold at most 4294967296 tokens, got 4611686018427387904 blocks of 1024"},
		{"{capacity_blocks: 1000000000000000}", AutoInt{}, AutoInt{}, "targets[0].cache.capacity_blocks: must hold at most 4294967296 tokens, got 1000000000000000 blocks of 1"},
		{"{block_size: 16, capacity_blocks: 268435456}", Fixed(16), Fixed(268435456), ""},
		{"{capacity_blocks: -1}", AutoInt{}, AutoInt{}, "targets[0].cache.capacity_blocks: must be auto or ≥ 0 (0 is infinite), got -1"},
		{"{capacity_blocks: lots}", AutoInt{}, AutoInt{}, `"lots" is neither auto nor a whole number`},
		{"{estimate_window: 2m}", AutoInt{}, AutoInt{}, ""},
		{"{estimate_window: 5s}", AutoInt{}, AutoInt{}, "targets[0].cache.estimate_window: must be between 10s and 1d, got 5s"},
		{"{estimate_window: 2d}", AutoInt{}, AutoInt{}, "targets[0].cache.estimate_window: must be between 10s and 1d, got 2d"},
	}
	for _, tt := range tests {
		t.Run(tt.cache, func(t *testing.T) {
			yml := "targets: [{name: a, url: 'http://h:1', model: m, cache: " + tt.cache + "}]\nworkloads: [{name: w, trace: t.jsonl, targets: [a]}]\n"
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
			c := cfg.Targets[0].Cache
			if c.BlockSize != tt.block || c.CapacityBlocks != tt.blocks {
				t.Errorf("block_size %+v capacity_blocks %+v, want %+v %+v", c.BlockSize, c.CapacityBlocks, tt.block, tt.blocks)
			}
		})
	}
}

// TestModelCeiling: cache.model_ceiling_tokens is left 0 (the model's
// default) or taken within its bounds; outside them it names its path.
func TestModelCeiling(t *testing.T) {
	tests := []struct {
		cache   string
		want    int64
		problem string
	}{
		{"{}", 0, ""},
		{"{model_ceiling_tokens: 4096}", 4096, ""},
		{"{model_ceiling_tokens: 1099511627776}", 1 << 40, ""},
		{"{model_ceiling_tokens: 4095}", 0, "targets[0].cache.model_ceiling_tokens: must be from 4096 to 1099511627776 tokens (0 is the default, 33554432), got 4095"},
		{"{model_ceiling_tokens: -1}", 0, "targets[0].cache.model_ceiling_tokens: must be from 4096"},
		{"{model_ceiling_tokens: 1099511627777}", 0, "targets[0].cache.model_ceiling_tokens: must be from 4096"},
	}
	for _, tt := range tests {
		t.Run(tt.cache, func(t *testing.T) {
			yml := "targets: [{name: a, url: 'http://h:1', model: m, cache: " + tt.cache + "}]\nworkloads: [{name: w, trace: t.jsonl, targets: [a]}]\n"
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
			if got := cfg.Targets[0].Cache.ModelCeilingTokens; got != tt.want {
				t.Errorf("model_ceiling_tokens %d, want %d", got, tt.want)
			}
		})
	}
}

// validTarget parses a one-target config and returns it with its target,
// for tests that change one field and validate again.
func validTarget(t *testing.T) (*Config, *Target) {
	t.Helper()
	cfg, err := Parse([]byte("targets:\n  - {name: t, url: http://t:8000, model: m, dialect: vllm}\n"+
		"workloads:\n  - {name: w, trace: t.jsonl, targets: [t]}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	return cfg, &cfg.Targets[0]
}

// TestValidateURLPort: a port outside 1..65535, or one that is not a
// number, is a problem of the field that holds it, for url and for
// cache.metrics_url alike; the password in the URL is never echoed.
func TestValidateURLPort(t *testing.T) {
	tests := []struct {
		url  string
		want string // "" means valid
	}{
		{"http://t:8000", ""},
		{"http://t:1", ""},
		{"https://t:65535/base", ""},
		{"http://t", ""},
		{"http://[::1]:8000", ""},
		{"http://t:99999", `%s: http://t:99999: port "99999" is not a number from 1 to 65535`},
		{"http://t:65536", `%s: http://t:65536: port "65536" is not a number from 1 to 65535`},
		{"http://t:0", `%s: http://t:0: port "0" is not a number from 1 to 65535`},
		{"http://t:18446744073709551697", `%s: http://t:18446744073709551697: port "18446744073709551697" is not a number from 1 to 65535`},
		{"http://u:hunter2@t:99999", `%s: http://u:xxxxx@t:99999: port "99999" is not a number from 1 to 65535`},
		{"http://t:http", `%s: not a valid URL: the port is not a number from 1 to 65535`},
		{"http://u:hunter2@t:-1", `%s: not a valid URL: the port is not a number from 1 to 65535`},
		{"http://t:80:80", `%s: not a valid URL: the port is not a number from 1 to 65535`},
		{"http://t\x01:80", `%s: not a valid URL`},
		{"http://:8000", `%s: http://:8000: has no host`},
	}
	for _, tt := range tests {
		for _, field := range []string{"url", "cache.metrics_url"} {
			t.Run(field+"/"+tt.url, func(t *testing.T) {
				cfg, tg := validTarget(t)
				path := "targets[0]." + field
				if field == "url" {
					tg.URL = tt.url
				} else {
					tg.Cache.MetricsURL = tt.url
				}
				err := cfg.Validate()
				switch {
				case tt.want == "" && err != nil:
					t.Errorf("Validate: %v, want no problem", err)
				case tt.want != "" && (err == nil || err.Error() != fmt.Sprintf(tt.want, path)):
					t.Errorf("Validate: %v\nwant %s", err, fmt.Sprintf(tt.want, path))
				}
				if err != nil && strings.Contains(err.Error(), "hunter2") {
					t.Errorf("the problem echoes the password: %v", err)
				}
			})
		}
	}
}

// TestValidateModelCharacters: the model is a label value and a log field,
// so a control character or invalid UTF-8 in it is a problem of
// targets[i].model, whether it came from YAML escapes or emulate.model.
func TestValidateModelCharacters(t *testing.T) {
	const path = "targets[0].model: "
	tests := []struct {
		name, model, want string // want "" means valid
	}{
		{"plain", "Qwen/Qwen3-0.6B", ""},
		{"unicode letters", "modèle-日本語", ""},
		{"space", "my model", ""},
		{"tab", "m\tx", path + `"m\tx" holds control character U+0009`},
		{"newline", "m\n", path + `"m\n" holds control character U+000A`},
		{"NUL", "\x00m", path + `"\x00m" holds control character U+0000`},
		{"escape sequence", "m\x1b[31m", path + `"m\x1b[31m" holds control character U+001B`},
		{"DEL", "m\x7f", path + `"m\x7f" holds control character U+007F`},
		{"C1 NEL", "m\u0085", path + `"m\u0085" holds control character U+0085`},
		{"line separator", "m\u2028x", path + `"m\u2028x" holds control character U+2028`},
		{"invalid UTF-8", "m\xffx", path + `"m\xffx" is not valid UTF-8`},
		{"truncated UTF-8", "m\xe6\x97", path + `"m\xe6\x97" is not valid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, tg := validTarget(t)
			tg.Model = tt.model
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate: %v, want no problem", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("Validate: %v\nwant %s", err, tt.want)
			}
		})
	}
	// The same through YAML: double-quoted escapes make control characters.
	_, err := Parse([]byte("targets:\n  - {name: t, url: http://t:8000, model: \"m\\a\"}\n"+
		"workloads:\n  - {name: w, trace: t.jsonl, targets: [t]}\n"), "")
	if want := path + `"m\a" holds control character U+0007 (line 2)`; err == nil || err.Error() != want {
		t.Errorf("Parse: %v\nwant %s", err, want)
	}
	// An emulated target's model defaults from emulate.model.
	_, err = Parse([]byte("targets:\n  - {name: t, emulate: {model: \"e\\x1b\"}}\n"+
		"workloads:\n  - {name: w, trace: t.jsonl, targets: [t]}\n"), "")
	if err == nil || !strings.Contains(err.Error(), path+`"e\x1b" holds control character U+001B`) {
		t.Errorf("Parse with emulate.model: %v", err)
	}
}

// TestClosedSets: each closed-set key takes every value of the contract and
// rejects any other, naming them all; a non-scalar is a type error told as
// YAML's string, not as the Go type.
func TestClosedSets(t *testing.T) {
	tests := []struct {
		key           string
		target, wl    string // the key and its companions, "%s" for the value
		valid         []string
		got           func(*Config) string
		invalid, want string
	}{
		{"api", "api: %s", "", []string{"chat", "completions"},
			func(c *Config) string { return string(c.Targets[0].API) },
			"chat-completions", `targets[0].api: "chat-completions" is not one of chat, completions`},
		{"dialect", "dialect: %s", "", []string{"vllm", "sglang", "trtllm", "dynamo", "llamacpp", "ollama", "openai"},
			func(c *Config) string { return string(c.Targets[0].Dialect) },
			"tgi", `targets[0].dialect: "tgi" is not one of vllm, sglang, trtllm, dynamo, llamacpp, ollama, openai`},
		{"prompt_format", "api: completions, prompt_format: %s", "", []string{"text", "token_ids"},
			func(c *Config) string { return string(c.Targets[0].PromptFormat) },
			"ids", `targets[0].prompt_format: "ids" is not one of text, token_ids`},
		{"cache.observed", "dialect: vllm, cache: {observed: %s}", "", []string{"usage", "server_metrics", "none"},
			func(c *Config) string { return string(c.Targets[0].Cache.Observed) },
			"maybe", `targets[0].cache.observed: "maybe" is not one of usage, server_metrics, none`},
		{"loop", "", "loop: %s", []string{"fresh", "repeat", "once"},
			func(c *Config) string { return string(c.Workloads[0].Loop) },
			"forever", `workloads[0].loop: "forever" is not one of fresh, repeat, once`},
		{"on_saturation", "", "on_saturation: %s", []string{"drop", "queue"},
			func(c *Config) string { return string(c.Workloads[0].OnSaturation) },
			"block", `workloads[0].on_saturation: "block" is not one of drop, queue`},
		{"schedule.arrivals", "", "schedule: {rate: 1, arrivals: %s}", []string{"poisson", "constant"},
			func(c *Config) string { return string(c.Workloads[0].Schedule.Arrivals) },
			"bursty", `workloads[0].schedule.arrivals: "bursty" is not one of poisson, constant`},
	}
	for _, tt := range tests {
		parse := func(v string) (*Config, error) {
			extra := func(tmpl string) string {
				if tmpl == "" {
					return ""
				}
				return ", " + fmt.Sprintf(tmpl, v)
			}
			return Parse([]byte("targets:\n  - {name: t, url: 'http://t:8000', model: m"+extra(tt.target)+"}\n"+
				"workloads:\n  - {name: w, trace: t.jsonl, targets: [t]"+extra(tt.wl)+"}\n"), "")
		}
		for _, v := range tt.valid {
			t.Run(tt.key+"/"+v, func(t *testing.T) {
				cfg, err := parse(v)
				if err != nil {
					t.Fatal(err)
				}
				if got := tt.got(cfg); got != v {
					t.Errorf("%s = %q, want %q", tt.key, got, v)
				}
			})
		}
		t.Run(tt.key+"/"+tt.invalid, func(t *testing.T) {
			line := " (line 2)" // the target's
			if strings.HasPrefix(tt.want, "workloads") {
				line = " (line 4)"
			}
			if _, err := parse(tt.invalid); err == nil || err.Error() != tt.want+line {
				t.Errorf("Parse: %v\nwant %s", err, tt.want+line)
			}
		})
		t.Run(tt.key+"/mapping", func(t *testing.T) {
			if _, err := parse("{x: 1}"); err == nil || !strings.Contains(err.Error(), "expected a string, got a mapping") {
				t.Errorf("Parse: %v, want a type error into string", err)
			}
		})
	}
}

// TestEmulateBlock: the emulate block is strict YAML like the rest, its
// problems named by path and line; the engine's name is the daemon's to
// check.
func TestEmulateBlock(t *testing.T) {
	tests := []struct {
		name, block, want string // want "" means valid
	}{
		{"unknown key", "engin: sglang", `targets[0].emulate: unknown key "engin" (line 4); did you mean "engine"?`},
		{"unknown fault", "faults: {error500: 1}", `targets[0].emulate.faults: unknown key "error500" (line 4); did you mean "error_500"?`},
		{"not a duration", "overhead: soon", `targets[0].emulate.overhead: expected a duration such as 30s, got the string "soon" (line 4)`},
		{"not a string", "engine: [vllm]", "targets[0].emulate.engine: expected a string, got a list (line 4)"},
		// The emulator's own names, told with the file's other problems.
		{"unknown engine", "engine: tgi", `targets[0].emulate.engine: unknown engine "tgi" (want vllm, sglang, trtllm or llamacpp) (line 4)`},
		{"engine", "engine: llamacpp", ""}, // lifecycle's TestEmulateConfig has every key
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte("targets:\n  - name: t\n    emulate:\n      "+tt.block+"\n"+
				"workloads:\n  - {name: w, trace: t.jsonl, targets: [t]}\n"), "")
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Parse: %v, want no problem", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("Parse: %v\nwant %s", err, tt.want)
			}
		})
	}
}

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

// TestScheduleKeys: a workload's schedule, prompts and a target's session
// header are read with their defaults, and the schedule reaches the replay
// seeded only where it draws at random.
func TestScheduleKeys(t *testing.T) {
	cfg, err := Parse([]byte(`
targets:
  - {name: t, url: "http://t:8000", model: m, session_header: X-Session-ID}
workloads:
  - {name: poisson, trace: t.jsonl, targets: [t], seed: 7, schedule: {rate: 5}}
  - {name: constant, trace: t.jsonl, targets: [t], seed: 7, schedule: {rate: 2.5, arrivals: constant}}
  - {name: users, trace: t.jsonl, targets: [t], seed: 7, schedule: {users: 8, think_time: 250ms}}
  - {name: timestamps, trace: t.jsonl, targets: [t], loop: once, prompts: {reproducible: true}}
`), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Targets[0].SessionHeader; got != "X-Session-ID" {
		t.Errorf("session_header = %q", got)
	}
	for i, want := range []replay.Schedule{
		{Rate: 5, Arrivals: replay.ArrivalsPoisson, Seed: 7},
		{Rate: 2.5, Arrivals: replay.ArrivalsConstant},
		{Users: 8, ThinkTime: 250 * time.Millisecond},
		{},
	} {
		w := &cfg.Workloads[i]
		if got := w.Schedule.Replay(w.Seed); got != want {
			t.Errorf("%s: schedule %+v, want %+v", w.Name, got, want)
		}
	}
	if !cfg.Workloads[3].Prompts.Reproducible || cfg.Workloads[0].Prompts.Reproducible {
		t.Errorf("prompts.reproducible not read: %+v, %+v", cfg.Workloads[3].Prompts, cfg.Workloads[0].Prompts)
	}
}

// TestGenerateArrivalsAlias: generate.arrivals is the key, as in schedule;
// generate.arrival, the spelling that shipped first, is still read, and
// every message names the spelling the user wrote.
func TestGenerateArrivalsAlias(t *testing.T) {
	tests := []struct {
		name, keys string
		want       synth.Arrivals
		wantErr    string
	}{
		{"neither", "", synth.ArrivalsPoisson, ""},
		{"new spelling", "arrivals: constant", synth.ArrivalsConstant, ""},
		{"old spelling", "arrival: constant", synth.ArrivalsConstant, ""},
		{"both", "arrivals: constant, arrival: constant", "",
			"workloads[0].generate.arrival: cannot be given with arrivals: it is the older spelling of the same key"},
		{"bad under the new spelling", "arrivals: bursty", "",
			`workloads[0].generate.arrivals: "bursty" is not one of poisson, constant`},
		{"bad under the old spelling", "arrival: bursty", "",
			`workloads[0].generate.arrival: "bursty" is not one of poisson, constant`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := ""
			if tt.keys != "" {
				keys = ", " + tt.keys
			}
			cfg, err := Parse([]byte(`
targets:
  - {name: t, url: "http://t:8000", model: m}
workloads:
  - name: w
    targets: [t]
    generate: {prefixes: 2, prefix_tokens: 8, requests: 4, input_tokens: {mean: 4}, output_tokens: {mean: 2}, rate: 1`+keys+`}
`), "")
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr+" (line 7)" {
					t.Fatalf("Parse: %v\nwant %s (line 7)", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Workloads[0].SharedPrefix().Arrivals; got != tt.want {
				t.Errorf("arrivals = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestComponentKeys: a component's configuration type is taken whole
// under its key (the emulator's under a target's emulate, synthesis's
// under a workload's synthesis, the shared-prefix generator's under its
// generate), so every YAML key of the type, nested ones included, is a key
// of the file with no edit in this package. Each key is given alone, with
// its zero value: valid, but for the generator, whose keys are only to be
// known.
func TestComponentKeys(t *testing.T) {
	tests := []struct {
		name  string
		typ   reflect.Type
		file  func(block string) string // a configuration with block in its place
		valid bool                      // each key alone makes a valid file
	}{
		{"emulate", reflect.TypeOf(emulate.Config{}), func(block string) string {
			return "targets:\n  - name: emu\n    emulate: " + block + "\nworkloads:\n  - {name: w, trace: t.jsonl, targets: [emu]}\n"
		}, true},
		{"synthesis", reflect.TypeOf(synth.Synthesis{}), func(block string) string {
			return "targets:\n  - name: emu\n    emulate: {}\nworkloads:\n  - {name: w, trace: t.jsonl, targets: [emu], synthesis: " + block + "}\n"
		}, true},
		{"generate", reflect.TypeOf(synth.SharedPrefix{}), func(block string) string {
			return "targets:\n  - name: emu\n    emulate: {}\nworkloads:\n  - {name: w, targets: [emu], generate: " + block + "}\n"
		}, false},
	}
	for _, tt := range tests {
		keys := yamlKeys(tt.typ)
		if len(keys) < 5 {
			t.Fatalf("found only %d keys in %v: %v", len(keys), tt.typ, keys)
		}
		for _, key := range keys {
			t.Run(tt.name+"."+key.path, func(t *testing.T) {
				value, err := yaml.Marshal(reflect.Zero(key.typ).Interface())
				if err != nil {
					t.Fatal(err)
				}
				block := strings.TrimSpace(string(value))
				for _, k := range slices.Backward(strings.Split(key.path, ".")) {
					block = fmt.Sprintf("{%s: %s}", k, block)
				}
				_, err = Parse([]byte(tt.file(block)), "testdata")
				if err != nil && (tt.valid || strings.Contains(err.Error(), "unknown key")) {
					t.Errorf("%s: %s: %v", tt.name, block, err)
				}
			})
		}
	}
}

// yamlKey is one YAML key of a struct: its dotted path and its Go type.
type yamlKey struct {
	path string
	typ  reflect.Type
}

// yamlKeys lists the keys of struct t, those of its nested structs too.
func yamlKeys(t reflect.Type) []yamlKey {
	var out []yamlKey
	for name, ft := range yamlFields(t) {
		if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Time{}) {
			for _, inner := range yamlKeys(ft) {
				out = append(out, yamlKey{name + "." + inner.path, inner.typ})
			}
			continue
		}
		out = append(out, yamlKey{name, ft})
	}
	slices.SortFunc(out, func(a, b yamlKey) int { return strings.Compare(a.path, b.path) })
	return out
}
