package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// holder is a leadership-like guard: a key under its own lease, and the
// compare on its create revision that the prober's fence is.
type holder struct {
	key   string
	lease clientv3.LeaseID
	guard []clientv3.Cmp
}

func hold(t *testing.T, cli *clientv3.Client, key string) *holder {
	t.Helper()
	// Bounded: an update that retried a failed guard would spin until
	// its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cli.Put(ctx, key, "leader", clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatal(err)
	}
	return &holder{key: key, lease: g.ID,
		guard: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", r.Header.Revision)}}
}

// depose ends the holder's term the way a session expiry does: its lease
// goes, and its key with it.
func (h *holder) depose(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	if _, err := cli.Revoke(context.Background(), h.lease); err != nil {
		t.Fatalf("depose %s: %v", h.key, err)
	}
}

// rawKey reads key straight from etcd: its bytes, mod revision and lease,
// and etcd's current revision.
func rawKey(t *testing.T, cli *clientv3.Client, key string) (val string, mod, lease, head int64) {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("%s: %d keys", key, len(resp.Kvs))
	}
	kv := resp.Kvs[0]
	return string(kv.Value), kv.ModRevision, kv.Lease, resp.Header.Revision
}

// A guard that held when the update began and no longer holds when its
// write reaches etcd (the leader was deposed in between): etcd refuses the
// write, UpdateIf says ErrGuard at once (no retry), and nothing lands.
func TestUpdateIfRefusedWhenGuardNoLongerHolds(t *testing.T) {
	s, cli, _ := newStore(t)
	// Bounded: an update that retried a failed guard would spin until
	// its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key := s.Keys().Instance("orders", "a")
	h := hold(t, cli, "/test/leader")
	before, mod0, _, _ := rawKey(t, cli, key)

	var calls int
	var head int64
	_, _, err = s.UpdateIf(ctx, "orders", "a", h.guard, func(in *registryv1.Instance) error {
		calls++
		if calls == 1 {
			h.depose(t, cli) // after UpdateIf read the record, before its write
			_, _, _, head = rawKey(t, cli, key)
		}
		in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Observer: "deposed"}
		return nil
	})
	if !errors.Is(err, store.ErrGuard) {
		t.Fatalf("update under a guard that no longer holds: %v, want ErrGuard", err)
	}
	if calls != 1 {
		t.Fatalf("fn called %d times: a failed guard must end the update, not retry it", calls)
	}
	after, mod1, lease, now := rawKey(t, cli, key)
	if after != before || mod1 != mod0 || lease != reg.LeaseID {
		t.Fatalf("the refused write changed the record: mod %d -> %d, lease %x (registered %x)", mod0, mod1, lease, reg.LeaseID)
	}
	if now != head {
		t.Fatalf("etcd's revision moved from %d to %d after the deposition: something was written", head, now)
	}

	// A guard that never held is refused the same way, before fn is asked
	// twice.
	calls = 0
	_, _, err = s.UpdateIf(ctx, "orders", "a", h.guard, func(in *registryv1.Instance) error {
		calls++
		in.Version = "stale"
		return nil
	})
	if !errors.Is(err, store.ErrGuard) || calls != 1 {
		t.Fatalf("update under a dead guard: %v after %d calls of fn, want ErrGuard after 1", err, calls)
	}
	if after, _, _, _ := rawKey(t, cli, key); after != before {
		t.Fatal("a write under a dead guard landed")
	}
}

// While the guard holds, a concurrent writer to the same key only makes
// UpdateIf read again and retry: both writes land, and the key keeps its
// lease.
func TestUpdateIfRetriesConflictWhileGuardHolds(t *testing.T) {
	s, cli, _ := newStore(t)
	// Bounded: an update that retried a failed guard would spin until
	// its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h := hold(t, cli, "/test/leader")
	var calls int
	got, rev, err := s.UpdateIf(ctx, "orders", "a", h.guard, func(in *registryv1.Instance) error {
		calls++
		if calls == 1 {
			// Another writer (an operator draining) gets in first.
			if _, _, err := s.SetLifecycle(ctx, "orders", "a", registryv1.Lifecycle_LIFECYCLE_DRAINING, "op"); err != nil {
				t.Fatal(err)
			}
		}
		in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY, Observer: "leader"}
		return nil
	})
	if err != nil {
		t.Fatalf("update with a holding guard and a conflict: %v", err)
	}
	if calls != 2 {
		t.Fatalf("fn called %d times, want 2 (the conflict is retried once)", calls)
	}
	stored, _, err := s.Get(ctx, "orders", "a")
	if err != nil {
		t.Fatal(err)
	}
	if stored.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || stored.GetHealth().GetObserver() != "leader" ||
		stored.ModRevision != rev || got.ModRevision != rev {
		t.Fatalf("stored %v at %d (returned %d): want the drain and the health write both", stored, stored.ModRevision, rev)
	}
	if _, _, lease, _ := rawKey(t, cli, s.Keys().Instance("orders", "a")); lease != reg.LeaseID {
		t.Fatalf("key's lease after a guarded update = %x, want the registration's %x", lease, reg.LeaseID)
	}
}

// A writer whose link to etcd is paused while its guard is lost: the write
// it sent is held in the link, reaches etcd after the deposition, and is
// refused there; nothing lands.
func TestUpdateIfHeldInPausedLinkIsRefused(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	p := etcdtest.NewProxy(t, m.ClientURL)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.URL()}, DialTimeout: 2 * time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	// Bounded: an update that retried a failed guard would spin until
	// its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := s.Register(ctx, inst("orders", "a"), time.Hour); err != nil {
		t.Fatal(err)
	}
	key := s.Keys().Instance("orders", "a")
	h := hold(t, direct, "/test/leader")
	before, mod0, _, _ := rawKey(t, direct, key)

	p.Pause()
	done := make(chan error, 1)
	go func() {
		_, _, err := s.UpdateIf(ctx, "orders", "a", h.guard, func(in *registryv1.Instance) error {
			in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Observer: "cut-off"}
			return nil
		})
		done <- err
	}()
	h.depose(t, direct)
	_, _, _, head := rawKey(t, direct, key)
	p.Resume()
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrGuard) {
			t.Fatalf("write held in a paused link past the deposition: %v, want ErrGuard", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("UpdateIf did not return after the link came back")
	}
	after, mod1, _, now := rawKey(t, direct, key)
	if after != before || mod1 != mod0 || now != head {
		t.Fatalf("the refused write landed: record mod %d -> %d, etcd at %d -> %d", mod0, mod1, head, now)
	}
}
