// Package store is the registry's records in etcd: register an instance under
// a lease, update it with compare-and-swap, delete it, and read it back at one
// revision. Both regnode and lease/ write through it, so the rules (a
// duplicate id alive under another owner is refused, concurrent writers to a
// key never lose an update, junk is skipped and reported) hold for every
// writer.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/internal/etcdread"
	"github.com/regcluster/registry/internal/leasepool"
	"github.com/regcluster/registry/internal/secret"
	"github.com/regcluster/registry/internal/txnbatch"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

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

// Config configures a Store.
type Config struct {
	// Client is the etcd client; the Store does not close it.
	Client *clientv3.Client
	// Prefix is the key prefix (default record.DefaultPrefix).
	Prefix string
	// PageSize bounds each range read of List (default 1000).
	PageSize int64
	// Logger receives junk-record reports (default slog.Default()).
	Logger *slog.Logger
	// OnJunk, if set, is called once for every junk record a read skips.
	OnJunk func(key string, err error)
	// Now is the wall clock used for registered_at (default time.Now).
	Now func() time.Time
	// Leases, if set, is where Register takes its leases: granted ahead
	// and renewed at handover (see package leasepool). Without it each
	// Register grants its own.
	Leases *leasepool.Pool
	// Commit, if set, group-commits Register's write with concurrent
	// registrations' (see package txnbatch), each keeping its own
	// compares and outcome. Without it each Register sends its own Txn.
	Commit *txnbatch.Batcher
	// Renew, if set, carries KeepAliveAs's renewals on one shared
	// LeaseKeepAlive stream. Without it each renewal opens a stream of
	// its own (clientv3's KeepAliveOnce).
	Renew *leasepool.Renewer
}

// Store reads and writes instance records. It is safe for concurrent use.
type Store struct {
	cli    *clientv3.Client
	keys   record.Keys
	page   int64
	log    *slog.Logger
	onJunk func(string, error)
	now    func() time.Time
	leases *leasepool.Pool
	commit *txnbatch.Batcher
	renew  *leasepool.Renewer
}

// New returns a Store; it fails only if cfg does not Validate.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Store{cli: cfg.Client, keys: record.NewKeys(cfg.Prefix), page: cfg.PageSize,
		log: cfg.Logger, onJunk: cfg.OnJunk, now: cfg.Now,
		leases: cfg.Leases, commit: cfg.Commit, renew: cfg.Renew}, nil
}

// Keys is the key layout the Store writes.
func (s *Store) Keys() record.Keys { return s.keys }

// Client is the etcd client the Store uses.
func (s *Store) Client() *clientv3.Client { return s.cli }

func (s *Store) junk(key string, err error) { s.decoder().Junk(key, err) }

// decoder is the Store's reader of records: it logs and reports junk.
func (s *Store) decoder() etcdread.Decoder {
	return etcdread.Decoder{Keys: s.keys, Log: s.log, OnJunk: s.onJunk}
}

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
		resp, err := s.txn(ctx, txnbatch.Op{If: cmps,
			Then: []clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithLease(lease)), clientv3.OpPut(skey, sval)},
			Else: []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(skey)}})
		if err != nil {
			s.revoke(lease) // it may have landed: the lease must not outlive the call
			return nil, fmt.Errorf("register %s: %w", key, err)
		}
		if !resp.Succeeded {
			// Not as read (or guessed): go again from what is there now.
			ikvs = resp.Responses[0].GetResponseRange().Kvs
			skvs = resp.Responses[1].GetResponseRange().Kvs
			continue
		}
		if oldLease != 0 && oldLease != int64(lease) {
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

// txn commits op: with the Store's batcher, together with concurrent
// registrations, else as a Txn of its own.
func (s *Store) txn(ctx context.Context, op txnbatch.Op) (txnbatch.Result, error) {
	if s.commit != nil {
		return s.commit.Do(ctx, op)
	}
	resp, err := s.cli.Txn(ctx).If(op.If...).Then(op.Then...).Else(op.Else...).Commit()
	if err != nil {
		return txnbatch.Result{}, err
	}
	return txnbatch.Result{Succeeded: resp.Succeeded, Responses: resp.Responses, Revision: resp.Header.Revision}, nil
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

// read returns the record of service/id and its saved state (nil when
// absent), both read at one revision, which it returns.
func (s *Store) read(ctx context.Context, service, id string) (ikv, skv *mvccpb.KeyValue, rev int64, err error) {
	if err := record.ValidService(service); err != nil {
		return nil, nil, 0, err
	}
	if err := record.ValidID(id); err != nil {
		return nil, nil, 0, err
	}
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.keys.Instance(service, id)), clientv3.OpGet(s.StateKey(service, id))).Commit()
	if err != nil {
		return nil, nil, 0, err
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		ikv = kvs[0]
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		skv = kvs[0]
	}
	return ikv, skv, resp.Header.Revision, nil
}

// owner is the secret hash a saved state holds ("" if none or junk).
func (s *Store) owner(service, id string, skv *mvccpb.KeyValue) string {
	if skv == nil {
		return ""
	}
	st, err := decodeState(service, id, skv.Value)
	if err != nil {
		return ""
	}
	return st.Incarnation
}

func (s *Store) owns(sec, service, id string, skv *mvccpb.KeyValue) bool {
	return secret.Matches(sec, s.owner(service, id, skv))
}

// Update applies fn to the current record of service/id and writes the
// result with compare-and-swap on its mod_revision, keeping its lease. On a
// conflict it reads again and reapplies fn, so concurrent writers never lose
// an update. fn may return an error to abort; a missing or junk record
// returns an error wrapping record.ErrNotFound.
func (s *Store) Update(ctx context.Context, service, id string, fn func(*registryv1.Instance) error) (*registryv1.Instance, int64, error) {
	return s.UpdateIf(ctx, service, id, nil, fn)
}

// UpdateIf is Update with a guard: the write also requires every compare of
// guard (the prober's fence). When the guard fails the write does not land
// and UpdateIf returns an error wrapping ErrGuard, at once.
func (s *Store) UpdateIf(ctx context.Context, service, id string, guard []clientv3.Cmp, fn func(*registryv1.Instance) error) (*registryv1.Instance, int64, error) {
	if err := record.ValidService(service); err != nil {
		return nil, 0, err
	}
	if err := record.ValidID(id); err != nil {
		return nil, 0, err
	}
	key := s.keys.Instance(service, id)
	for {
		// The saved state is read with the record: its owner (the
		// secret's hash) must be written back unchanged.
		ikv, skv, _, err := s.read(ctx, service, id)
		if err != nil {
			return nil, 0, fmt.Errorf("update %s: %w", key, err)
		}
		if ikv == nil {
			return nil, 0, fmt.Errorf("%s/%s: %w", service, id, record.ErrNotFound)
		}
		cur, err := s.keys.Decode(key, ikv.Value, ikv.CreateRevision, ikv.ModRevision)
		if err != nil {
			s.junk(key, err)
			return nil, 0, fmt.Errorf("%s/%s: %w (the stored record is junk)", service, id, record.ErrNotFound)
		}
		next := proto.CloneOf(cur)
		if err := fn(next); err != nil {
			return nil, 0, err
		}
		record.StampRoutable(cur, next, s.now())
		if err := record.Validate(next); err != nil {
			return nil, 0, err
		}
		if proto.Equal(cur, next) {
			return cur, cur.ModRevision, nil // nothing to write
		}
		val, err := record.Encode(next)
		if err != nil {
			return nil, 0, err
		}
		sval, err := encodeState(next, s.owner(service, id, skv))
		if err != nil {
			return nil, 0, err
		}
		// The saved state follows the record in the same txn, so it is
		// always the state of the latest record (see StateKey). Every
		// write of the state also writes the record, so comparing the
		// record's revision covers the owner read with it.
		cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision)}, guard...)
		resp, err := s.cli.Txn(ctx).If(cmps...).
			Then(clientv3.OpPut(key, string(val), clientv3.WithIgnoreLease()),
				clientv3.OpPut(s.StateKey(service, id), sval)).
			Commit()
		if err != nil {
			return nil, 0, fmt.Errorf("update %s: %w", key, err)
		}
		if resp.Succeeded {
			next.ModRevision = resp.Header.Revision
			return next, resp.Header.Revision, nil
		}
		if len(guard) > 0 {
			// Which compare failed: the guard ends the update, a
			// concurrent write only retries it.
			g, err := s.cli.Txn(ctx).If(guard...).Commit()
			if err != nil {
				return nil, 0, fmt.Errorf("update %s: check guard: %w", key, err)
			}
			if !g.Succeeded {
				return nil, 0, fmt.Errorf("update %s: %w", key, ErrGuard)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, 0, fmt.Errorf("update %s: %w", key, err)
		}
	}
}

// SetLifecycle writes lifecycle (and its reason) on service/id with
// compare-and-swap. Draining is how a live instance leaves rotation.
func (s *Store) SetLifecycle(ctx context.Context, service, id string, lc registryv1.Lifecycle, reason string) (*registryv1.Instance, int64, error) {
	if _, ok := registryv1.Lifecycle_name[int32(lc)]; !ok || lc == registryv1.Lifecycle_LIFECYCLE_UNSPECIFIED {
		return nil, 0, &record.FieldError{Field: "lifecycle", Reason: fmt.Sprintf("unknown value %d", lc)}
	}
	if len(reason) > record.MaxReasonLen {
		return nil, 0, &record.FieldError{Field: "reason", Reason: fmt.Sprintf("%d bytes, at most %d", len(reason), record.MaxReasonLen)}
	}
	return s.Update(ctx, service, id, func(in *registryv1.Instance) error {
		in.Lifecycle = lc
		in.LifecycleReason = reason
		return nil
	})
}

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

// Get returns the record of service/id and the revision it was read at. A
// missing or junk record returns an error wrapping record.ErrNotFound (junk
// is also reported).
func (s *Store) Get(ctx context.Context, service, id string) (*registryv1.Instance, int64, error) {
	if err := record.ValidService(service); err != nil {
		return nil, 0, err
	}
	if err := record.ValidID(id); err != nil {
		return nil, 0, err
	}
	key := s.keys.Instance(service, id)
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return nil, 0, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, resp.Header.Revision, fmt.Errorf("%s/%s: %w", service, id, record.ErrNotFound)
	}
	kv := resp.Kvs[0]
	inst, err := s.keys.Decode(key, kv.Value, kv.CreateRevision, kv.ModRevision)
	if err != nil {
		s.junk(key, err)
		return nil, resp.Header.Revision, fmt.Errorf("%s/%s: %w (the stored record is junk)", service, id, record.ErrNotFound)
	}
	return inst, resp.Header.Revision, nil
}

// List returns every valid instance of service (every service if empty),
// sorted by key, all read at one revision, which it returns. It reads in
// pages; if etcd compacts that revision mid-way it starts over. skipped
// counts junk records left out.
func (s *Store) List(ctx context.Context, service string) (insts []*registryv1.Instance, rev int64, skipped int, err error) {
	prefix := s.keys.Instances()
	if service != "" {
		if err := record.ValidService(service); err != nil {
			return nil, 0, 0, err
		}
		prefix = s.keys.Service(service)
	}
	for {
		insts, rev, skipped, err = s.list(ctx, prefix)
		if errors.Is(err, rpctypes.ErrCompacted) {
			continue
		}
		return insts, rev, skipped, err
	}
}

func (s *Store) list(ctx context.Context, prefix string) ([]*registryv1.Instance, int64, int, error) {
	var (
		out     []*registryv1.Instance
		skipped int
	)
	dec := s.decoder()
	rev, _, err := etcdread.Range(ctx, s.cli, prefix, 0, s.page, func(kv *mvccpb.KeyValue) {
		if inst, err := dec.Decode(kv); err != nil {
			skipped++
		} else {
			out = append(out, inst)
		}
	})
	if err != nil {
		return nil, 0, 0, err
	}
	return out, rev, skipped, nil
}

// CompactRevision returns the revision etcd has compacted up to (0 if it
// never compacted). etcd reports it only to a watcher that asks for a
// compacted revision, so this opens a watch from revision 1 on a key nobody
// writes, and asks for progress to learn "not compacted" without waiting.
func (s *Store) CompactRevision(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), 5*time.Second)
	defer cancel()
	probe := s.keys.Prefix() + "\x00compact-probe"
	wch := s.cli.Watch(ctx, probe, clientv3.WithRev(1), clientv3.WithFilterPut(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
	// etcd answers a progress request only once the watcher has caught up
	// with history, so ask again until it does.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				return 0, fmt.Errorf("read compact revision: %w", ctx.Err())
			}
			if resp.CompactRevision != 0 {
				return resp.CompactRevision, nil
			}
			if err := resp.Err(); err != nil {
				return 0, fmt.Errorf("read compact revision: %w", err)
			}
			if resp.IsProgressNotify() {
				return 0, nil
			}
		case <-tick.C:
			if err := s.cli.RequestProgress(ctx); err != nil {
				return 0, fmt.Errorf("read compact revision: %w", err)
			}
		}
	}
}
