package etcdtest

import "go.uber.org/zap"

// QuietLogger is a zap logger for etcd clients in tests: errors only.
func QuietLogger() *zap.Logger {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	l, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return l
}
