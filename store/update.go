package store

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// StateHint is what a write learned of an instance's saved state (see
// StateKey): the owner it must write back unchanged. With it, the next
// UpdateFrom of the same instance needs no read first. The zero value knows
// nothing. A hint is only ever a guess: the write compares the saved state
// it assumes, so a wrong or outdated hint costs a retry, never a wrong
// owner.
type StateHint struct {
	known  bool
	absent bool   // no saved state was there
	owner  string // its owner, "" for none or junk (as UpdateIf writes it back)
	raw    []byte // the saved state's exact bytes, as read...
	rawAt  int64  // ...alongside the record at this mod revision
}

// hintOf is the hint of the saved state skv, read with the record at
// modRev.
func (s *Store) hintOf(service, id string, skv *mvccpb.KeyValue, modRev int64) StateHint {
	if skv == nil {
		return StateHint{known: true, absent: true, rawAt: modRev}
	}
	return StateHint{known: true, owner: s.owner(service, id, skv), raw: skv.Value, rawAt: modRev}
}

// compare is the compare that holds only while the saved state is the one
// h assumes for the record cur: the bytes read or written with cur, or,
// for a record h did not see (the caller's newer copy), the state the
// store writes with such a record.
func (h StateHint) compare(skey string, cur *registryv1.Instance) (clientv3.Cmp, error) {
	if h.absent {
		return clientv3.Compare(clientv3.CreateRevision(skey), "=", 0), nil
	}
	if h.raw != nil && h.rawAt == cur.ModRevision {
		return clientv3.Compare(clientv3.Value(skey), "=", string(h.raw)), nil
	}
	val, err := encodeState(cur, h.owner)
	if err != nil {
		return clientv3.Cmp{}, err
	}
	return clientv3.Compare(clientv3.Value(skey), "=", val), nil
}

// UpdateFrom is UpdateIf starting from the caller's copy of the record, cur
// (with its mod and create revisions, as a watch cache holds it), and from
// hint, what a previous UpdateFrom of this instance returned. When cur is
// the stored record and hint is right, it takes one round trip: fn applied
// to a copy of cur, written with compare-and-swap on cur's mod revision and
// on the saved state, and the guard. When that fails, the same round trip
// brings back the stored record, its saved state, and whether the guard
// held: a failed guard returns an error wrapping ErrGuard at once (nothing
// landed, fn is not asked again); otherwise fn is applied again to the
// stored record and the write retried, so a concurrent writer (an operator
// draining) never loses its update. With a zero hint it reads first. The
// key keeps its lease. A missing or junk record returns an error wrapping
// record.ErrNotFound; fn may return an error to abort.
//
// It returns the record written (or, when fn changed nothing, the copy it
// was applied to, and nothing is written) and the hint for the next write.
func (s *Store) UpdateFrom(ctx context.Context, cur *registryv1.Instance, hint StateHint, guard []clientv3.Cmp, fn func(*registryv1.Instance) error) (*registryv1.Instance, StateHint, error) {
	service, id := cur.GetService(), cur.GetId()
	if err := record.ValidService(service); err != nil {
		return nil, hint, err
	}
	if err := record.ValidID(id); err != nil {
		return nil, hint, err
	}
	key, skey := s.keys.Instance(service, id), s.StateKey(service, id)
	if !hint.known {
		ikv, skv, _, err := s.read(ctx, service, id)
		if err != nil {
			return nil, hint, fmt.Errorf("update %s: %w", key, err)
		}
		if cur, err = s.decodeCurrent(key, service, id, ikv); err != nil {
			return nil, hint, err
		}
		hint = s.hintOf(service, id, skv, cur.ModRevision)
	}
	for {
		next := proto.CloneOf(cur)
		if err := fn(next); err != nil {
			return nil, hint, err
		}
		record.StampRoutable(cur, next, s.now())
		if err := record.Validate(next); err != nil {
			return nil, hint, err
		}
		if proto.Equal(cur, next) {
			return cur, hint, nil // nothing to write
		}
		val, err := record.Encode(next)
		if err != nil {
			return nil, hint, err
		}
		sval, err := encodeState(next, hint.owner)
		if err != nil {
			return nil, hint, err
		}
		stateCmp, err := hint.compare(skey, cur)
		if err != nil {
			return nil, hint, err
		}
		cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision), stateCmp}, guard...)
		// What a retry needs comes back with the refusal: the record, its
		// saved state, and (a txn nested in Else, evaluated at the same
		// revision) whether it was the guard that failed.
		els := []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(skey)}
		if len(guard) > 0 {
			els = append(els, clientv3.OpTxn(guard, nil, nil))
		}
		resp, err := s.cli.Txn(ctx).If(cmps...).
			Then(clientv3.OpPut(key, string(val), clientv3.WithIgnoreLease()), clientv3.OpPut(skey, sval)).
			Else(els...).
			Commit()
		if err != nil {
			return nil, hint, fmt.Errorf("update %s: %w", key, err)
		}
		if resp.Succeeded {
			next.ModRevision = resp.Header.Revision
			// The state written is what the next write recomputes from
			// this record: the hint keeps the owner only, not the bytes.
			return next, StateHint{known: true, owner: hint.owner}, nil
		}
		if len(guard) > 0 && !resp.Responses[2].GetResponseTxn().GetSucceeded() {
			return nil, hint, fmt.Errorf("update %s: %w", key, ErrGuard)
		}
		var ikv, skv *mvccpb.KeyValue
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			ikv = kvs[0]
		}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			skv = kvs[0]
		}
		if cur, err = s.decodeCurrent(key, service, id, ikv); err != nil {
			return nil, hint, err
		}
		hint = s.hintOf(service, id, skv, cur.ModRevision)
		if err := ctx.Err(); err != nil {
			return nil, hint, fmt.Errorf("update %s: %w", key, err)
		}
	}
}

// decodeCurrent decodes the stored record ikv of service/id: a missing or
// junk one (reported) is record.ErrNotFound.
func (s *Store) decodeCurrent(key, service, id string, ikv *mvccpb.KeyValue) (*registryv1.Instance, error) {
	if ikv == nil {
		return nil, fmt.Errorf("%s/%s: %w", service, id, record.ErrNotFound)
	}
	cur, err := s.keys.Decode(key, ikv.Value, ikv.CreateRevision, ikv.ModRevision)
	if err != nil {
		s.junk(key, err)
		return nil, fmt.Errorf("%s/%s: %w (the stored record is junk)", service, id, record.ErrNotFound)
	}
	return cur, nil
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
