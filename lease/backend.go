package lease

import (
	"context"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// ErrLeaseLost is what Backend.KeepAlive wraps when the lease no longer
// exists and the instance must be registered again.
var ErrLeaseLost = store.ErrLeaseLost

// Grant is a successful registration.
type Grant struct {
	LeaseID  int64
	TTL      time.Duration
	Revision int64
}

// Backend is where registrations are written. Implementations must be safe
// for concurrent use; errors wrap record.ErrInvalid or record.ErrAlreadyExists
// when retrying cannot help, and ErrLeaseLost when the lease is gone.
type Backend interface {
	// Register stores inst under a new lease of ttl.
	Register(ctx context.Context, inst *registryv1.Instance, ttl time.Duration) (Grant, error)
	// KeepAlive renews the lease once and returns its remaining TTL.
	KeepAlive(ctx context.Context, leaseID int64) (time.Duration, error)
	// SetLifecycle writes the lifecycle of service/id with compare-and-swap.
	SetLifecycle(ctx context.Context, service, id string, lc registryv1.Lifecycle, reason string) error
	// Deregister deletes service/id if it is still under leaseID, and
	// revokes the lease.
	Deregister(ctx context.Context, service, id string, leaseID int64) error
}

// NewEtcdBackend returns a Backend that writes through s straight to etcd.
func NewEtcdBackend(s *store.Store) Backend { return etcdBackend{s} }

type etcdBackend struct{ s *store.Store }

func (b etcdBackend) Register(ctx context.Context, inst *registryv1.Instance, ttl time.Duration) (Grant, error) {
	r, err := b.s.Register(ctx, inst, ttl)
	if err != nil {
		return Grant{}, err
	}
	return Grant{LeaseID: r.LeaseID, TTL: r.TTL, Revision: r.Revision}, nil
}

func (b etcdBackend) KeepAlive(ctx context.Context, leaseID int64) (time.Duration, error) {
	return b.s.KeepAlive(ctx, leaseID)
}

func (b etcdBackend) SetLifecycle(ctx context.Context, service, id string, lc registryv1.Lifecycle, reason string) error {
	_, _, err := b.s.SetLifecycle(ctx, service, id, lc, reason)
	return err
}

func (b etcdBackend) Deregister(ctx context.Context, service, id string, leaseID int64) error {
	_, _, err := b.s.Deregister(ctx, service, id, leaseID)
	return err
}
