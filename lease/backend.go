package lease

import (
	"context"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Grant is a successful registration.
type Grant struct {
	LeaseID  int64
	TTL      time.Duration
	Revision int64
	// Secret is the registration's secret as the backend confirmed it
	// (the one asked for, or a new one if none was).
	Secret string
}

// Owner names one registration and proves it is the caller's: the record
// service/ID under LeaseID, and the secret its Register returned.
type Owner struct {
	Service, ID string
	LeaseID     int64
	Secret      string
}

// Backend is where registrations are written. Implementations must be safe
// for concurrent use; errors wrap record.ErrInvalid or record.ErrAlreadyExists
// when retrying cannot help, and ErrLeaseLost when the lease is gone.
type Backend interface {
	// Register stores inst under a new lease of ttl, owned by secret (a
	// registration secret; empty asks the backend for a new one). With
	// the secret of a live or lost registration of the same id it
	// replaces that registration, keeping its lifecycle and health.
	Register(ctx context.Context, inst *registryv1.Instance, ttl time.Duration, secret string) (Grant, error)
	// KeepAlive renews o's lease once and returns its remaining TTL; only
	// the lease o's record is under, and only with its secret.
	KeepAlive(ctx context.Context, o Owner) (time.Duration, error)
	// SetLifecycle writes the lifecycle of service/id with compare-and-swap.
	SetLifecycle(ctx context.Context, service, id string, lc registryv1.Lifecycle, reason string) error
	// Deregister deletes o's record if it is still under o.LeaseID, and
	// revokes that lease.
	Deregister(ctx context.Context, o Owner) error
}

// DrainWaiter is a Backend that can tell when every live subscriber of a
// service has applied the last DRAINING it wrote of service/id. Close
// waits on it instead of sleeping the whole drain grace: the grace then
// only bounds the wait.
type DrainWaiter interface {
	// WaitDrained returns nil once every live subscriber of service has
	// applied the backend's last DRAINING write of service/id, or an
	// error when they have not by the time ctx ends, or it cannot tell.
	WaitDrained(ctx context.Context, service, id string) error
}
