package store

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Deregister deletes service/id and its saved state as an operator, who
// holds no secret, and revokes the lease the record was under, and only
// that lease. If leaseID is non-zero it deletes only while the record is
// under that lease, so a stale handle cannot remove a newer registration;
// deleted is false when there was nothing (of that lease) to delete. With
// no record at all, the saved state is deleted still. Who may act as an
// operator is the caller's decision (the server's policy).
func (s *Store) Deregister(ctx context.Context, service, id string, leaseID int64) (deleted bool, rev int64, err error) {
	return s.deregister(ctx, "", false, service, id, leaseID)
}

// DeregisterAs is the owner's Deregister: sec must be the registration's
// secret, else it returns an error wrapping ErrNotOwner and writes
// nothing. With no record (a graceful end after a lost lease) it deletes
// the saved state if sec owns it, and otherwise nothing.
func (s *Store) DeregisterAs(ctx context.Context, sec, service, id string, leaseID int64) (deleted bool, rev int64, err error) {
	return s.deregister(ctx, sec, true, service, id, leaseID)
}

func (s *Store) deregister(ctx context.Context, sec string, asOwner bool, service, id string, leaseID int64) (deleted bool, rev int64, err error) {
	key := s.keys.Instance(service, id)
	skey := s.StateKey(service, id)
	for {
		ikv, skv, rev, err := s.read(ctx, service, id)
		if err != nil {
			return false, 0, fmt.Errorf("deregister %s: %w", key, err)
		}
		var stateRev int64
		if skv != nil {
			stateRev = skv.ModRevision
		}
		ours := !asOwner || s.owns(sec, service, id, skv)
		if ikv == nil {
			if !ours || skv == nil {
				return false, rev, nil // nothing of the caller's to delete
			}
			// Only while there is still no record and the state is as
			// read: a registration that lands meanwhile writes its own.
			tx, err := s.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), clientv3.Compare(clientv3.ModRevision(skey), "=", stateRev)).
				Then(clientv3.OpDelete(skey)).
				Commit()
			if err != nil {
				return false, 0, fmt.Errorf("deregister %s: delete its saved state: %w", key, err)
			}
			if !tx.Succeeded {
				continue
			}
			return false, tx.Header.Revision, nil
		}
		if !ours {
			return false, rev, fmt.Errorf("deregister %s: %w", key, ErrNotOwner)
		}
		if leaseID != 0 && ikv.Lease != leaseID {
			// A stale handle: the record is a newer registration's. The
			// lease it names is not revoked: nothing says it is the
			// caller's (it could be anyone's, the prober's session
			// included); if it is, it expires within its TTL.
			return false, rev, nil
		}
		tx, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", ikv.ModRevision), clientv3.Compare(clientv3.ModRevision(skey), "=", stateRev)).
			Then(clientv3.OpDelete(key), clientv3.OpDelete(skey)).
			Commit()
		if err != nil {
			return false, 0, fmt.Errorf("deregister %s: %w", key, err)
		}
		if !tx.Succeeded {
			continue
		}
		if ikv.Lease != 0 {
			s.revoke(clientv3.LeaseID(ikv.Lease))
		}
		return true, tx.Header.Revision, nil
	}
}
