// Package config is the YAML schema of kvload-exporter: targets (inference
// servers) and workloads (traces replayed against them), their defaults and
// their validation.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	promconfig "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// Config is a whole configuration file.
type Config struct {
	Targets   []Target   `yaml:"targets"`
	Workloads []Workload `yaml:"workloads"`
	// Tracing exports each request as a span; without it every request
	// still carries a sampled traceparent.
	Tracing Tracing `yaml:"tracing,omitempty"`

	// dir is the directory of the file, against which trace paths resolve;
	// file is the file's path as given, when known.
	dir, file string
	// keyLines is the line of each key, by YAML path, for errors.
	keyLines map[string]int
	// fingerprints holds a canonical form of each target's and workload's
	// YAML ("target/NAME", "workload/NAME"), secrets included, to tell
	// what a reload changed; it is never printed.
	fingerprints map[string]string
}

// Tracing is the tracing key: where spans go, and the share of requests
// sampled.
type Tracing struct {
	// Endpoint is the OTLP/HTTP traces URL; empty exports no span.
	Endpoint string `yaml:"endpoint,omitempty"`
	// SampleRatio is the share of requests whose traceparent says sampled
	// and, with an endpoint, whose span is exported: 0 to 1, 1 by default.
	SampleRatio *float64 `yaml:"sample_ratio,omitempty"`
}

// Config is the tracing package's form of t, defaults applied.
func (t Tracing) Config() tracing.Config {
	c := tracing.Default
	c.Endpoint = t.Endpoint
	if t.SampleRatio != nil {
		c.SampleRatio = *t.SampleRatio
	}
	return c
}

// Target is one inference server (or an emulated one).
type Target struct {
	Name         string              `yaml:"name"`
	URL          string              `yaml:"url,omitempty"`
	Model        string              `yaml:"model,omitempty"`
	API          openai.API          `yaml:"api,omitempty"`
	Dialect      engine.Dialect      `yaml:"dialect,omitempty"`
	PromptFormat openai.PromptFormat `yaml:"prompt_format,omitempty"`
	Tokenizer    string              `yaml:"tokenizer,omitempty"`
	// tokenizerSet: the file named a tokenizer (before defaults), which
	// only token-id prompts use.
	tokenizerSet     bool
	RequestTimeout   Duration                     `yaml:"request_timeout,omitempty"`
	HTTPClientConfig *promconfig.HTTPClientConfig `yaml:"http_client_config,omitempty"`
	ExtraBody        map[string]any               `yaml:"extra_body,omitempty"`
	// SessionHeader names a request header that carries each request's
	// session (the trace's session_id, else a per-row id), for a KV-aware
	// router that keeps a session on one replica.
	SessionHeader string   `yaml:"session_header,omitempty"`
	Cache         Cache    `yaml:"cache,omitempty"`
	Emulate       *Emulate `yaml:"emulate,omitempty"`
}

// Emulate is a target's emulated engine: package emulate's own
// configuration, under the same keys, so that a key the emulator gains is
// a key of the emulate block with no edit here. The daemon names the
// target's model after it.
type Emulate = emulate.Config

// Cache describes the target's KV prefix cache, for the theoretical model
// and for reading the observed hits.
type Cache struct {
	// BlockSize and CapacityBlocks are "auto" unless given: read from the
	// target where its engine exposes them (see package engine).
	BlockSize      AutoInt         `yaml:"block_size,omitempty"`
	CapacityBlocks AutoInt         `yaml:"capacity_blocks,omitempty"`
	Observed       engine.Observed `yaml:"observed,omitempty"`
	MetricsURL     string          `yaml:"metrics_url,omitempty"`
	// EstimateWindow is how far back the exporter's own cache estimates
	// (the cached-token cost fit, the effective capacity) look.
	EstimateWindow Duration `yaml:"estimate_window,omitempty"`
	// ModelCeilingTokens is the largest LRU capacity, in tokens, whose
	// hits the model follows for the effective capacity; 0 is
	// replay.DefaultModelCeilingTokens. A known capacity raises it to at
	// least twice that.
	ModelCeilingTokens int64 `yaml:"model_ceiling_tokens,omitempty"`
	// Isolate gives each (workload, target) a cache salt of its own, sent
	// with every request, so that the engine shares cached prefixes only
	// among its requests: not with another exporter's, nor with this
	// one's before a restart.
	Isolate bool `yaml:"isolate,omitempty"`
	// IsolationEpoch, with Isolate, goes into the salt instead of the one
	// drawn at every start, so that the replicas of a sharded fleet, which
	// build the same prompts, share the engine's cache again.
	IsolationEpoch string `yaml:"isolation_epoch,omitempty"`
	// KVEvents are the engine's KV event streams (kvevents.go), which
	// explain the hits the engine missed.
	KVEvents Endpoints `yaml:"kv_events,omitempty"`
	// KVEventsReplayEndpoint are the engines' replay sockets (vLLM's
	// replay_endpoint), in the order of KVEvents, asked for the batches a
	// gap skipped.
	KVEventsReplayEndpoint Endpoints `yaml:"kv_events_replay_endpoint,omitempty"`
	// KVEventsMaxBlocks bounds the blocks each of those streams holds,
	// and the engine hashes it indexes; 0 is kvevents.DefaultMaxBlocks.
	KVEventsMaxBlocks int `yaml:"kv_events_max_blocks,omitempty"`
	// Reconcile reads the engine's own counters beside the responses'
	// usage, to compare them (reconcile.go).
	Reconcile Reconcile `yaml:"reconcile,omitempty"`
}

// AutoInt is a whole number, or "auto" for a value the exporter reads from
// the target. The zero value (not given) is auto.
type AutoInt struct {
	N     int
	fixed bool
}

// Fixed returns an AutoInt of n.
func Fixed(n int) AutoInt { return AutoInt{N: n, fixed: true} }

// Auto tells whether the value is to be read from the target.
func (a AutoInt) Auto() bool { return !a.fixed }

// UnmarshalYAML takes "auto" or an integer; anything else is a type error,
// so that decoding goes on and every other problem is reported too.
func (a *AutoInt) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == "auto" {
		*a = AutoInt{}
		return nil
	}
	var v int
	if n.Kind != yaml.ScalarNode || n.Decode(&v) != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %q is neither auto nor a whole number", n.Line, n.Value)}}
	}
	*a = Fixed(v)
	return nil
}

// MarshalYAML writes the value back in the same form.
func (a AutoInt) MarshalYAML() (any, error) {
	if a.Auto() {
		return "auto", nil
	}
	return a.N, nil
}

// IsZero makes omitempty leave out an auto value.
func (a AutoInt) IsZero() bool { return a.Auto() }

// Workload is one trace replayed against one or more targets.
type Workload struct {
	Name  string `yaml:"name"`
	Trace string `yaml:"trace,omitempty"`
	// Generate, instead of a trace, makes the rows of a shared-prefix
	// workload in memory.
	Generate     *Generate               `yaml:"generate,omitempty"`
	Targets      []string                `yaml:"targets"`
	BlockSize    int                     `yaml:"block_size,omitempty"`
	Seed         uint64                  `yaml:"seed,omitempty"`
	Synthesis    Synthesis               `yaml:"synthesis,omitempty"`
	Loop         replay.LoopMode         `yaml:"loop,omitempty"`
	MaxInFlight  int                     `yaml:"max_in_flight,omitempty"`
	OnSaturation replay.SaturationPolicy `yaml:"on_saturation,omitempty"`
	// MaxQueueLag: with on_saturation: queue, how late a row waiting for a
	// slot may still be sent; later it is dropped (reason max_lag). 0 is
	// replay.DefaultMaxQueueLag.
	MaxQueueLag Duration `yaml:"max_queue_lag,omitempty"`
	Shard       Shard    `yaml:"shard,omitempty"`
	// Schedule replaces the trace's timestamps: an open-loop rate or a
	// closed loop of users. Unset, the trace's timestamps are the schedule.
	Schedule Schedule `yaml:"schedule,omitempty"`
	Prompts  Prompts  `yaml:"prompts,omitempty"`
	// SLO judges each request against latency thresholds (slo.go).
	SLO *SLO `yaml:"slo,omitempty"`
	// Abandon closes the stream of a share of requests early (slo.go).
	Abandon *Abandon `yaml:"abandon,omitempty"`
}

// Schedule is a workload's schedule: replay.Schedule's keys, which
// replay validates (validateSchedule), in the file's terms: its think time
// a duration such as every other of the file ("1m30s", "1d"), and its seed
// the workload's.
type Schedule struct {
	Rate      float64        `yaml:"rate,omitempty"`     // requests a second, whole fleet
	Arrivals  synth.Arrivals `yaml:"arrivals,omitempty"` // with rate: poisson (default) or constant
	Users     int            `yaml:"users,omitempty"`    // closed-loop users
	ThinkTime Duration       `yaml:"think_time,omitempty"`
}

// Replay is the schedule as the replay takes it, seeded with the
// workload's seed where it draws at random (Poisson arrivals), so that
// workloads that differ only in their seed share a constant schedule.
func (s Schedule) Replay(seed uint64) replay.Schedule {
	r := replay.Schedule{Rate: s.Rate, Arrivals: s.Arrivals, Users: s.Users, ThinkTime: time.Duration(s.ThinkTime)}
	if r.Rate > 0 && r.Arrivals == synth.ArrivalsPoisson {
		r.Seed = seed
	}
	return r
}

// Prompts says how a workload's prompts are made.
type Prompts struct {
	// Reproducible makes a loop: once workload's prompts a function of its
	// seed and trace alone, the same on every run, instead of new ones on
	// every start (which a warm server cannot have cached).
	Reproducible bool `yaml:"reproducible,omitempty"`
}

// Synthesis reshapes the trace before replay (AIPerf's per-row
// transform): synth's own type, under the same keys.
type Synthesis = synth.Synthesis

// Generate is a shared-prefix workload: synth.SharedPrefix's keys, the
// trace synthesize --prefixes would write, made in memory. Its block size
// and seed are the workload's; its turn delay is a duration such as every
// other of the file, and arrivals has a second spelling.
type Generate struct {
	synth.SharedPrefix `yaml:",inline"`
	// TurnDelay is SharedPrefix.TurnDelay as the file writes it.
	TurnDelay Duration `yaml:"turn_delay,omitempty"`
	// Arrival is the spelling of arrivals that shipped first, still
	// accepted; giving both is an error.
	Arrival synth.Arrivals `yaml:"arrival,omitempty"`
}

// arrivalsKey is the arrival process g names and the key it is under,
// arrivals or its older spelling arrival; arrivals when neither is given.
func (g *Generate) arrivalsKey() (synth.Arrivals, string) {
	if g.Arrivals == "" && g.Arrival != "" {
		return g.Arrival, "arrival"
	}
	return g.Arrivals, "arrivals"
}

// TokenLengths is a normal distribution of token counts: synth's own
// type, under the same keys.
type TokenLengths = synth.Lengths

// Knobs are w's synthesis settings with its block size and seed, as the
// transform takes them.
func (w *Workload) Knobs() synth.Knobs {
	return synth.Knobs{BlockSize: w.BlockSize, Synthesis: w.Synthesis, Seed: w.Seed}
}

// SharedPrefix is the generator w names, with its defaults; nil without
// one.
func (w *Workload) SharedPrefix() *synth.SharedPrefix {
	g := w.Generate
	if g == nil {
		return nil
	}
	arrivals, _ := g.arrivalsKey()
	sp := g.SharedPrefix
	if sp.Turns == 0 {
		sp.Turns = 1
	}
	sp.TurnDelay = float64(time.Duration(g.TurnDelay)) / float64(time.Millisecond)
	sp.Arrivals = arrivals.OrDefault()
	sp.BlockSize, sp.Seed = w.BlockSize, w.Seed
	return &sp
}

// Duration is a Prometheus-style duration ("30s", "10m", "1h30m").
type Duration model.Duration

// UnmarshalYAML reports a bad duration as a type error, so that decoding
// goes on and every other problem is reported too.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	md, err := model.ParseDuration(n.Value)
	if err != nil || n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %q is not a duration such as 30s or 10m", n.Line, n.Value)}}
	}
	*d = Duration(md)
	return nil
}

// MarshalYAML writes the duration back in the same form.
func (d Duration) MarshalYAML() (any, error) { return model.Duration(d).String(), nil }

// Shard selects this replica's share of the trace.
type Shard struct {
	Index int `yaml:"index"`
	Count int `yaml:"count"`
}

// MinModelCeilingTokens is the smallest cache.model_ceiling_tokens: a few
// trace blocks.
const MinModelCeilingTokens = 4096

// Defaults of the contract.
const (
	DefaultAPI            = openai.APIChat
	DefaultDialect        = engine.DialectOpenAI
	DefaultPromptFormat   = openai.PromptFormatText
	DefaultTokenizer      = "o200k_base"
	DefaultRequestTimeout = Duration(10 * time.Minute)
	DefaultObserved       = engine.ObservedUsage
	DefaultEstimateWindow = Duration(5 * time.Minute)
	// The shortest and longest estimate windows: under 10 s an
	// estimate rests on a few requests, and a day is the baselines' reach.
	MinEstimateWindow     = Duration(10 * time.Second)
	MaxEstimateWindow     = Duration(24 * time.Hour)
	DefaultTraceBlockSize = 512
	DefaultLoop           = replay.LoopFresh
	DefaultMaxInFlight    = 64
	// MaxInFlightLimit bounds max_in_flight, as replay.MaxUsers bounds
	// schedule.users, whose users each hold a request in flight: each
	// holds a goroutine, a connection and its buffers
	// (MemoryCosts.InFlightRequest).
	MaxInFlightLimit    = replay.MaxUsers
	DefaultOnSaturation = replay.SaturationDrop
)

// Load reads, defaults and validates a configuration file. Its error lists
// every problem, each on its own line prefixed with the file name.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseFile(path, data)
}

// ParseFile is Load for a file already read: relative trace paths resolve
// against path's directory and problems are prefixed with path.
func ParseFile(path string, data []byte) (*Config, error) {
	cfg, err := Parse(data, filepath.Dir(path))
	if err != nil {
		return nil, prefixLines(path, err)
	}
	cfg.file = path
	return cfg, nil
}

// Parse decodes data strictly (unknown keys are errors), applies defaults and
// validates. dir resolves relative trace paths.
func Parse(data []byte, dir string) (*Config, error) {
	cfg, err := parseAll(data, dir)
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// ParseFileAll is ParseFile that also returns what could be decoded when
// the file has problems: every key that decoded, with its defaults. The
// configuration is nil only when the file is not YAML of the schema's
// shape at all; with an error it is not to be run, only looked into (for
// the problems of the trace files it names: TraceFileProblems).
func ParseFileAll(path string, data []byte) (*Config, error) {
	cfg, err := parseAll(data, filepath.Dir(path))
	if cfg != nil {
		cfg.file = path
	}
	if err != nil {
		return cfg, prefixLines(path, err)
	}
	return cfg, nil
}

// parseAll is Parse, returning the configuration decoded so far beside its
// problems: decoding problems (unknown keys, types) and semantic ones are
// reported together, each with its line.
func parseAll(data []byte, dir string) (*Config, error) {
	if err := checkBytes(data); err != nil {
		return nil, err
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, syntaxError(data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document")
	}
	cfg := &Config{dir: dir}
	if top := topNode(&root); top != nil && top.Kind != yaml.MappingNode && top.Tag != "!!null" {
		return nil, fmt.Errorf("line %d: the file must be a mapping with targets and workloads, not %s", top.Line, nodeKind(top))
	}
	var problems []error
	// decoded holds the paths whose values did not decode: what Validate
	// says of them (an empty list, say) follows from that problem alone.
	var undecoded []string
	if root.Kind != 0 {
		walk := walkKeys(&root, reflect.TypeOf(cfg))
		cfg.keyLines = walk.lines
		for _, u := range walk.unknown {
			problems = append(problems, errors.New(u))
		}
		strict := yaml.NewDecoder(bytes.NewReader(data))
		strict.KnownFields(true)
		if err := strict.Decode(cfg); err != nil {
			var te *yaml.TypeError
			if !errors.As(err, &te) {
				// A custom unmarshaller (http_client_config's) stops the
				// whole decode with an error that names no place: find it.
				var where []string
				if !strings.HasPrefix(err.Error(), "yaml: ") {
					locateFailures(topNode(&root), reflect.TypeOf(cfg), "", &where)
				}
				if len(where) == 0 {
					return nil, fmt.Errorf("invalid YAML: %w", err)
				}
				for _, w := range where {
					problems = append(problems, errors.New(w))
				}
				return nil, errors.Join(problems...)
			}
			for _, e := range te.Errors {
				if strings.Contains(e, "not found in type") {
					continue // already reported with its path
				}
				msg := walk.locate(yamlTerms(plainTypes(e)))
				if path, _, ok := strings.Cut(msg, ": "); ok {
					undecoded = append(undecoded, path)
				}
				problems = append(problems, errors.New(msg))
			}
		}
	}
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		problems = append(problems, cfg.withLines(err, undecoded)...)
	}
	if len(problems) > 0 {
		return cfg, errors.Join(problems...)
	}
	cfg.fingerprints = fingerprints(&root)
	return cfg, nil
}

func prefixLines(path string, err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = path + ": " + l
	}
	return &Error{msg: strings.Join(lines, "\n"), err: err}
}

// Error is a configuration that cannot be used; its text has one problem per
// line.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.err }

func (c *Config) applyDefaults() {
	for i := range c.Targets {
		t := &c.Targets[i]
		t.API = orDefault(t.API, DefaultAPI)
		if t.Emulate != nil {
			t.Dialect = orDefault(t.Dialect, engine.DialectVLLM) // the emulator speaks vLLM
		}
		t.Dialect = orDefault(t.Dialect, DefaultDialect)
		t.PromptFormat = orDefault(t.PromptFormat, DefaultPromptFormat)
		t.tokenizerSet = t.tokenizerSet || t.Tokenizer != ""
		t.Tokenizer = orDefault(t.Tokenizer, DefaultTokenizer)
		if t.RequestTimeout == 0 {
			t.RequestTimeout = DefaultRequestTimeout
		}
		t.Cache.Observed = orDefault(t.Cache.Observed, DefaultObserved)
		t.Cache.Reconcile = orDefault(t.Cache.Reconcile, ReconcileAuto)
		if t.Cache.EstimateWindow == 0 {
			t.Cache.EstimateWindow = DefaultEstimateWindow
		}
		if t.Cache.Observed == engine.ObservedServerMetrics && t.Cache.MetricsURL == "" && t.URL != "" {
			t.Cache.MetricsURL = strings.TrimSuffix(t.URL, "/") + "/metrics"
		}
		if t.Emulate != nil {
			// Still empty, it is the daemon's to name after the engine's default.
			t.Model = orDefault(t.Model, t.Emulate.Model)
		}
		if t.HTTPClientConfig == nil {
			d := promconfig.DefaultHTTPClientConfig
			t.HTTPClientConfig = &d
		}
	}
	for i := range c.Workloads {
		w := &c.Workloads[i]
		if w.BlockSize == 0 {
			w.BlockSize = DefaultTraceBlockSize
		}
		s := &w.Synthesis
		s.SpeedupRatio = orOne(s.SpeedupRatio)
		s.PrefixLenMultiplier = orOne(s.PrefixLenMultiplier)
		s.PromptLenMultiplier = orOne(s.PromptLenMultiplier)
		s.OutputLenMultiplier = orOne(s.OutputLenMultiplier)
		if s.PrefixRootMultiplier == 0 {
			s.PrefixRootMultiplier = 1
		}
		w.Loop = orDefault(w.Loop, DefaultLoop)
		if w.MaxInFlight == 0 {
			w.MaxInFlight = DefaultMaxInFlight
		}
		w.OnSaturation = orDefault(w.OnSaturation, DefaultOnSaturation)
		if w.Shard == (Shard{}) {
			w.Shard = Shard{Index: 0, Count: 1}
		}
		if w.Schedule.Rate != 0 {
			w.Schedule.Arrivals = w.Schedule.Arrivals.OrDefault()
		}
	}
}

func orDefault[T ~string](v, d T) T {
	if v == "" {
		return d
	}
	return v
}

func orOne(v float64) float64 {
	if v == 0 {
		return 1
	}
	return v
}

// TracePath is the workload's trace file, resolved against the config file's
// directory.
func (c *Config) TracePath(w *Workload) string {
	if filepath.IsAbs(w.Trace) || c.dir == "" {
		return w.Trace
	}
	return filepath.Join(c.dir, w.Trace)
}

// TraceError is err, the failure to read w's trace, told so that the user
// can fix it: the file and YAML path of the trace key, its line, and for a
// relative path the directory it resolves against. It wraps err.
func (c *Config) TraceError(w *Workload, err error) error {
	where := "workload " + w.Name + ": trace"
	for i := range c.Workloads {
		if &c.Workloads[i] == w {
			where = fmt.Sprintf("workloads[%d].trace", i)
			if line := c.keyLines[where]; line > 0 {
				where += fmt.Sprintf(" (line %d)", line)
			}
		}
	}
	if c.file != "" {
		where = c.file + ": " + where
	}
	reason := err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		reason = pe.Err.Error() // the path is told below, as written
	}
	msg := fmt.Sprintf("%s: %q: %s", where, w.Trace, reason)
	if !filepath.IsAbs(w.Trace) && c.dir != "" {
		dir := c.dir
		if abs, aerr := filepath.Abs(dir); aerr == nil {
			dir = abs
		}
		msg += fmt.Sprintf(" (a relative trace path resolves against the configuration file's directory, %s)", dir)
	}
	return &Error{msg: msg, err: err}
}

// KeyError is err, a problem found after loading with the value at path
// ("targets[0].emulate.engine"), told as Load tells its own: file, path,
// reason, line. It wraps err.
func (c *Config) KeyError(path string, err error) error {
	msg := path + ": " + err.Error()
	if line := c.keyLines[path]; line > 0 {
		msg += fmt.Sprintf(" (line %d)", line)
	}
	if c.file != "" {
		msg = c.file + ": " + msg
	}
	return &Error{msg: msg, err: err}
}

// Fingerprint returns a canonical form of the named target's or workload's
// configuration (kind "target" or "workload"): equal fingerprints mean an
// unchanged entry. It holds secrets; never log it.
func (c *Config) Fingerprint(kind, name string) string {
	return c.fingerprints[kind+"/"+name]
}

// Target returns the target called name.
func (c *Config) Target(name string) (*Target, bool) {
	for i := range c.Targets {
		if c.Targets[i].Name == name {
			return &c.Targets[i], true
		}
	}
	return nil, false
}

var namePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// Validate reports every problem at once, each prefixed with its YAML path.
func (c *Config) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	if len(c.Targets) == 0 {
		bad("targets", "at least one target is required")
	}
	if len(c.Workloads) == 0 {
		bad("workloads", "at least one workload is required")
	}
	if c.Tracing.Endpoint != "" {
		validateTracingURL(c.Tracing.Endpoint, "tracing.endpoint", bad)
	}
	if err := c.Tracing.Config().Check(); err != nil {
		bad("tracing.sample_ratio", "%v: want a number from 0 to 1", *c.Tracing.SampleRatio)
	}
	// checkName validates a label-value name, unique among its kind.
	checkName := func(kind, name, p string, seen map[string]bool) {
		switch {
		case name == "":
			bad(p+".name", "is required")
		case !namePattern.MatchString(name):
			bad(p+".name", "%q may hold only letters, digits, '_' and '-'", name)
		case seen[name]:
			bad(p+".name", "duplicate %s name %q", kind, name)
		}
		seen[name] = true
	}
	seenT := map[string]bool{}
	for i := range c.Targets {
		t := &c.Targets[i]
		p := fmt.Sprintf("targets[%d]", i)
		checkName("target", t.Name, p, seenT)
		validateTarget(t, p, bad)
	}
	validateKVEventsAcross(c, bad)
	seenW := map[string]bool{}
	for i := range c.Workloads {
		w := &c.Workloads[i]
		p := fmt.Sprintf("workloads[%d]", i)
		checkName("workload", w.Name, p, seenW)
		switch {
		case w.Trace == "" && w.Generate == nil:
			bad(p+".trace", "is required (or generate, for a shared-prefix workload)")
		case w.Trace != "" && w.Generate != nil:
			bad(p+".generate", "cannot be given with trace: a workload replays a trace or generates its rows")
		}
		if len(w.Targets) == 0 {
			bad(p+".targets", "at least one target is required")
		}
		dup := map[string]bool{}
		for j, name := range w.Targets {
			tp := fmt.Sprintf("%s.targets[%d]", p, j)
			if _, ok := c.Target(name); !ok {
				bad(tp, "%s", c.unknownTarget(name))
			}
			if dup[name] {
				bad(tp, "target %q listed twice", name)
			}
			dup[name] = true
		}
		validateWorkload(w, p, bad)
		if w.Shard.Count > 1 {
			for _, ti := range c.isolatedEachStart(w.Targets) {
				bad(p+".shard", "%d replicas build the same prompts and must share a cache salt, but targets[%d] (%s) isolates with a salt of each start: set targets[%d].cache.isolation_epoch, the same in every replica",
					w.Shard.Count, ti, c.Targets[ti].Name, ti)
			}
		}
	}
	return errors.Join(errs...)
}

// CheckShardIsolation is the problem, if any, of running every workload
// as one shard of count replicas (--shard): a target that isolates with a
// salt of each start would give each replica a cache of its own, while
// the replicas build the same prompts and model one cache fed by all.
func (c *Config) CheckShardIsolation(count int) error {
	if count < 2 {
		return nil
	}
	var names []string
	for i := range c.Workloads {
		names = append(names, c.Workloads[i].Targets...)
	}
	var errs []error
	for _, ti := range c.isolatedEachStart(names) {
		errs = append(errs, c.KeyError(fmt.Sprintf("targets[%d].cache.isolate", ti),
			fmt.Errorf("with --shard the %d replicas build the same prompts and must share a cache salt: set targets[%d].cache.isolation_epoch, the same in every replica", count, ti)))
	}
	return errors.Join(errs...)
}

// isolatedEachStart lists, in the targets' order, those of names that
// isolate with a salt drawn at every start (no isolation_epoch).
func (c *Config) isolatedEachStart(names []string) []int {
	var out []int
	for i := range c.Targets {
		t := &c.Targets[i]
		if t.Cache.Isolate && t.Cache.IsolationEpoch == "" && slices.Contains(names, t.Name) {
			out = append(out, i)
		}
	}
	return out
}

func validateTarget(t *Target, p string, bad func(string, string, ...any)) {
	switch {
	case t.URL == "" && t.Emulate == nil:
		bad(p, "one of url or emulate is required")
	case t.URL != "" && t.Emulate != nil:
		bad(p, "url and emulate are mutually exclusive")
	case t.URL != "":
		validateURL(t.URL, p+".url", bad)
	}
	if t.Model == "" {
		if t.Emulate == nil { // an emulated engine serves its default model
			bad(p+".model", "is required")
		}
	} else if !utf8.ValidString(t.Model) {
		bad(p+".model", "%q is not valid UTF-8", t.Model)
	} else if i := strings.IndexFunc(t.Model, func(r rune) bool {
		// Zl and Zp are line breaks too (U+2028, U+2029).
		return unicode.IsControl(r) || unicode.In(r, unicode.Zl, unicode.Zp)
	}); i >= 0 {
		// The model is sent to the server and may end up in labels and
		// log lines, where such a character would forge or break them.
		r, _ := utf8.DecodeRuneInString(t.Model[i:])
		bad(p+".model", "%q holds control character %U", t.Model, r)
	}
	oneOf(t.API, p+".api", bad, openai.APIs[:])
	oneOf(t.Dialect, p+".dialect", bad, engine.Dialects[:])
	oneOf(t.PromptFormat, p+".prompt_format", bad, openai.PromptFormats[:])
	if t.PromptFormat == openai.PromptFormatTokenIDs && t.API != openai.APICompletions {
		bad(p+".prompt_format", "token_ids needs api: completions")
	}
	if t.tokenizerSet && t.PromptFormat != openai.PromptFormatTokenIDs {
		// Text prompts are words that are one token each in every
		// supported tokenizer: a tokenizer there would change nothing.
		bad(p+".tokenizer", "is used only with prompt_format: token_ids (text prompts need none)")
	}
	if t.RequestTimeout <= 0 {
		bad(p+".request_timeout", "must be positive")
	}
	if err := t.HTTPClientConfig.Validate(); err != nil {
		bad(p+".http_client_config", "%v", err)
	}
	validateCacheSize(t, p, bad)
	if c := t.Cache.ModelCeilingTokens; c != 0 && (c < MinModelCeilingTokens || c > replay.MaxModelCeilingTokens) {
		bad(p+".cache.model_ceiling_tokens", "must be from %d to %d tokens (0 is the default, %d), got %d",
			MinModelCeilingTokens, int64(replay.MaxModelCeilingTokens), replay.DefaultModelCeilingTokens, c)
	}
	oneOf(t.Cache.Observed, p+".cache.observed", bad, engine.ObservedSources[:])
	validateReconcile(t, p, bad)
	if w := t.Cache.EstimateWindow; w != 0 && (w < MinEstimateWindow || w > MaxEstimateWindow) {
		bad(p+".cache.estimate_window", "must be between %v and %v, got %v", model.Duration(MinEstimateWindow), model.Duration(MaxEstimateWindow), model.Duration(w))
	}
	if t.Cache.MetricsURL != "" {
		validateURL(t.Cache.MetricsURL, p+".cache.metrics_url", bad)
	}
	validateKVEvents(t, p, bad)
	if t.SessionHeader != "" {
		if err := openai.CheckSessionHeader(t.SessionHeader); err != nil {
			bad(p+".session_header", "%v", err)
		}
	}
	validateIsolation(t, p, bad)
	if t.Cache.Observed == engine.ObservedServerMetrics {
		if t.Cache.MetricsURL == "" && t.Emulate == nil {
			bad(p+".cache.metrics_url", "is required with observed: server_metrics")
		}
		if !engine.For(t.Dialect).CountsCachedTokens() {
			bad(p+".cache.observed", "server_metrics needs a dialect whose server counts cached tokens (%s), got %q",
				joinValues(engine.CountingCachedTokens()), t.Dialect)
		}
	}
}

// validateIsolation checks cache.isolate against what the target's engine
// takes. A salt the engine cannot take is refused rather than warned
// about: the user asked for numbers that other traffic cannot move, and
// the exporter could not keep that promise.
func validateIsolation(t *Target, p string, bad func(string, string, ...any)) {
	c := t.Cache
	if !c.Isolate {
		if c.IsolationEpoch != "" {
			bad(p+".cache.isolation_epoch", "applies only with isolate: true")
		}
		return
	}
	chat := t.API == openai.APIChat
	field := engine.For(t.Dialect).CacheSaltField(chat)
	if field == "" {
		bad(p+".cache.isolate", "dialect %s takes no cache salt on %s, so its prefix cache cannot be kept apart from other clients' (dialects that take one there: %s)",
			t.Dialect, t.API, joinValues(engine.TakingCacheSalt(chat)))
		return
	}
	if _, ok := t.ExtraBody[field]; ok {
		bad(p+".extra_body."+field, "is set by cache.isolate: true; leave it out")
	}
	if !utf8.ValidString(c.IsolationEpoch) || len(c.IsolationEpoch) > maxIsolationEpoch {
		bad(p+".cache.isolation_epoch", "must be valid UTF-8 of at most %d bytes", maxIsolationEpoch)
	}
}

// maxIsolationEpoch bounds cache.isolation_epoch: it is hashed, and a
// name or a date is all it needs to hold.
const maxIsolationEpoch = 256

func validateWorkload(w *Workload, p string, bad func(string, string, ...any)) {
	s := w.Synthesis
	knobs := w.Knobs()
	err := knobs.ValidateNamed(func(key string) string {
		if key == "block_size" {
			return p + ".block_size:"
		}
		return p + ".synthesis." + key + ":"
	})
	badLines(err, bad)
	if g := w.SharedPrefix(); g != nil {
		_, arrivalsSpelled := w.Generate.arrivalsKey()
		if w.Generate.Arrivals != "" && w.Generate.Arrival != "" {
			bad(p+".generate.arrival", "cannot be given with arrivals: it is the older spelling of the same key")
		}
		err := g.Validate(func(key string) string {
			if key == "arrivals" {
				key = arrivalsSpelled // the spelling the user wrote
			}
			return p + ".generate." + key + ":"
		})
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				path, msg, _ := strings.Cut(line, ": ")
				if path != p+".generate.block_size" { // told above, as block_size
					bad(path, "%s", msg)
				}
			}
		} else {
			validateGeneratedSynthesis(g, s, p, bad)
		}
	}
	oneOf(w.Loop, p+".loop", bad, replay.LoopModes[:])
	if w.MaxInFlight < 1 || w.MaxInFlight > MaxInFlightLimit {
		bad(p+".max_in_flight", "must be from 1 to %d, got %d", MaxInFlightLimit, w.MaxInFlight)
	}
	oneOf(w.OnSaturation, p+".on_saturation", bad, replay.SaturationPolicies[:])
	if w.MaxQueueLag != 0 && w.OnSaturation != replay.SaturationQueue {
		bad(p+".max_queue_lag", "applies only with on_saturation: queue")
	}
	validateSchedule(w, p, bad)
	validateSLO(w.SLO, p+".slo", bad)
	validateAbandon(w.Abandon, p+".abandon", bad)
	if w.Prompts.Reproducible && w.Loop != replay.LoopOnce {
		bad(p+".prompts.reproducible", "applies only with loop: once (repeat sends the same prompts every pass already; fresh sends new ones by design)")
	}
	if w.Shard.Count < 1 {
		bad(p+".shard.count", "must be at least 1, got %d", w.Shard.Count)
	} else if w.Shard.Index < 0 || w.Shard.Index >= w.Shard.Count {
		bad(p+".shard.index", "must be in 0..%d, got %d", w.Shard.Count-1, w.Shard.Index)
	}
}

// validateGeneratedSynthesis checks what synthesis makes of generated
// rows at their longest: rows a request can hold, ids within the
// generator's bound, sessions within the time axis.
func validateGeneratedSynthesis(g *synth.SharedPrefix, s Synthesis, p string, bad func(string, string, ...any)) {
	in, out := g.LongestRow()
	grow, key := s.PrefixLenMultiplier, "prefix_len_multiplier"
	if s.PromptLenMultiplier > grow {
		grow, key = s.PromptLenMultiplier, "prompt_len_multiplier"
	}
	if grow > 1 {
		if in*grow > synth.MaxRowTokens && (s.MaxISL == 0 || s.MaxISL > synth.MaxRowTokens) {
			bad(p+".synthesis."+key, "%v makes generated prompts of up to %.0f tokens, more than the %d a request holds (max_isl caps them)", grow, in*grow, synth.MaxRowTokens)
		}
		if ids := g.HeldIDs() * grow; ids > synth.MaxGeneratedIDs {
			bad(p+".synthesis."+key, "%v makes generated rows holding up to %.3g hash ids, more than %d", grow, ids, synth.MaxGeneratedIDs)
		}
	}
	if m := s.OutputLenMultiplier; m > 1 && out*m > synth.MaxRowTokens && (s.MaxOSL == 0 || s.MaxOSL > synth.MaxRowTokens) {
		bad(p+".synthesis.output_len_multiplier", "%v makes generated answers of up to %.0f tokens, more than the %d a request holds (max_osl caps them)", m, out*m, synth.MaxRowTokens)
	}
	if sp := s.SpeedupRatio; sp > 0 && sp < 1 && g.LastArrival()/sp > synth.MaxGeneratedSpan {
		bad(p+".synthesis.speedup_ratio", "%v stretches the generated sessions over more than 100 years", sp)
	}
}

// validateSchedule checks a workload's schedule (replay's rules, at their
// YAML paths) and what it excludes among the workload's other keys.
func validateSchedule(w *Workload, p string, bad func(string, string, ...any)) {
	s, sp := w.Schedule, p+".schedule"
	badLines(s.Replay(w.Seed).ValidateNamed(func(key string) string {
		if key == "" {
			return sp + ":"
		}
		return sp + "." + key + ":"
	}), bad)
	if s.Users > 0 && s.Users <= replay.MaxUsers && s.Users > w.MaxInFlight && w.MaxInFlight >= 1 {
		bad(sp+".users", "%d users need max_in_flight %d at least, got %d", s.Users, s.Users, w.MaxInFlight)
	}
	if (s.Rate != 0 || s.Users != 0) && w.Synthesis.SpeedupRatio != 1 {
		bad(p+".synthesis.speedup_ratio", "has no effect with a schedule of its own: the trace's timestamps are not used (set the rate instead)")
	}
}

// badLines tells each line of err, a component's problems each named
// "path: reason" (a ValidateNamed of path+":"), at its path.
func badLines(err error, bad func(string, string, ...any)) {
	if err == nil {
		return
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		path, msg, _ := strings.Cut(line, ": ")
		bad(path, "%s", msg)
	}
}

// validateURL checks a base URL without ever echoing its userinfo, which may
// hold a password.
// validateTracingURL checks an OTLP/HTTP endpoint: http or https with a
// host, the path that of the traces (/v1/traces on a collector).
func validateTracingURL(raw, path string, bad func(string, string, ...any)) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		bad(path, "not a valid URL")
	case u.Scheme != "http" && u.Scheme != "https":
		bad(path, "%s: scheme must be http or https (OTLP over HTTP)", u.Redacted())
	case u.Hostname() == "":
		bad(path, "%s: has no host", u.Redacted())
	}
}

func validateURL(raw, path string, bad func(string, string, ...any)) {
	u, err := url.Parse(raw)
	if err != nil {
		// The error quotes the input, password included: name the part.
		if errors.As(err, new(*url.Error)) && strings.Contains(err.Error(), "invalid port") {
			bad(path, "not a valid URL: the port is not a number from 1 to 65535")
		} else {
			bad(path, "not a valid URL")
		}
		return
	}
	// url.Parse takes any run of digits as a port; the dialer would fail
	// on every request, so say so at load time. No port means the default.
	port, portOK := u.Port(), true
	if port != "" {
		n, err := strconv.ParseUint(port, 10, 16)
		portOK = err == nil && n > 0
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		bad(path, "%s: scheme must be http or https", u.Redacted())
	case u.Hostname() == "":
		bad(path, "%s: has no host", u.Redacted())
	case !portOK:
		bad(path, "%s: port %q is not a number from 1 to 65535", u.Redacted(), port)
	case !strings.HasSuffix(path, "metrics_url"):
		if base, ok := baseOf(u); ok {
			bad(path, "%s: give the base URL, %s: the exporter adds /v1 and the API's path", u.Redacted(), base)
		}
	}
}

func oneOf[T ~string](v T, path string, bad func(string, string, ...any), allowed []T) {
	if !slices.Contains(allowed, v) {
		bad(path, "%q is not one of %s", v, joinValues(allowed))
	}
}

// joinValues lists a closed set's values for a message: "a, b, c".
func joinValues[T ~string](values []T) string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// validateCacheSize checks a target's configured KV cache against the
// bounds a layout read from a server must keep (engine.CheckLayout): no
// server has more, and within them the model's arithmetic cannot
// overflow.
func validateCacheSize(t *Target, p string, bad func(string, string, ...any)) {
	size, blocks := t.Cache.BlockSize, t.Cache.CapacityBlocks
	perBlock := 1 // what a block holds at least
	switch {
	case size.Auto():
	case size.N < 1:
		bad(p+".cache.block_size", "must be auto or at least 1, got %d", size.N)
	case size.N > engine.MaxBlockSize:
		bad(p+".cache.block_size", "must be auto or at most %d tokens, got %d", engine.MaxBlockSize, size.N)
	default:
		perBlock = size.N
	}
	switch {
	case blocks.Auto():
	case blocks.N < 0:
		bad(p+".cache.capacity_blocks", "must be auto or ≥ 0 (0 is infinite), got %d", blocks.N)
	case blocks.N > engine.MaxCapacityTokens/perBlock:
		bad(p+".cache.capacity_blocks", "must hold at most %d tokens, got %d blocks of %d", int64(engine.MaxCapacityTokens), blocks.N, perBlock)
	}
}
