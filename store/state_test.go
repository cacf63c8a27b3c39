package store_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

const (
	serving     = registryv1.Lifecycle_LIFECYCLE_SERVING
	draining    = registryv1.Lifecycle_LIFECYCLE_DRAINING
	unavailable = registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
)

// setHealth writes health as the prober does (through UpdateIf).
func setHealth(t *testing.T, s *store.Store, service, id string, state registryv1.HealthState, reason string) *registryv1.Health {
	t.Helper()
	h := &registryv1.Health{State: state, Since: timestamppb.Now(), Reason: reason, Observer: "rn-test", Fence: 7}
	if _, _, err := s.UpdateIf(context.Background(), service, id, nil, func(in *registryv1.Instance) error {
		in.Health = h
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return h
}

// loseLease revokes the record's lease behind its owner's back, as etcd
// does when it expires, and checks the record is gone.
func loseLease(t *testing.T, s *store.Store, cli *clientv3.Client, service, id string) {
	t.Helper()
	ctx := context.Background()
	cur, _, err := s.Get(ctx, service, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(cur.LeaseId)); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, s.Keys().Instance(service, id))
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("record still there after its lease was revoked: %v, %v", resp, err)
	}
}

// stored reads the record straight from etcd.
func storedRecord(t *testing.T, s *store.Store, service, id string) *registryv1.Instance {
	t.Helper()
	got, _, err := s.Get(context.Background(), service, id)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func stateKeys(t *testing.T, s *store.Store, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), s.States(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// A record registered again by the same owner after its lease was
// lost comes back with the lifecycle and reason an operator set and the
// health the prober wrote, although the request says SERVING and carries
// no health.
func TestLostLeaseKeepsLifecycleAndHealth(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	first, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SetLifecycle(ctx, "orders", "a", draining, "rack 7 maintenance"); err != nil {
		t.Fatal(err)
	}
	h := setHealth(t, s, "orders", "a", unavailable, "3 consecutive errors: connection refused")
	loseLease(t, s, cli, "orders", "a")

	again := inst("orders", "a")
	again.Lifecycle = serving
	reg, err := s.RegisterAs(ctx, first.Secret, again, 0)
	if err != nil {
		t.Fatal(err)
	}
	if reg.Secret != first.Secret {
		t.Error("a re-registration changed the owner's secret")
	}
	if !reg.Replaced {
		t.Error("coming back after a lost lease is not reported as a re-registration")
	}
	got := storedRecord(t, s, "orders", "a")
	if got.Lifecycle != draining || got.LifecycleReason != "rack 7 maintenance" {
		t.Errorf("re-registered record is %v %q, want DRAINING %q", got.Lifecycle, got.LifecycleReason, "rack 7 maintenance")
	}
	if !proto.Equal(got.Health, h) {
		t.Errorf("re-registered health = %v, want the last written %v", got.Health, h)
	}
	if !proto.Equal(reg.Instance.Health, h) || reg.Instance.Lifecycle != draining {
		t.Errorf("Register returned %v, not what it stored", reg.Instance)
	}
	if got.LeaseId != reg.LeaseID {
		t.Errorf("record under lease %x, registered %x", got.LeaseId, reg.LeaseID)
	}

	// Undrain, lose the lease again: SERVING is what is kept now.
	if _, _, err := s.SetLifecycle(ctx, "orders", "a", serving, ""); err != nil {
		t.Fatal(err)
	}
	loseLease(t, s, cli, "orders", "a")
	drainedAgain := inst("orders", "a")
	drainedAgain.Lifecycle = draining // what the request says does not matter either way
	if _, err := s.RegisterAs(ctx, first.Secret, drainedAgain, 0); err != nil {
		t.Fatal(err)
	}
	if got := storedRecord(t, s, "orders", "a"); got.Lifecycle != serving || !proto.Equal(got.Health, h) {
		t.Errorf("after undrain and a lost lease: %v, health %v", got.Lifecycle, got.Health)
	}
}

// The same owner registering over its own live record (it lost
// track of its lease) keeps the live record's lifecycle and health.
func TestReplaceKeepsLiveState(t *testing.T) {
	s, _, _ := newStore(t)
	ctx := context.Background()
	first, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SetLifecycle(ctx, "orders", "a", draining, "by hand"); err != nil {
		t.Fatal(err)
	}
	h := setHealth(t, s, "orders", "a", unavailable, "gone")
	second, err := s.RegisterAs(ctx, first.Secret, inst("orders", "a"), 0)
	if err != nil {
		t.Fatal(err)
	}
	got := storedRecord(t, s, "orders", "a")
	if second.LeaseID == first.LeaseID || got.LeaseId != second.LeaseID {
		t.Fatalf("replace kept lease %x (first %x, second %x)", got.LeaseId, first.LeaseID, second.LeaseID)
	}
	if got.Lifecycle != draining || got.LifecycleReason != "by hand" || !proto.Equal(got.Health, h) {
		t.Errorf("replaced record is %v %q health %v, want DRAINING %q health %v", got.Lifecycle, got.LifecycleReason, got.Health, "by hand", h)
	}
}

// Another owner (a new process under the same id, another secret)
// starts afresh: the saved state belongs to the registration that set it.
func TestNewOwnerStartsAfresh(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	old, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SetLifecycle(ctx, "orders", "a", draining, "old process"); err != nil {
		t.Fatal(err)
	}
	setHealth(t, s, "orders", "a", unavailable, "gone")
	loseLease(t, s, cli, "orders", "a")
	if reg, err := s.Register(ctx, inst("orders", "a"), time.Hour); err != nil {
		t.Fatal(err)
	} else if reg.Replaced {
		t.Error("a new owner is reported as a re-registration")
	}
	got := storedRecord(t, s, "orders", "a")
	if got.Lifecycle != serving || got.LifecycleReason != "" || got.Health != nil {
		t.Errorf("new owner inherited %v %q health %v", got.Lifecycle, got.LifecycleReason, got.Health)
	}
	// And its saved state is now its own: the old owner coming back
	// later gets nothing of the old process's either.
	loseLease(t, s, cli, "orders", "a")
	if _, err := s.RegisterAs(ctx, old.Secret, inst("orders", "a"), 0); err != nil {
		t.Fatal(err)
	}
	if got := storedRecord(t, s, "orders", "a"); got.Lifecycle != serving || got.Health != nil {
		t.Errorf("old owner got %v health %v back from a state it no longer owns", got.Lifecycle, got.Health)
	}
}

// A graceful end removes the saved state, with the record, or on its own
// when the lease had already been lost; a stale handle removes nothing.
func TestDeregisterDeletesSavedState(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	a, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx, inst("orders", "b"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := stateKeys(t, s, cli); n != 2 {
		t.Fatalf("%d saved states for 2 records", n)
	}
	if deleted, _, err := s.Deregister(ctx, "orders", "a", a.LeaseID); err != nil || !deleted {
		t.Fatalf("deregister a: %v, %v", deleted, err)
	}
	if n := stateKeys(t, s, cli); n != 1 {
		t.Fatalf("%d saved states after deregistering a, want 1", n)
	}

	// b drains, loses its lease, then ends gracefully before registering
	// again: nothing is left, and a later registration starts afresh.
	if _, _, err := s.SetLifecycle(ctx, "orders", "b", draining, "bye"); err != nil {
		t.Fatal(err)
	}
	b := storedRecord(t, s, "orders", "b")
	loseLease(t, s, cli, "orders", "b")
	if n := stateKeys(t, s, cli); n != 1 {
		t.Fatalf("the lost lease took the saved state with it (%d left)", n)
	}
	if deleted, _, err := s.Deregister(ctx, "orders", "b", b.LeaseId); err != nil || deleted {
		t.Fatalf("deregister b without a record: deleted %v, %v", deleted, err)
	}
	if n := stateKeys(t, s, cli); n != 0 {
		t.Fatalf("%d saved states after every instance ended", n)
	}
	if _, err := s.Register(ctx, inst("orders", "b"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := storedRecord(t, s, "orders", "b"); got.Lifecycle != serving {
		t.Errorf("registered after a graceful end: %v, want SERVING", got.Lifecycle)
	}

	// A stale handle (another lease) deletes neither record nor state.
	if deleted, _, err := s.Deregister(ctx, "orders", "b", b.LeaseId); err != nil || deleted {
		t.Fatalf("stale deregister: deleted %v, %v", deleted, err)
	}
	if n := stateKeys(t, s, cli); n != 1 {
		t.Fatalf("stale deregister removed the saved state (%d left)", n)
	}
}

// Orphans lists exactly the saved states without a record; DeleteOrphan
// deletes one only while it is unchanged, still without a record, and the
// guard holds.
func TestOrphans(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Register(ctx, inst("orders", id), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	loseLease(t, s, cli, "orders", "b")
	loseLease(t, s, cli, "orders", "c")
	orphans, _, err := s.Orphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 2 || orphans[0].ID != "b" || orphans[1].ID != "c" || orphans[0].Service != "orders" {
		t.Fatalf("orphans = %+v, want orders/b and orders/c", orphans)
	}
	b, c := orphans[0], orphans[1]

	// A failed guard, a stale mod revision, a record back: nothing deleted.
	never := clientv3.Compare(clientv3.CreateRevision("/no/such/key"), ">", 0)
	if deleted, err := s.DeleteOrphan(ctx, b, []clientv3.Cmp{never}); err != nil || deleted {
		t.Fatalf("delete under a failed guard: %v, %v", deleted, err)
	}
	stale := b
	stale.ModRevision--
	if deleted, err := s.DeleteOrphan(ctx, stale, nil); err != nil || deleted {
		t.Fatalf("delete at a stale revision: %v, %v", deleted, err)
	}
	if _, err := s.Register(ctx, inst("orders", "c"), time.Hour); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, s.StateKey("orders", "c"))
	if err != nil {
		t.Fatal(err)
	}
	c.ModRevision = resp.Kvs[0].ModRevision
	if deleted, err := s.DeleteOrphan(ctx, c, nil); err != nil || deleted {
		t.Fatalf("delete the state of a live record: %v, %v", deleted, err)
	}
	if deleted, err := s.DeleteOrphan(ctx, b, nil); err != nil || !deleted {
		t.Fatalf("delete orphan b: %v, %v", deleted, err)
	}
	if orphans, _, err := s.Orphans(ctx); err != nil || len(orphans) != 0 {
		t.Fatalf("orphans after the sweep = %+v, %v", orphans, err)
	}
	if n := stateKeys(t, s, cli); n != 2 {
		t.Fatalf("%d saved states, want those of a and c", n)
	}
}
