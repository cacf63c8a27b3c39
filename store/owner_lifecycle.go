package store

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// SetLifecycleAs is SetLifecycle made by the registration's owner: only
// with the secret Register returned for service/id, and only while that
// registration is still the one saved (ErrNotOwner otherwise, nothing
// written). It is how an instance drains itself before it deregisters
// (a token of role register may do that, not drain another's).
func (s *Store) SetLifecycleAs(ctx context.Context, sec, service, id string, lc registryv1.Lifecycle, reason string) (*registryv1.Instance, int64, error) {
	if _, ok := registryv1.Lifecycle_name[int32(lc)]; !ok || lc == registryv1.Lifecycle_LIFECYCLE_UNSPECIFIED {
		return nil, 0, &record.FieldError{Field: "lifecycle", Reason: fmt.Sprintf("unknown value %d", lc)}
	}
	if len(reason) > record.MaxReasonLen {
		return nil, 0, &record.FieldError{Field: "reason", Reason: fmt.Sprintf("%d bytes, at most %d", len(reason), record.MaxReasonLen)}
	}
	ikv, skv, _, err := s.read(ctx, service, id)
	if err != nil {
		return nil, 0, fmt.Errorf("set lifecycle of %s/%s: %w", service, id, err)
	}
	if ikv == nil {
		return nil, 0, fmt.Errorf("%s/%s: %w", service, id, record.ErrNotFound)
	}
	if !s.owns(sec, service, id, skv) {
		return nil, 0, fmt.Errorf("set lifecycle of %s/%s: %w", service, id, ErrNotOwner)
	}
	// The owner is in the saved state: unchanged state, unchanged owner.
	guard := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.StateKey(service, id)), "=", skv.ModRevision)}
	inst, rev, err := s.UpdateIf(ctx, service, id, guard, func(in *registryv1.Instance) error {
		in.Lifecycle = lc
		in.LifecycleReason = reason
		return nil
	})
	if errors.Is(err, ErrGuard) {
		// Replaced meanwhile, by its owner or a takeover: try again.
		return s.SetLifecycleAs(ctx, sec, service, id, lc, reason)
	}
	return inst, rev, err
}
