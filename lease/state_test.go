package lease_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/lease"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

const draining = registryv1.Lifecycle_LIFECYCLE_DRAINING

// An operator's drain (someone else's write) survives the keeper's lease
// being lost: the keeper registers again and the record is DRAINING with
// the operator's reason, although the keeper itself registers SERVING.
func TestOperatorDrainSurvivesLostLease(t *testing.T) {
	s, cli := setup(t)
	ctx := context.Background()
	k, err := lease.Start(ctx, store.NewLeaseBackend(s), inst(), lease.Config{TTL: 3 * time.Second, DrainGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	if _, _, err := s.SetLifecycle(ctx, "orders", "o-1", draining, "operator: disk failing"); err != nil {
		t.Fatal(err)
	}
	first := k.Status()
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(first.LeaseID)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "registered again", func() bool {
		got, _, err := s.Get(ctx, "orders", "o-1")
		return err == nil && got.LeaseId != first.LeaseID
	})
	got, _, err := s.Get(ctx, "orders", "o-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Lifecycle != draining || got.LifecycleReason != "operator: disk failing" {
		t.Fatalf("registered again as %v %q, want DRAINING by the operator", got.Lifecycle, got.LifecycleReason)
	}
	if k.Instance().Lifecycle == draining {
		t.Fatalf("the keeper's own record says %v; the drain was the operator's", k.Instance().Lifecycle)
	}
}

// The keeper's own Drain, made while its record is gone (the lease lost,
// not registered again yet), is applied by the next registration instead
// of being overridden by the state saved before.
func TestDrainWhileLostIsApplied(t *testing.T) {
	s, cli := setup(t)
	ctx := context.Background()
	// Renewals far apart: the keeper notices the loss seconds later.
	k, err := lease.Start(ctx, store.NewLeaseBackend(s), inst(), lease.Config{TTL: 30 * time.Second, KeepAliveInterval: 2 * time.Second,
		DrainGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	first := k.Status()
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(first.LeaseID)); err != nil {
		t.Fatal(err)
	}
	if err := k.Drain(ctx, "rolling restart"); err != nil {
		t.Fatal(err)
	}
	if n := k.Status().Registrations; n != 1 {
		t.Logf("registered again before the drain (%d registrations): the pending path did not run", n)
	}
	waitFor(t, 30*time.Second, "registered again, draining", func() bool {
		got, _, err := s.Get(ctx, "orders", "o-1")
		return err == nil && got.LeaseId != first.LeaseID && got.Lifecycle == draining
	})
	got, _, err := s.Get(ctx, "orders", "o-1")
	if err != nil || got.LifecycleReason != "rolling restart" {
		t.Fatalf("record %v, %v: want the keeper's reason", got, err)
	}
}
