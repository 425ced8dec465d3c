package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
)

// logFlags are the contract's --log.level and --log.format.
type logFlags struct {
	level  string
	format string
}

// newLogger returns a go-kit logger writing logfmt or JSON to w, filtered at
// the given level, with a timestamp and the caller on every line.
func newLogger(f logFlags, w io.Writer) (log.Logger, slog.Level, error) {
	var l log.Logger
	switch f.format {
	case "logfmt":
		l = log.NewLogfmtLogger(log.NewSyncWriter(w))
	case "json":
		l = log.NewJSONLogger(log.NewSyncWriter(w))
	default:
		return nil, 0, fmt.Errorf("--log.format: %q is not logfmt or json", f.format)
	}
	var opt level.Option
	var min slog.Level
	switch f.level {
	case "debug":
		opt, min = level.AllowDebug(), slog.LevelDebug
	case "info":
		opt, min = level.AllowInfo(), slog.LevelInfo
	case "warn":
		opt, min = level.AllowWarn(), slog.LevelWarn
	case "error":
		opt, min = level.AllowError(), slog.LevelError
	default:
		return nil, 0, fmt.Errorf("--log.level: %q is not debug, info, warn or error", f.level)
	}
	l = log.With(l, "ts", log.TimestampFormat(time.Now, time.RFC3339Nano), "caller", log.Caller(5))
	return level.NewFilter(l, opt), min, nil
}

// slogBridge is a slog.Handler that writes through a go-kit logger, so that
// libraries speaking slog (exporter-toolkit) log like the rest of the
// program.
type slogBridge struct {
	logger log.Logger
	min    slog.Level
	prefix string // group prefix for keys, "a.b."
}

func newSlogBridge(l log.Logger, min slog.Level) *slog.Logger {
	return slog.New(&slogBridge{logger: l, min: min})
}

func (h *slogBridge) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }

func (h *slogBridge) Handle(_ context.Context, r slog.Record) error {
	kv := make([]any, 0, 2+2*r.NumAttrs())
	kv = append(kv, "msg", r.Message)
	r.Attrs(func(a slog.Attr) bool {
		kv = h.appendAttr(kv, h.prefix, a)
		return true
	})
	return goKitLevel(h.logger, r.Level).Log(kv...)
}

func (h *slogBridge) appendAttr(kv []any, prefix string, a slog.Attr) []any {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		for _, g := range v.Group() {
			kv = h.appendAttr(kv, prefix+a.Key+".", g)
		}
		return kv
	}
	return append(kv, prefix+a.Key, v.Any())
}

func (h *slogBridge) WithAttrs(attrs []slog.Attr) slog.Handler {
	kv := make([]any, 0, 2*len(attrs))
	for _, a := range attrs {
		kv = h.appendAttr(kv, h.prefix, a)
	}
	return &slogBridge{logger: log.With(h.logger, kv...), min: h.min, prefix: h.prefix}
}

func (h *slogBridge) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &slogBridge{logger: h.logger, min: h.min, prefix: h.prefix + name + "."}
}

func goKitLevel(l log.Logger, lv slog.Level) log.Logger {
	switch {
	case lv >= slog.LevelError:
		return level.Error(l)
	case lv >= slog.LevelWarn:
		return level.Warn(l)
	case lv >= slog.LevelInfo:
		return level.Info(l)
	default:
		return level.Debug(l)
	}
}
