package store

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// RemovalReason is the lifecycle reason a deregistration writes with the
// DRAINING mark it leaves before it deletes (see markRemoval).
const RemovalReason = "deregistering"

// Deregister deletes service/id and its saved state as an operator, who
// holds no secret, and revokes the lease the record was under, and only
// that lease. If leaseID is non-zero it deletes only while the record is
// under that lease, so a stale handle cannot remove a newer registration;
// deleted is false when there was nothing (of that lease) to delete. With
// no record at all, the saved state is deleted still. Who may act as an
// operator is the caller's decision (the server's policy).
//
// Every deletion is deliberate and says so in the watch stream: a record
// that is not DRAINING is first written DRAINING (compare-and-swap, in a
// revision of its own), then deleted, so a subscriber tells it from a lease
// expiry, which deletes a record that was not DRAINING (package lastresort
// keeps those as a last resort; this one it must not).
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
		markRev, ok, err := s.markRemoval(ctx, key, service, id, ikv, skv, stateRev)
		if err != nil {
			return false, 0, err
		}
		if !ok {
			continue // changed meanwhile: judge it again
		}
		recRev := ikv.ModRevision
		if markRev != 0 {
			recRev = markRev
			if skv != nil {
				stateRev = markRev
			}
		}
		tx, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", recRev), clientv3.Compare(clientv3.ModRevision(skey), "=", stateRev)).
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

// markRemoval leaves the mark of a deliberate removal on the record ikv
// (read with its saved state skv, at stateRev): it writes it DRAINING
// with reason RemovalReason, with compare-and-swap on both, in a revision
// before the delete's, so every subscriber's last view of the record is
// DRAINING. A record already DRAINING, or junk (no subscriber holds it),
// needs no mark: rev is then 0. Otherwise rev is the mark's revision, now
// the mod revision of the record and of the saved state (if there was
// one), which the delete compares. ok is false if either changed
// meanwhile: nothing was written.
func (s *Store) markRemoval(ctx context.Context, key, service, id string, ikv, skv *mvccpb.KeyValue, stateRev int64) (rev int64, ok bool, err error) {
	cur, derr := s.keys.Decode(key, ikv.Value, ikv.CreateRevision, ikv.ModRevision)
	if derr != nil || cur.GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_DRAINING {
		return 0, true, nil
	}
	next := proto.CloneOf(cur)
	next.Lifecycle, next.LifecycleReason = registryv1.Lifecycle_LIFECYCLE_DRAINING, RemovalReason
	record.StampRoutable(cur, next, s.now())
	val, err := record.Encode(next)
	if err != nil {
		return 0, false, fmt.Errorf("deregister %s: mark it: %w", key, err)
	}
	skey := s.StateKey(service, id)
	then := []clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithIgnoreLease())}
	if skv != nil {
		// The saved state follows the record (see StateKey); its owner
		// is written back unchanged.
		sval, err := encodeState(next, s.owner(service, id, skv))
		if err != nil {
			return 0, false, fmt.Errorf("deregister %s: mark it: %w", key, err)
		}
		then = append(then, clientv3.OpPut(skey, sval))
	}
	tx, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", ikv.ModRevision), clientv3.Compare(clientv3.ModRevision(skey), "=", stateRev)).
		Then(then...).
		Commit()
	if errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) {
		// etcd is out of space (NOSPACE): it refuses every put, the mark
		// included, and lets deletes through, which free space. The
		// delete goes unmarked: a follower may take it for a vanishing
		// (package lastresort), which only offers it while nothing else
		// is routable, for a bounded grace; refusing the delete would
		// keep the operator from freeing space.
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("deregister %s: mark it DRAINING before deleting: %w", key, err)
	}
	if !tx.Succeeded {
		return 0, false, nil
	}
	return tx.Header.Revision, true, nil
}
