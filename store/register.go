package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/internal/secret"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Registration is the outcome of a successful Register.
type Registration struct {
	LeaseID  int64
	TTL      time.Duration
	Revision int64
	Instance *registryv1.Instance
	// Secret is the registration's secret: what KeepAliveAs, DeregisterAs
	// and a later RegisterAs need. Only its hash is stored.
	Secret string
	// Replaced says this was a re-registration by the same owner:
	// it replaced its own record still alive under an older lease, or came
	// back after its lease was lost (its saved state was carried over).
	Replaced bool
}

// Register is RegisterAs with a new secret: a registration that can
// replace nothing alive.
func (s *Store) Register(ctx context.Context, in *registryv1.Instance, ttl time.Duration) (*Registration, error) {
	return s.RegisterAs(ctx, "", in, ttl)
}

// RegisterAs validates inst, grants a lease of ttl (0 means the default)
// and stores inst under it, owned by sec (a secret.New value; empty makes
// one). If the key is alive under another owner (a saved state that sec
// does not match), it returns an error wrapping record.ErrAlreadyExists
// and writes nothing; a record owned by sec, or a junk record, is
// replaced and its old lease revoked. Invalid input (a malformed sec
// included) returns a *record.FieldError and writes nothing. Only
// secret.Hash(sec) is stored, in the saved state; inst's incarnation is
// not stored and grants nothing.
//
// A registration by the same owner keeps the lifecycle, its
// reason and the health of the instance as they were, not as inst says:
// from the live record it replaces, or, when the lease was lost and the
// record is gone, from the saved state (see StateKey). So an instance an
// operator drained comes back DRAINING, and one the prober found
// UNAVAILABLE comes back UNAVAILABLE. Any other registration starts with
// inst's lifecycle and no health.
func (s *Store) RegisterAs(ctx context.Context, sec string, in *registryv1.Instance, ttl time.Duration) (*Registration, error) {
	if err := record.Validate(in); err != nil {
		return nil, err
	}
	if sec == "" {
		sec = secret.New()
	} else if err := secret.Valid(sec); err != nil {
		return nil, &record.FieldError{Field: "secret", Reason: err.Error()}
	}
	owner := secret.Hash(sec)
	if err := record.ValidTTL(ttl); err != nil {
		return nil, err
	}
	if ttl == 0 {
		ttl = record.DefaultTTL
	}
	base := proto.CloneOf(in)
	record.Normalize(base)
	base.Health = nil // written only by the prober
	base.ModRevision, base.CreateRevision = 0, 0
	base.Incarnation = "" // ownership is the secret, kept hashed in the saved state only
	base.RegisteredAt = timestamppb.New(s.now())
	key := s.keys.Instance(base.Service, base.Id)
	skey := s.StateKey(base.Service, base.Id)

	// The size is checked before a lease is taken, with the largest
	// lease ID, so a refused record takes none.
	base.LeaseId = math.MaxInt64
	if err := s.checkSize(key, base); err != nil {
		return nil, err
	}
	lease, err := s.grant(ctx, ttl)
	if err != nil {
		return nil, fmt.Errorf("grant %s lease for %s: %w", ttl, key, err)
	}
	base.LeaseId = int64(lease)
	// The record and its saved state as last read (at one revision). The
	// first attempt guesses a first registration, neither of them there,
	// so it takes one round trip; a wrong guess reads both in its Else.
	var ikvs, skvs []*mvccpb.KeyValue
	for {
		var stateRev int64
		var saved *registryv1.Instance
		if len(skvs) > 0 {
			stateRev = skvs[0].ModRevision
			if saved, err = decodeState(base.Service, base.Id, skvs[0].Value); err != nil {
				s.log.Warn("ignoring a saved state that does not decode", "key", skey, "err", err)
			}
		}
		inst := proto.CloneOf(base)
		var prev *registryv1.Instance // the live record replaced, if any: its routable_since carries over
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(skey), "=", stateRev)}
		var oldLease int64
		rereg := false // the same owner again: its live record, or its saved state after a lost lease
		ours := saved != nil && secret.Matches(sec, saved.Incarnation)
		if len(ikvs) == 0 {
			// First registration, or the lease was lost: the saved state
			// is all that is left of the previous record.
			if ours {
				s.carry(key, inst, saved)
				rereg = true
			}
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
		} else {
			kv := ikvs[0]
			old, derr := s.keys.Decode(key, kv.Value, kv.CreateRevision, kv.ModRevision)
			if derr == nil && !ours {
				s.unused(ttl, lease)
				return nil, fmt.Errorf("register %s: %w (alive under lease %x; replacing it needs its secret)", key, record.ErrAlreadyExists, old.LeaseId)
			}
			if derr != nil {
				s.junk(key, derr)
			} else {
				// Same owner (it lost track of its lease): the live record
				// holds the current lifecycle and health.
				s.carry(key, inst, old)
				prev = old
				rereg = true
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision))
			oldLease = kv.Lease
		}
		record.StampRoutable(prev, inst, s.now())
		val, err := record.Encode(inst)
		if err == nil {
			err = s.checkSize(key, inst)
		}
		if err != nil {
			s.unused(ttl, lease)
			return nil, err
		}
		sval, err := encodeState(inst, owner)
		if err != nil {
			s.unused(ttl, lease)
			return nil, err
		}
		resp, err := s.txn(ctx, txnOp{If: cmps,
			Then: []clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithLease(lease)), clientv3.OpPut(skey, sval)},
			Else: []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(skey)}})
		if err != nil {
			// It may have landed: the lease must not outlive the call.
			s.log.Warn("register write failed; revoking the lease it may have landed under", "key", key, "lease", fmt.Sprintf("%x", int64(lease)), "err", err)
			s.revoke(lease)
			return nil, fmt.Errorf("register %s: %w", key, err)
		}
		if !resp.Succeeded {
			// Not as read (or guessed): go again from what is there now.
			ikvs = resp.Responses[0].GetResponseRange().Kvs
			skvs = resp.Responses[1].GetResponseRange().Kvs
			continue
		}
		if oldLease != 0 && oldLease != int64(lease) {
			s.log.Info("registered again over its own live record; revoking the record's old lease", "key", key, "old", fmt.Sprintf("%x", oldLease), "lease", fmt.Sprintf("%x", int64(lease)))
			s.revoke(clientv3.LeaseID(oldLease))
		}
		reg := s.registered(inst, lease, ttl, resp.Revision)
		reg.Replaced, reg.Secret = rereg, sec
		return reg, nil
	}
}

// carry keeps from's lifecycle, reason and health on inst, unless that
// would make inst invalid (a saved state someone else wrote): then inst
// starts afresh.
func (s *Store) carry(key string, inst, from *registryv1.Instance) {
	kept := proto.CloneOf(inst)
	carry(kept, from)
	if err := record.Validate(kept); err != nil {
		s.log.Warn("not keeping a previous state that does not validate", "key", key, "err", err)
		return
	}
	carry(inst, from)
}

func (s *Store) checkSize(key string, inst *registryv1.Instance) error {
	val, err := record.Encode(inst)
	if err != nil {
		return err
	}
	if len(val) > record.MaxRecordSize {
		return &record.FieldError{Field: "instance", Reason: fmt.Sprintf("record %s is %d bytes, at most %d", key, len(val), record.MaxRecordSize)}
	}
	return nil
}

func (s *Store) registered(inst *registryv1.Instance, lease clientv3.LeaseID, ttl time.Duration, rev int64) *Registration {
	inst.ModRevision, inst.CreateRevision = rev, rev
	return &Registration{LeaseID: int64(lease), TTL: ttl, Revision: rev, Instance: inst}
}

// grant returns a new lease of ttl whose remaining TTL is its full TTL:
// from the pool if the Store has one, else granted now.
func (s *Store) grant(ctx context.Context, ttl time.Duration) (clientv3.LeaseID, error) {
	if s.leases != nil {
		return s.leases.Take(ctx, ttl)
	}
	resp, err := s.cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return 0, err
	}
	return resp.ID, nil
}

// unused drops a lease from grant that no key was ever attached to: back
// to the pool (saving a revoke), or revoked.
func (s *Store) unused(ttl time.Duration, lease clientv3.LeaseID) {
	if s.leases != nil {
		s.leases.Give(ttl, lease)
		return
	}
	s.revoke(lease)
}

// txnOp is a Txn to commit: its compares and the ops of each branch.
type txnOp struct {
	If         []clientv3.Cmp
	Then, Else []clientv3.Op
}

// txnResult is how a txnOp ended: the branch taken, its responses, and the
// revision of the etcd Txn that carried it.
type txnResult struct {
	Succeeded bool
	Responses []*pb.ResponseOp
	Revision  int64
}

// txn commits op: with the Store's Committer, together with concurrent
// registrations, else as a Txn of its own.
func (s *Store) txn(ctx context.Context, op txnOp) (txnResult, error) {
	if s.commit != nil {
		ok, resps, rev, err := s.commit.Commit(ctx, op.If, op.Then, op.Else)
		return txnResult{Succeeded: ok, Responses: resps, Revision: rev}, err
	}
	resp, err := s.cli.Txn(ctx).If(op.If...).Then(op.Then...).Else(op.Else...).Commit()
	if err != nil {
		return txnResult{}, err
	}
	return txnResult{Succeeded: resp.Succeeded, Responses: resp.Responses, Revision: resp.Header.Revision}, nil
}

// revoke drops a lease this store granted and will not use; failure only
// delays its expiry by one TTL, so it is logged, not returned.
func (s *Store) revoke(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.log.Warn("revoke lease", "lease", fmt.Sprintf("%x", int64(lease)), "err", err)
	}
}
