package store

import "errors"

// ErrGuard is returned by UpdateIf when its guard compares fail (for the
// prober: its leadership fence no longer holds).
var ErrGuard = errors.New("write guard failed")

// ErrLeaseLost means the lease no longer exists in etcd (expired, revoked,
// or etcd was restored without it): the registration must be made again.
var ErrLeaseLost = errors.New("lease lost")

// ErrNotOwner means the secret given is not the registration's: the
// caller may not keep it alive, replace it or deregister it as its owner.
// Nothing was written.
var ErrNotOwner = errors.New("the secret is not this registration's")
