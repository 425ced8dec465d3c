package cli

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	sloggokit "github.com/tjhop/slog-gokit"
)

// logFlags are the contract's --log.level and --log.format.
type logFlags struct {
	level  string
	format string
}

// newLogger returns a go-kit logger writing logfmt or JSON to w, filtered at
// the given level, with a timestamp and the caller on every line; and the
// same without the two, for newSlogBridge.
func newLogger(f logFlags, w io.Writer) (logger, base log.Logger, minLevel slog.Level, err error) {
	var l log.Logger
	switch f.format {
	case "logfmt":
		l = log.NewLogfmtLogger(log.NewSyncWriter(w))
	case "json":
		l = log.NewJSONLogger(log.NewSyncWriter(w))
	default:
		return nil, nil, 0, fmt.Errorf("--log.format: %q is not logfmt or json", f.format)
	}
	var opt level.Option
	switch f.level {
	case "debug":
		opt, minLevel = level.AllowDebug(), slog.LevelDebug
	case "info":
		opt, minLevel = level.AllowInfo(), slog.LevelInfo
	case "warn":
		opt, minLevel = level.AllowWarn(), slog.LevelWarn
	case "error":
		opt, minLevel = level.AllowError(), slog.LevelError
	default:
		return nil, nil, 0, fmt.Errorf("--log.level: %q is not debug, info, warn or error", f.level)
	}
	base = level.NewFilter(l, opt)
	l = log.With(l, "ts", log.TimestampFormat(time.Now, time.RFC3339Nano), "caller", log.Caller(5))
	return level.NewFilter(l, opt), base, minLevel, nil
}

// newSlogBridge returns a slog.Logger that writes through l, so that
// libraries speaking slog (exporter-toolkit, net/http's server errors) log
// like the rest of the program. base is the format and level filter without
// the ts and caller newLogger adds: slog-gokit adds the record's own caller
// and time, whose key is renamed to the program's "ts".
func newSlogBridge(base log.Logger, minLevel slog.Level) *slog.Logger {
	renamed := log.LoggerFunc(func(kv ...any) error {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == slog.TimeKey {
				kv[i] = "ts"
			}
		}
		return base.Log(kv...)
	})
	return slog.New(sloggokit.NewGoKitHandler(renamed, minLevel))
}
