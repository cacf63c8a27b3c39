package store_test

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// TestDeregisterLeavesMark: every deregistration (operator's, owner's,
// and of a record an operator already drained) deletes a record whose
// last version in the watch stream is DRAINING, so subscribers tell it
// from a lease expiry; the DRAINING record is written before the delete,
// at a revision of its own.
func TestDeregisterLeavesMark(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	keys := s.Keys()
	for name, c := range map[string]struct {
		drainFirst bool
		dereg      func(reg *store.Registration, id string) (bool, int64, error)
	}{
		"operator": {dereg: func(reg *store.Registration, id string) (bool, int64, error) {
			return s.Deregister(ctx, "orders", id, 0)
		}},
		"owner": {dereg: func(reg *store.Registration, id string) (bool, int64, error) {
			return s.DeregisterAs(ctx, reg.Secret, "orders", id, reg.LeaseID)
		}},
		"already draining": {drainFirst: true, dereg: func(reg *store.Registration, id string) (bool, int64, error) {
			return s.DeregisterAs(ctx, reg.Secret, "orders", id, reg.LeaseID)
		}},
	} {
		t.Run(name, func(t *testing.T) {
			id := "m-" + map[string]string{"operator": "op", "owner": "own", "already draining": "dr"}[name]
			reg, err := s.Register(ctx, inst("orders", id), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if c.drainFirst {
				if _, _, err := s.SetLifecycle(ctx, "orders", id, registryv1.Lifecycle_LIFECYCLE_DRAINING, "operator"); err != nil {
					t.Fatal(err)
				}
			}
			from := revision(t, cli) + 1
			deleted, rev, err := c.dereg(reg, id)
			if err != nil || !deleted {
				t.Fatalf("deregister: deleted=%v err=%v", deleted, err)
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			var evs []*clientv3.Event
			for resp := range cli.Watch(wctx, keys.Instance("orders", id), clientv3.WithRev(from)) {
				evs = append(evs, resp.Events...)
				if n := len(evs); n > 0 && evs[n-1].Type == mvccpb.DELETE {
					break
				}
			}
			cancel()
			want := 2
			if c.drainFirst {
				want = 1 // already marked: deleted at once
			}
			if len(evs) != want || evs[len(evs)-1].Kv.ModRevision != rev {
				t.Fatalf("events of the deregistration: %v, want %d ending in the delete at %d", evs, want, rev)
			}
			if !c.drainFirst {
				put := evs[0]
				got, err := keys.Decode(string(put.Kv.Key), put.Kv.Value, put.Kv.CreateRevision, put.Kv.ModRevision)
				if err != nil {
					t.Fatal(err)
				}
				if put.Type != mvccpb.PUT || got.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || got.LifecycleReason != store.RemovalReason || record.Routable(got) {
					t.Fatalf("the write before the delete is %v %v (%q), want the DRAINING mark", put.Type, got.Lifecycle, got.LifecycleReason)
				}
				if put.Kv.Lease != reg.LeaseID {
					t.Fatalf("the mark moved the record off its lease: %x, want %x", put.Kv.Lease, reg.LeaseID)
				}
			}
		})
	}
}
