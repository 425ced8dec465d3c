package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// emulated is an in-process emulated engine serving one target.
type emulated struct {
	fingerprint string
	url         string
	engine      *emulate.Engine
	cancel      context.CancelFunc
	wait        func() error
}

// emulatorSet is the part that runs the emulated engines, one per target
// with an emulate block.
type emulatorSet struct {
	*common
	units   *unitSet // a target's units stop before its engine
	running map[string]*emulated
}

func newEmulatorSet(c *common) *emulatorSet {
	return &emulatorSet{common: c, running: map[string]*emulated{}}
}

// keeps tells whether the engine running for target name, if any, serves
// cfg as it is.
func (s *emulatorSet) keeps(cfg *config.Config, name string) bool {
	e := s.running[name]
	t, ok := cfg.Target(name)
	return e != nil && ok && t.Emulate != nil && cfg.Fingerprint("target", name) == e.fingerprint
}

// build makes the engines cfg asks for and that do not run as asked:
// their caches and registries are allocated and checked here, before the
// swap; apply binds and serves them.
func (s *emulatorSet) build(cfg *config.Config) (map[string]*emulate.Engine, error) {
	engines := map[string]*emulate.Engine{}
	var errs []error
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		if t.Emulate == nil || s.keeps(cfg, t.Name) {
			continue
		}
		eng, err := emulate.New(emulateConfig(t))
		if err != nil {
			errs = append(errs, cfg.KeyError(fmt.Sprintf("targets[%d].emulate", i), err))
			continue
		}
		engines[t.Name] = eng
	}
	return engines, errors.Join(errs...)
}

// stop stops the engines next no longer asks for, or asks for
// differently, each after its target's units, so that none of their
// requests fails against a stopped engine and is counted as an error.
// With next nil (the shutdown) the units have drained already.
func (s *emulatorSet) stop(next *nextConfig) {
	for name, e := range s.running {
		if next != nil && s.keeps(next.cfg, name) {
			continue
		}
		if next != nil {
			s.units.stopTarget(name)
		}
		e.cancel()
		// A server cancelled at shutdown has nothing to report.
		if err := e.wait(); err != nil && next != nil {
			level.Warn(s.logger).Log("msg", "emulator stopped with an error", "target", name, "err", err)
		}
		delete(s.running, name)
	}
}

// apply serves the engines next built, each on a loopback port of its
// own, under unitCtx.
func (s *emulatorSet) apply(_, unitCtx context.Context, next *nextConfig) error {
	s.stop(next)
	cfg := next.cfg
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		if t.Emulate == nil || s.running[t.Name] != nil {
			continue
		}
		if err := s.start(unitCtx, cfg, t, next.engines[t.Name]); err != nil {
			return err
		}
	}
	return nil
}

// start serves eng, built for t, under unitCtx.
func (s *emulatorSet) start(unitCtx context.Context, cfg *config.Config, t *config.Target, eng *emulate.Engine) error {
	if eng == nil {
		return fmt.Errorf("target %s: emulate: no engine was built", t.Name)
	}
	// The endpoints are bound here, not at the build: an engine of a
	// changed configuration may take its predecessor's fixed port.
	if err := eng.BindKVEvents(); err != nil {
		return fmt.Errorf("target %s: %w", t.Name, err)
	}
	eng.LogTo(log.With(s.logger, "target", t.Name))
	ctx, cancel := context.WithCancel(unitCtx)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		return fmt.Errorf("target %s: emulate: %w", t.Name, err)
	}
	done := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		done <- eng.Serve(ctx, l)
	}()
	var once sync.Once
	var werr error
	s.running[t.Name] = &emulated{
		fingerprint: cfg.Fingerprint("target", t.Name),
		url:         "http://" + l.Addr().String(),
		engine:      eng,
		cancel:      cancel,
		wait:        func() error { once.Do(func() { werr = <-done }); return werr },
	}
	started := []any{"msg", "emulated engine started", "target", t.Name, "url", "http://" + l.Addr().String()}
	if ep := eng.KVEventsEndpoint(); ep != "" {
		started = append(started, "kv_events", ep)
	}
	level.Info(s.logger).Log(started...)
	// A llama.cpp engine holds one prompt per slot: bounded whatever its
	// capacity_blocks (which it does not take).
	unbounded := t.Emulate.CapacityBlocks == 0 && t.Emulate.Engine != emulate.PersonalityLlamaCpp
	if w := freshWorkloadOf(cfg, t.Name); unbounded && w != "" {
		level.Warn(s.logger).Log("msg", "the emulated engine's prefix cache is unbounded and a workload sends it new prompts every pass: its memory grows every pass; set emulate.capacity_blocks for long runs", "target", t.Name, "workload", w)
	}
	return nil
}

// url is where the engine of target answers, "" when it has none.
func (s *emulatorSet) url(target string) string {
	if e := s.running[target]; e != nil {
		return e.url
	}
	return ""
}

// baseURL is where a target answers: its url, or its emulator's.
func (s *emulatorSet) baseURL(t *config.Target) string {
	if t.Emulate != nil {
		return s.url(t.Name)
	}
	return t.URL
}

// emulateConfig is t's emulate block as the emulator takes it: the
// target's model unless the block names its own.
func emulateConfig(t *config.Target) emulate.Config {
	c := *t.Emulate
	c.Model = cmp.Or(c.Model, t.Model)
	return c
}

// freshWorkloadOf names a workload that replays forever against target
// with loop: fresh, or returns "".
func freshWorkloadOf(cfg *config.Config, target string) string {
	for _, w := range cfg.Workloads {
		if w.Loop == replay.LoopFresh && slices.Contains(w.Targets, target) {
			return w.Name
		}
	}
	return ""
}
