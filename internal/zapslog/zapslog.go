// Package zapslog carries the zap logs of etcd's server and client into a
// regnode's slog logger, so a regnode writes one log format, with etcd's
// known noise turned down.
package zapslog

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore forwards zap entries to slog. It drops the errors etcd logs
// about its own listeners while it is being closed: they are the normal
// sound of a clean shutdown, not failures (and they come with stack traces).
type slogCore struct {
	log     *slog.Logger
	level   zapcore.Level
	fields  []slog.Attr
	closing *atomic.Bool
}

// New returns a zap logger writing to log at level ("debug".."error") and
// above. While closing is true, etcd's listener-closed errors are dropped;
// closing may be nil.
func New(log *slog.Logger, level string, closing *atomic.Bool) *zap.Logger {
	if closing == nil {
		closing = &atomic.Bool{}
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		lvl = zapcore.WarnLevel
	}
	return zap.New(&slogCore{log: log.With("component", "etcd"), level: lvl, closing: closing})
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.level }

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	cp := *c
	cp.fields = append(append([]slog.Attr(nil), c.fields...), attrs(fs)...)
	return &cp
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	if c.closing.Load() && (strings.Contains(e.Message, "serving from embedded etcd failed") ||
		strings.Contains(e.Message, "grpc server due to error")) {
		return nil
	}
	lvl := slog.LevelInfo
	switch {
	case benign(e.Message):
		lvl = slog.LevelDebug
	case e.Level >= zapcore.ErrorLevel:
		lvl = slog.LevelError
	case e.Level == zapcore.WarnLevel:
		lvl = slog.LevelWarn
	case e.Level == zapcore.DebugLevel:
		lvl = slog.LevelDebug
	}
	all := append(append([]slog.Attr(nil), c.fields...), attrs(fs)...)
	c.log.LogAttrs(context.Background(), lvl, e.Message, all...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

func attrs(fs []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fs {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		out = append(out, slog.Any(k, v))
	}
	return out
}

// benign are etcd's start-up warnings about choices regnode makes on
// purpose for a single local member (one port for gRPC and HTTP, the name
// "default", simple auth tokens with auth off), and the client's report of
// each failed attempt of a call whose error the caller gets and handles:
// shown at debug only.
func benign(msg string) bool {
	for _, s := range []string{"single port", "default name", "simple token", "retrying of unary invoker failed"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
