package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/leasepool"
)

// KeepAliveAs renews, once, the lease of the registration service/id,
// held by sec, and returns its remaining TTL. It renews only a lease a
// registration is under: the record must be under leaseID (else
// ErrLeaseLost: an old lease of the owner, or no record at all) and sec
// must be its owner's (else ErrNotOwner). An election session or any
// other lease is never renewed.
func (s *Store) KeepAliveAs(ctx context.Context, sec, service, id string, leaseID int64) (time.Duration, error) {
	key := s.keys.Instance(service, id)
	ikv, skv, _, err := s.read(ctx, service, id)
	if err != nil {
		return 0, fmt.Errorf("keep lease %x of %s alive: %w", leaseID, key, err)
	}
	if ikv == nil {
		return 0, fmt.Errorf("keep lease %x of %s alive: no record: %w", leaseID, key, ErrLeaseLost)
	}
	if !s.owns(sec, service, id, skv) {
		return 0, fmt.Errorf("keep lease %x of %s alive: %w", leaseID, key, ErrNotOwner)
	}
	if ikv.Lease != leaseID {
		return 0, fmt.Errorf("keep lease %x of %s alive: the record is under another lease: %w", leaseID, key, ErrLeaseLost)
	}
	ttl, err := s.renewLease(ctx, leaseID)
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, leasepool.ErrNotFound) {
			return 0, fmt.Errorf("keep lease %x alive: %w", leaseID, ErrLeaseLost)
		}
		return 0, fmt.Errorf("keep lease %x alive: %w", leaseID, err)
	}
	if ttl <= 0 {
		return 0, fmt.Errorf("keep lease %x alive: %w", leaseID, ErrLeaseLost)
	}
	return time.Duration(ttl) * time.Second, nil
}

// renewLease renews leaseID once: on the shared stream if the Store has
// one, else on a stream of its own.
func (s *Store) renewLease(ctx context.Context, leaseID int64) (int64, error) {
	if s.renew != nil {
		return s.renew.Renew(ctx, leaseID)
	}
	resp, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(leaseID))
	if err != nil {
		return 0, err
	}
	return resp.TTL, nil
}
