package lease

import "errors"

// The errors a Keeper's callers and a Backend's implementers branch on
// (errors.Is).
var (
	// ErrClosed is returned by a Keeper's methods after Close.
	ErrClosed = errors.New("registration closed")

	// ErrLeaseLost is what Backend.KeepAlive wraps when the lease no longer
	// exists and the instance must be registered again. It is the Backend's
	// contract: a backend translates its own finding into it (store's
	// LeaseBackend from store.ErrLeaseLost, the SDK's from KeepAlive's lost
	// answer).
	ErrLeaseLost = errors.New("lease lost")

	// ErrInvalidConfig is wrapped by every error of Config.Validate, and
	// so of Start (see package configerr). A TTL outside record's bounds
	// also wraps record.ErrInvalid, as it did before Config had a Validate.
	ErrInvalidConfig = errors.New("lease: invalid config")
)
