package leasepool

import "errors"

// The errors a Pool's and a Renewer's callers branch on (errors.Is).
var (
	// ErrClosed is returned by a Renewer or Pool that was closed.
	ErrClosed = errors.New("leasepool: closed")

	// ErrNotFound means etcd does not know the lease (expired, revoked, or lost
	// in a restore): renewing it cannot help.
	ErrNotFound = errors.New("lease not found")

	// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
	// of New (see package configerr).
	ErrInvalidConfig = errors.New("leasepool: invalid config")
)
