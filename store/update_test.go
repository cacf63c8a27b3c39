package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// calls counts the gRPC calls a client makes, by method: the round trips.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.n[method]++
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// take returns the counts since the last take, and starts again.
func (c *calls) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// countedStore is a store whose client counts its calls, and a plain
// client to look behind its back.
func countedStore(t *testing.T) (*store.Store, *calls, *clientv3.Client) {
	t.Helper()
	m := etcdtest.Start(t, false)
	c := &calls{n: map[string]int{}}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 5 * time.Second,
		Logger: etcdtest.QuietLogger(), DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	s, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	return s, c, m.Client(t)
}

const (
	txnCall   = "/etcdserverpb.KV/Txn"
	rangeCall = "/etcdserverpb.KV/Range"
)

func healthTo(state registryv1.HealthState, by string) func(*registryv1.Instance) error {
	return func(in *registryv1.Instance) error {
		in.Health = &registryv1.Health{State: state, Observer: by}
		return nil
	}
}

// A write from the current record and a known hint is one round trip; one
// from a stale record (an operator drained meanwhile) is retried from what
// the refusal brought back, with no read of its own, and keeps the drain.
func TestUpdateFromOneRoundTrip(t *testing.T) {
	s, c, _ := countedStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := s.Register(ctx, inst("orders", "a"), 0)
	if err != nil {
		t.Fatal(err)
	}
	h := hold(t, s.Client(), "/test/leader")

	// No hint yet: a read, then the write.
	c.take()
	cur, hint, err := s.UpdateFrom(ctx, reg.Instance, store.StateHint{}, h.guard, healthTo(registryv1.HealthState_HEALTH_STATE_HEALTHY, "p"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.take(); got[txnCall] != 2 || len(got) != 1 {
		t.Fatalf("first write (no hint): calls %v, want 2 Txn (read, write)", got)
	}
	// From what it wrote: one round trip.
	cur, hint, err = s.UpdateFrom(ctx, cur, hint, h.guard, healthTo(registryv1.HealthState_HEALTH_STATE_DEGRADED, "p"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.take(); got[txnCall] != 1 || len(got) != 1 {
		t.Fatalf("write from the current record: calls %v, want 1 Txn", got)
	}
	// From the stored record as another reader got it (a watch cache):
	// the hint recomputes the saved state; still one round trip.
	stored, _, err := s.Get(ctx, "orders", "a")
	if err != nil {
		t.Fatal(err)
	}
	c.take()
	cur, hint, err = s.UpdateFrom(ctx, stored, hint, h.guard, healthTo(registryv1.HealthState_HEALTH_STATE_HEALTHY, "p"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.take(); got[txnCall] != 1 || len(got) != 1 {
		t.Fatalf("write from a fetched copy of the record: calls %v, want 1 Txn", got)
	}

	// An operator drains: the copy the writer holds is stale.
	if _, _, err := s.SetLifecycle(ctx, "orders", "a", registryv1.Lifecycle_LIFECYCLE_DRAINING, "op"); err != nil {
		t.Fatal(err)
	}
	c.take()
	var seen []registryv1.Lifecycle
	got, _, err := s.UpdateFrom(ctx, cur, hint, h.guard, func(in *registryv1.Instance) error {
		seen = append(seen, in.Lifecycle)
		in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Observer: "p"}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls := c.take(); calls[txnCall] != 2 || len(calls) != 1 {
		t.Fatalf("write from a stale record: calls %v, want 2 Txn (refused with the fresh record, retried)", calls)
	}
	if len(seen) != 2 || seen[0] != registryv1.Lifecycle_LIFECYCLE_SERVING || seen[1] != registryv1.Lifecycle_LIFECYCLE_DRAINING {
		t.Fatalf("fn saw lifecycles %v, want SERVING (the stale copy) then DRAINING (the stored record)", seen)
	}
	final, _, err := s.Get(ctx, "orders", "a")
	if err != nil {
		t.Fatal(err)
	}
	if final.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || final.LifecycleReason != "op" ||
		final.GetHealth().GetState() != registryv1.HealthState_HEALTH_STATE_UNAVAILABLE || final.ModRevision != got.ModRevision {
		t.Fatalf("stored %v, want the drain kept and the health written at %d", final, got.ModRevision)
	}
	if _, _, lease, _ := rawKey(t, s.Client(), s.Keys().Instance("orders", "a")); lease != reg.LeaseID {
		t.Fatalf("lease after UpdateFrom = %x, want %x", lease, reg.LeaseID)
	}
	// The saved state followed: an owner's re-registration after a lost
	// lease would come back DRAINING and UNAVAILABLE.
	if _, err := s.KeepAliveAs(ctx, reg.Secret, "orders", "a", reg.LeaseID); err != nil {
		t.Fatalf("the owner's keepalive after UpdateFrom: %v (the saved state lost its owner?)", err)
	}
}

// A hint is a guess: one from another registration (another owner) makes
// the write retry, and the saved state keeps its real owner.
func TestUpdateFromWrongHintKeepsOwner(t *testing.T) {
	s, _, _ := countedStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := s.Register(ctx, inst("orders", "a"), 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Register(ctx, inst("orders", "b"), 0)
	if err != nil {
		t.Fatal(err)
	}
	_, hintA, err := s.UpdateFrom(ctx, a.Instance, store.StateHint{}, nil, healthTo(registryv1.HealthState_HEALTH_STATE_HEALTHY, "p"))
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	if _, _, err := s.UpdateFrom(ctx, b.Instance, hintA, nil, func(in *registryv1.Instance) error {
		calls++
		in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY, Observer: "p"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Fatalf("fn called %d times with another owner's hint, want 2 (refused, retried from the stored state)", calls)
	}
	if _, err := s.KeepAliveAs(ctx, b.Secret, "orders", "b", b.LeaseID); err != nil {
		t.Fatalf("b's owner after a write with a's hint: %v", err)
	}
	if _, err := s.KeepAliveAs(ctx, a.Secret, "orders", "b", b.LeaseID); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("a's secret on b after a write with a's hint: %v, want ErrNotOwner", err)
	}
}

// A guard that no longer holds when the write reaches etcd: refused at
// once (fn asked once, no retry), nothing lands, and the refusal itself
// says so: no extra round trip to find out.
func TestUpdateFromRefusedWhenGuardNoLongerHolds(t *testing.T) {
	s, c, direct := countedStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := s.Register(ctx, inst("orders", "a"), 0)
	if err != nil {
		t.Fatal(err)
	}
	cur, hint, err := s.UpdateFrom(ctx, reg.Instance, store.StateHint{}, nil, healthTo(registryv1.HealthState_HEALTH_STATE_HEALTHY, "p"))
	if err != nil {
		t.Fatal(err)
	}
	key := s.Keys().Instance("orders", "a")
	h := hold(t, direct, "/test/leader")
	before, mod0, _, _ := rawKey(t, direct, key)
	for _, stale := range []bool{false, true} {
		from := cur
		if stale { // and the record changed too: the guard still wins
			if _, _, err := s.SetLifecycle(ctx, "orders", "a", registryv1.Lifecycle_LIFECYCLE_DRAINING, "op"); err != nil {
				t.Fatal(err)
			}
			before, mod0, _, _ = rawKey(t, direct, key)
		}
		var head int64
		n := 0
		c.take()
		_, _, err = s.UpdateFrom(ctx, from, hint, h.guard, func(in *registryv1.Instance) error {
			n++
			if n == 1 && !stale {
				h.depose(t, direct) // after fn, before the write
			}
			_, _, _, head = rawKey(t, direct, key)
			in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Observer: "deposed"}
			return nil
		})
		if !errors.Is(err, store.ErrGuard) {
			t.Fatalf("stale=%v: update under a guard that no longer holds: %v, want ErrGuard", stale, err)
		}
		if got := c.take(); n != 1 || got[txnCall] != 1 || len(got) != 1 {
			t.Fatalf("stale=%v: fn called %d times, calls %v: a failed guard must end the update in its one round trip", stale, n, got)
		}
		after, mod1, lease, now := rawKey(t, direct, key)
		if after != before || mod1 != mod0 || lease != reg.LeaseID || now != head {
			t.Fatalf("stale=%v: the refused write landed: mod %d -> %d, etcd %d -> %d", stale, mod0, mod1, head, now)
		}
	}
}

// A write sent into a paused link while its guard is lost reaches etcd
// after the deposition and is refused there.
func TestUpdateFromHeldInPausedLinkIsRefused(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cur, hint := registeredHealthy(ctx, t, s)
	key := s.Keys().Instance("orders", "a")
	h := hold(t, direct, "/test/leader")
	before, mod0, _, _ := rawKey(t, direct, key)
	p.Pause()
	done := make(chan error, 1)
	go func() {
		_, _, err := s.UpdateFrom(ctx, cur, hint, h.guard, healthTo(registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, "cut-off"))
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
		t.Fatal("UpdateFrom did not return after the link came back")
	}
	after, mod1, _, now := rawKey(t, direct, key)
	if after != before || mod1 != mod0 || now != head {
		t.Fatalf("the refused write landed: record mod %d -> %d, etcd at %d -> %d", mod0, mod1, head, now)
	}
}

// A record gone (deleted) or registered anew is reported as such.
func TestUpdateFromGone(t *testing.T) {
	s, _, _ := countedStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cur, hint := registeredHealthy(ctx, t, s)
	if _, _, err := s.Deregister(ctx, "orders", "a", 0); err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]store.StateHint{"no hint": {}, "a hint": hint} {
		if _, _, err := s.UpdateFrom(ctx, cur, h, nil, healthTo(registryv1.HealthState_HEALTH_STATE_DEGRADED, "p")); !errors.Is(err, record.ErrNotFound) {
			t.Fatalf("update of a deleted record (%s): %v, want ErrNotFound", name, err)
		}
	}
	if _, _, err := s.Get(ctx, "orders", "a"); !errors.Is(err, record.ErrNotFound) {
		t.Fatalf("after the refused updates: %v, want no record", err)
	}
}

// A concurrent write to a field the saved state does not hold (the
// version, written by the instance itself) is not lost by a write from
// a stale copy: the compare on the record's mod revision refuses it.
func TestUpdateFromKeepsConcurrentRecordChange(t *testing.T) {
	s, _, _ := countedStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cur, hint := registeredHealthy(ctx, t, s)
	if _, _, err := s.Update(ctx, "orders", "a", func(in *registryv1.Instance) error {
		in.Version = "v2"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.UpdateFrom(ctx, cur, hint, nil, healthTo(registryv1.HealthState_HEALTH_STATE_DEGRADED, "p")); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Get(ctx, "orders", "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != "v2" || got.GetHealth().GetState() != registryv1.HealthState_HEALTH_STATE_DEGRADED {
		t.Fatalf("stored version %q health %v: want the concurrent version kept and the health written", got.Version, got.GetHealth())
	}
}

// registeredHealthy registers orders/a and makes it HEALTHY through
// UpdateFrom, returning the record written and the state hint for the
// next UpdateFrom.
func registeredHealthy(ctx context.Context, t *testing.T, s *store.Store) (*registryv1.Instance, store.StateHint) {
	t.Helper()
	reg, err := s.Register(ctx, inst("orders", "a"), 0)
	if err != nil {
		t.Fatal(err)
	}
	cur, hint, err := s.UpdateFrom(ctx, reg.Instance, store.StateHint{}, nil, healthTo(registryv1.HealthState_HEALTH_STATE_HEALTHY, "p"))
	if err != nil {
		t.Fatal(err)
	}
	return cur, hint
}
