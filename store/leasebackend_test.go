package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/lease"
	"github.com/regcluster/registry/store"
)

// The keeper's backend over etcd reports a revoked lease as the keeper's
// ErrLeaseLost (so the keeper registers again at once) while keeping the
// store's own sentinel and message.
func TestLeaseBackendReportsLostLease(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	b := store.NewLeaseBackend(s)
	g, err := b.Register(ctx, inst("orders", "a"), 5*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	o := lease.Owner{Service: "orders", ID: "a", LeaseID: g.LeaseID, Secret: g.Secret}
	if ttl, err := b.KeepAlive(ctx, o); err != nil || ttl <= 0 {
		t.Fatalf("keepalive of a live lease = %s, %v", ttl, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(g.LeaseID)); err != nil {
		t.Fatal(err)
	}
	_, err = b.KeepAlive(ctx, o)
	if !errors.Is(err, lease.ErrLeaseLost) || !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("keepalive of a revoked lease: %v, want lease.ErrLeaseLost and store.ErrLeaseLost", err)
	}
	if err := b.Deregister(ctx, o); err != nil {
		t.Fatal(err)
	}
}
