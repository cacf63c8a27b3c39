package store

import "errors"

// The errors a Store's callers branch on (errors.Is); every other error
// says what failed and wraps etcd's, or is a *record.FieldError for bad
// input, or wraps one of record's (record.ErrNotFound,
// record.ErrAlreadyExists).
var (
	// ErrGuard is returned by UpdateIf and UpdateFrom when their guard
	// compares fail (for the prober: its leadership fence no longer holds).
	// Nothing was written.
	ErrGuard = errors.New("write guard failed")

	// ErrLeaseLost means the lease no longer exists in etcd (expired, revoked,
	// or etcd was restored without it), or the record is under another one
	// (KeepAliveAs): the registration must be made again. LeaseBackend
	// reports it as lease.ErrLeaseLost.
	ErrLeaseLost = errors.New("lease lost")

	// ErrNotOwner means the secret given is not the registration's: the
	// caller may not keep it alive, replace it or deregister it as its owner.
	// Nothing was written.
	ErrNotOwner = errors.New("the secret is not this registration's")

	// ErrPageExpired means a listing cannot go on at the revision of its first
	// page: etcd compacted it, or was restored (another epoch). List again from
	// the first page.
	ErrPageExpired = errors.New("listing expired")

	// ErrInvalidConfig is wrapped by every error of Config.Validate, and so of
	// New (see package configerr).
	ErrInvalidConfig = errors.New("store: invalid config")
)
