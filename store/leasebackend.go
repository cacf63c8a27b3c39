package store

import (
	"context"
	"errors"
	"time"

	"github.com/regcluster/registry/lease"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// LeaseBackend is a lease.Backend that writes through a Store straight to
// etcd, for a Go program that holds an etcd client (the SDK's backend goes
// through regnode's API instead). It lives here, not in package lease, so
// that the keeper, and the SDK built on it, link nothing of etcd.
type LeaseBackend struct{ s *Store }

var _ lease.Backend = (*LeaseBackend)(nil)

// NewLeaseBackend returns the lease.Backend of s.
func NewLeaseBackend(s *Store) *LeaseBackend { return &LeaseBackend{s: s} }

// Register implements lease.Backend with RegisterAs.
func (b *LeaseBackend) Register(ctx context.Context, inst *registryv1.Instance, ttl time.Duration, secret string) (lease.Grant, error) {
	r, err := b.s.RegisterAs(ctx, secret, inst, ttl)
	if err != nil {
		return lease.Grant{}, err
	}
	return lease.Grant{LeaseID: r.LeaseID, TTL: r.TTL, Revision: r.Revision, Secret: r.Secret}, nil
}

// KeepAlive implements lease.Backend with KeepAliveAs; its ErrLeaseLost
// also matches lease.ErrLeaseLost.
func (b *LeaseBackend) KeepAlive(ctx context.Context, o lease.Owner) (time.Duration, error) {
	ttl, err := b.s.KeepAliveAs(ctx, o.Secret, o.Service, o.ID, o.LeaseID)
	if errors.Is(err, ErrLeaseLost) {
		return 0, leaseLost{err}
	}
	return ttl, err
}

// SetLifecycle implements lease.Backend with SetLifecycle.
func (b *LeaseBackend) SetLifecycle(ctx context.Context, service, id string, lc registryv1.Lifecycle, reason string) error {
	_, _, err := b.s.SetLifecycle(ctx, service, id, lc, reason)
	return err
}

// Deregister implements lease.Backend with DeregisterAs.
func (b *LeaseBackend) Deregister(ctx context.Context, o lease.Owner) error {
	_, _, err := b.s.DeregisterAs(ctx, o.Secret, o.Service, o.ID, o.LeaseID)
	return err
}

// leaseLost is the store's ErrLeaseLost (still reachable by Unwrap) that
// also is the keeper's lease.ErrLeaseLost, with the store's message.
type leaseLost struct{ err error }

func (e leaseLost) Error() string        { return e.err.Error() }
func (e leaseLost) Unwrap() error        { return e.err }
func (e leaseLost) Is(target error) bool { return target == lease.ErrLeaseLost }
