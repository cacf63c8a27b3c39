package store

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The saved state of an instance: what must outlive its lease.
//
// An instance key is attached to its lease, so when the lease is lost the
// record is gone, and with it the lifecycle an operator set and the health
// the prober measured. Every write of a record therefore also writes, in
// the same txn, a small companion key that is attached to no lease:
//
//	<prefix>state/<service>/<instance-id>
//
// holding a registry.v1.Instance with only service, id, lifecycle,
// lifecycle_reason, health, and in its incarnation field the owner: the
// hash of the registration's secret (secret.Hash). Register reads it: a
// record registered again by the same owner (the same registration handle,
// after a lost lease) comes back with the saved lifecycle, reason and
// health, whoever set them; a live record is replaced only by its owner.
// Another secret (a new process) starts afresh. KeepAlive and an owner's
// Deregister check the owner here. Deregister deletes it with the record.
// Subscribers and every read of the API never see it:
// it lives outside <prefix>instances/, so the one-key-per-instance contract
// of the data model is unchanged.
//
// An instance that dies without deregistering leaves its saved state
// behind; the prober's leader deletes those it has seen orphaned (Orphans)
// for a retention period, through its fence (DeleteOrphan).

// StateKey is the key of the saved state of service/id.
func (s *Store) StateKey(service, id string) string {
	return s.keys.Prefix() + "state/" + service + "/" + id
}

// States is the prefix of every saved-state key.
func (s *Store) States() string { return s.keys.Prefix() + "state/" }

// stateOf is the saved state of inst, owned by owner (a secret hash).
func stateOf(inst *registryv1.Instance, owner string) *registryv1.Instance {
	return &registryv1.Instance{
		Service: inst.Service, Id: inst.Id, Incarnation: owner,
		Lifecycle: inst.Lifecycle, LifecycleReason: inst.LifecycleReason,
		Health: proto.CloneOf(inst.Health),
	}
}

func encodeState(inst *registryv1.Instance, owner string) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(stateOf(inst, owner))
	if err != nil {
		return "", fmt.Errorf("encode saved state of %s/%s: %w", inst.Service, inst.Id, err)
	}
	return string(b), nil
}

// decodeState reads a saved state; anything that is not one for
// service/id is an error (the caller ignores it and starts afresh).
func decodeState(service, id string, value []byte) (*registryv1.Instance, error) {
	st := &registryv1.Instance{}
	if err := proto.Unmarshal(value, st); err != nil {
		return nil, fmt.Errorf("saved state of %s/%s is not a registry.v1.Instance: %w", service, id, err)
	}
	if st.Service != service || st.Id != id {
		return nil, fmt.Errorf("saved state of %s/%s names %s/%s", service, id, st.Service, st.Id)
	}
	if _, ok := registryv1.Lifecycle_name[int32(st.Lifecycle)]; !ok || st.Lifecycle == registryv1.Lifecycle_LIFECYCLE_UNSPECIFIED {
		return nil, fmt.Errorf("saved state of %s/%s has lifecycle %d", service, id, st.Lifecycle)
	}
	return st, nil
}

// carry puts the state that outlives a lease (lifecycle, its reason, and
// health) from saved onto rec.
func carry(rec, saved *registryv1.Instance) {
	rec.Lifecycle, rec.LifecycleReason = saved.Lifecycle, saved.LifecycleReason
	rec.Health = proto.CloneOf(saved.Health)
}

// Orphan is a saved state whose instance has no record: left by an
// instance that lost its lease and never came back (a crash, not a
// graceful end, which deletes it).
type Orphan struct {
	Service, ID string
	// ModRevision is the saved state's mod revision when it was listed.
	ModRevision int64
}

// Orphans lists the saved states that have no record, both prefixes read
// at one revision, which it returns. Only keys are read.
func (s *Store) Orphans(ctx context.Context) ([]Orphan, int64, error) {
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.States(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(s.keys.Instances(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("list saved states: %w", err)
	}
	live := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		live[string(kv.Key)] = true
	}
	var out []Orphan
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		service, id, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), s.States()), "/")
		if !ok || live[s.keys.Instance(service, id)] {
			continue
		}
		out = append(out, Orphan{Service: service, ID: id, ModRevision: kv.ModRevision})
	}
	return out, resp.Header.Revision, nil
}

// DeleteOrphan deletes o's saved state if it is unchanged since listed, its
// instance still has no record, and every compare of guard holds (the
// prober's fence). deleted is false if any of that no longer held.
func (s *Store) DeleteOrphan(ctx context.Context, o Orphan, guard []clientv3.Cmp) (deleted bool, err error) {
	skey := s.StateKey(o.Service, o.ID)
	cmps := append([]clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(skey), "=", o.ModRevision),
		clientv3.Compare(clientv3.CreateRevision(s.keys.Instance(o.Service, o.ID)), "=", 0),
	}, guard...)
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(clientv3.OpDelete(skey)).Commit()
	if err != nil {
		return false, fmt.Errorf("delete orphaned saved state %s: %w", skey, err)
	}
	return resp.Succeeded, nil
}
