package embedded

import "errors"

// The errors callers branch on (errors.Is).
var (
	// ErrDataDirInUse means another process (or another member in this one)
	// holds the data directory. Two etcd members on one directory would corrupt
	// it, and etcd itself would block forever in bbolt's flock instead of
	// saying so.
	ErrDataDirInUse = errors.New("data directory is in use")

	// ErrInvalidConfig is wrapped by every error of Config.Validate, and so of
	// Start (see package configerr).
	ErrInvalidConfig = errors.New("embedded: invalid config")
)
