package sidecar

import (
	"io"
	"log/slog"
	"time"

	"github.com/go-logr/logr"

	"github.com/handoff-dev/handoff/config"
)

// newLogger is the sidecar's logger: one JSON object a line on w, at level
// and above (info: logr's V(0); debug: V(1) too; error: errors only), with
// the keys zap's production logger gave the sidecar before: "level"
// ("debug", "info" or "error"), "ts" (Unix time in
// seconds, a float), "logger" (the names given to WithName, joined by
// "/"), "msg", "error" (an Error's error, as its text), then the key/value
// pairs; a time.Duration is written as its String ("1.5s").
//
// It is log/slog's JSON handler under logr (logr.FromSlogHandler), in
// place of zap: zap and its sampler (448 KiB of counters at start) cost
// the idle sidecar about 1 MiB of resident memory (docs/performance.md,
// Footprint). Lines are not sampled, and carry no caller or stack trace.
func newLogger(w io.Writer, level config.LogLevel) logr.Logger {
	least := slog.LevelInfo
	switch level {
	case config.LogLevelDebug:
		least = slog.Level(-1) // logr's V(1)
	case config.LogLevelError:
		least = slog.LevelError
	}
	return logr.FromSlogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: least, ReplaceAttr: zapKeys}))
}

// zapKeys renames slog's built-in keys and values to zap's (newLogger).
func zapKeys(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.TimeKey:
		t := a.Value.Time()
		return slog.Float64("ts", float64(t.UnixNano())/float64(time.Second))
	case slog.LevelKey:
		// logr's V(n) is slog level -n: V(0) is info, V(1) and more debug.
		lvl, _ := a.Value.Any().(slog.Level)
		switch {
		case lvl >= slog.LevelError:
			return slog.String(slog.LevelKey, "error")
		case lvl < slog.LevelInfo:
			return slog.String(slog.LevelKey, "debug")
		}
		return slog.String(slog.LevelKey, "info")
	case "err": // logr's slog sink's key for the error of Error
		a.Key = "error"
	}
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
