package node

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapLogger is the etcd client's logger: etcd logs through zap, and its
// chatter below warn is not ours to show.
func zapLogger(l zapcore.Level) *zap.Logger {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(l)
	cfg.Sampling = nil
	lg, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return lg
}
