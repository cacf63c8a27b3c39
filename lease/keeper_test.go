package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/lease"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

func setup(t *testing.T) (*store.Store, *clientv3.Client) {
	t.Helper()
	cli := etcdtest.Start(t, false).Client(t)
	s, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	return s, cli
}

func inst() *registryv1.Instance {
	return &registryv1.Instance{Service: "orders", Id: "o-1", Address: "127.0.0.1:9000"}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A lease revoked behind the registration's back comes back by itself,
// under the same id and a new lease, and keeps its lifecycle.
func TestRevokedLeaseComesBack(t *testing.T) {
	s, cli := setup(t)
	ctx := context.Background()
	changes := make(chan lease.Status, 64)
	k, err := lease.Start(ctx, store.NewLeaseBackend(s), inst(), lease.Config{TTL: 3 * time.Second, DrainGrace: 100 * time.Millisecond,
		OnChange: func(st lease.Status) { changes <- st }})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, k)
	first := k.Status()
	if !first.Registered || first.Registrations != 1 {
		t.Fatalf("status after start = %+v", first)
	}
	if err := k.Drain(ctx, "maintenance"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(first.LeaseID)); err != nil {
		t.Fatal(err)
	}
	// Wait on the registration's own reports, not on etcd: the key is
	// back in etcd a moment before the Keeper records it. OnChange says
	// lost, then registered again.
	var seen []lease.Status
	for len(seen) == 0 || !seen[len(seen)-1].Registered || seen[len(seen)-1].Registrations != 2 {
		select {
		case st := <-changes:
			seen = append(seen, st)
		case <-time.After(time.Minute):
			t.Fatalf("no re-registration reported within a minute; OnChange so far %+v", seen)
		}
	}
	if len(seen) < 2 || seen[len(seen)-2].Registered {
		t.Fatalf("OnChange sequence %+v, want ... lost, registered", seen)
	}
	got, _, err := s.Get(ctx, "orders", "o-1")
	if err != nil {
		t.Fatal(err)
	}
	// The key itself is attached to the new lease (the record's lease_id
	// is only what was written into the value).
	kv, err := cli.Get(ctx, s.Keys().Instance("orders", "o-1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(kv.Kvs) != 1 || kv.Kvs[0].Lease == first.LeaseID || kv.Kvs[0].Lease != got.LeaseId {
		t.Fatalf("etcd holds %v, want the key under the new lease %x (revoked %x)", kv.Kvs, got.LeaseId, first.LeaseID)
	}
	if got.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || got.LifecycleReason != "maintenance" {
		t.Fatalf("re-registered as %v %q, want DRAINING kept", got.Lifecycle, got.LifecycleReason)
	}
	st := k.Status()
	if !st.Registered || st.Registrations != 2 || st.LeaseID != got.LeaseId {
		t.Fatalf("status = %+v, want registered twice under lease %x", st, got.LeaseId)
	}
}

// An instance whose key was deleted behind its back (with its lease, as an
// operator's deregister does) also comes back.
func TestDeregisteredBehindItsBackComesBack(t *testing.T) {
	s, _ := setup(t)
	ctx := context.Background()
	k, err := lease.Start(ctx, store.NewLeaseBackend(s), inst(), lease.Config{TTL: 2 * time.Second, DrainGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, k)
	if deleted, _, err := s.Deregister(ctx, "orders", "o-1", 0); err != nil || !deleted {
		t.Fatalf("deregister: %v %v", deleted, err)
	}
	waitFor(t, time.Minute, "re-registration", func() bool {
		_, _, err := s.Get(ctx, "orders", "o-1")
		return err == nil
	})
}

// Close writes DRAINING, holds it for the drain grace, then deletes and
// revokes: a watcher sees DRAINING before the delete. The grace here
// outlasts the test and ending Close's context cuts it short, so what is
// checked is an order: nothing is deregistered until the grace ends.
func TestCloseDrainsThenDeletes(t *testing.T) {
	s, cli := setup(t)
	ctx := context.Background()
	b := &watched{Backend: store.NewLeaseBackend(s), drained: make(chan struct{}, 1)}
	k, err := lease.Start(ctx, b, inst(), lease.Config{TTL: 5 * time.Second, DrainGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leaseID := k.Status().LeaseID
	key := s.Keys().Instance("orders", "o-1")
	head, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(wctx, key, clientv3.WithRev(head.Header.Revision+1))
	closeCtx, endGrace := context.WithCancel(ctx)
	defer endGrace()
	closed := make(chan error, 1)
	go func() { closed <- k.Close(closeCtx) }()

	select {
	case <-b.drained:
	case err := <-closed:
		t.Fatalf("Close returned (%v) without draining", err)
	}
	in, _, err := s.Get(ctx, "orders", "o-1")
	if err != nil || in.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING {
		t.Fatalf("during the grace: %v, %v; want the instance still there, DRAINING", in, err)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) during the drain grace", err)
	default:
	}
	b.graceEnded.Store(true)
	endGrace()
	err = <-closed
	if n := b.early.Load(); n != 0 {
		t.Fatalf("deregistered %d times before the drain grace ended", n)
	}
	if err != nil {
		t.Fatal(err)
	}
	var seq []string
	for len(seq) < 2 {
		resp := <-wch
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				seq = append(seq, "delete")
				continue
			}
			in, err := s.Keys().Decode(key, ev.Kv.Value, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			seq = append(seq, in.Lifecycle.String())
		}
	}
	if len(seq) != 2 || seq[0] != "LIFECYCLE_DRAINING" || seq[1] != "delete" {
		t.Fatalf("events = %v, want DRAINING then delete", seq)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(leaseID))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL != -1 {
		t.Fatal("lease not revoked on close")
	}
	if st := k.Status(); st.Registered || !st.Closed || st.TTL != 5*time.Second {
		t.Fatalf("closed keeper status %+v", st)
	}
	if err := k.Drain(ctx, "x"); !errors.Is(err, lease.ErrClosed) {
		t.Fatalf("drain after close: %v", err)
	}
}

// watched is a Backend that reports each DRAINING write on drained, and
// counts deregistrations made before the test set graceEnded.
type watched struct {
	lease.Backend
	drained    chan struct{}
	graceEnded atomic.Bool
	early      atomic.Int64
}

func (w *watched) SetLifecycle(ctx context.Context, service, id string, lc registryv1.Lifecycle, reason string) error {
	err := w.Backend.SetLifecycle(ctx, service, id, lc, reason)
	if err == nil && lc == registryv1.Lifecycle_LIFECYCLE_DRAINING {
		select {
		case w.drained <- struct{}{}:
		default:
		}
	}
	return err
}

func (w *watched) Deregister(ctx context.Context, o lease.Owner) error {
	if !w.graceEnded.Load() {
		w.early.Add(1)
	}
	return w.Backend.Deregister(ctx, o)
}

// closeAtEnd closes k when the test ends and fails it if Close fails.
func closeAtEnd(t *testing.T, k *lease.Keeper) {
	t.Cleanup(func() {
		if err := k.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

func TestStartRefusesBadInputAndDuplicates(t *testing.T) {
	s, cli := setup(t)
	ctx := context.Background()
	bad := inst()
	bad.Weight = 5000
	if _, err := lease.Start(ctx, store.NewLeaseBackend(s), bad, lease.Config{}); !errors.Is(err, record.ErrInvalid) {
		t.Fatalf("bad weight: %v", err)
	}
	if _, err := lease.Start(ctx, store.NewLeaseBackend(s), inst(), lease.Config{TTL: 500 * time.Millisecond}); !errors.Is(err, record.ErrInvalid) {
		t.Fatalf("ttl 500ms: %v", err)
	}
	k, err := lease.Start(ctx, store.NewLeaseBackend(s), inst(), lease.Config{DrainGrace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, k)
	if _, err := lease.Start(ctx, store.NewLeaseBackend(s), inst(), lease.Config{}); !errors.Is(err, record.ErrAlreadyExists) {
		t.Fatalf("second owner of the same id: %v", err)
	}
	for _, prefix := range []string{s.Keys().Instances(), s.States()} {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 1 {
			t.Fatalf("etcd holds %d keys under %s (%v), want the first owner's only", resp.Count, prefix, err)
		}
	}
}

// The first registration waits out an unavailable backend until ctx ends:
// it retries through transient failures (counted: one attempt each, then
// the one that succeeds), and gives up only when ctx does.
func TestStartGivesUpOnlyWithContext(t *testing.T) {
	s, _ := setup(t)
	fb := &flaky{Backend: store.NewLeaseBackend(s), failFirst: 3}
	k, err := lease.Start(context.Background(), fb, inst(), lease.Config{DrainGrace: time.Millisecond, MinBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("start through 3 transient failures: %v", err)
	}
	if err := k.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fb.calls != 4 {
		t.Fatalf("%d registration attempts, want 3 failures and 1 success", fb.calls)
	}
	fb2 := &flaky{Backend: store.NewLeaseBackend(s), failFirst: 1 << 30}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := lease.Start(ctx2, fb2, inst(), lease.Config{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("start against a dead backend: %v", err)
	}
}

// flaky fails its first registrations the way an unreachable regnode does.
type flaky struct {
	lease.Backend
	failFirst int
	calls     int
}

func (f *flaky) Register(ctx context.Context, in *registryv1.Instance, ttl time.Duration, secret string) (lease.Grant, error) {
	f.calls++
	if f.calls <= f.failFirst {
		return lease.Grant{}, errors.New("connection refused")
	}
	return f.Backend.Register(ctx, in, ttl, secret)
}

// A first registration that landed but whose answer was lost (a regnode
// that died mid-call) is still the Keeper's own on the retry: the Keeper
// made its secret before asking, so the retry replaces its record instead
// of meeting AlreadyExists, and the orphaned lease is revoked.
func TestLostFirstAnswerIsStillOurs(t *testing.T) {
	s, cli := setup(t)
	lb := &lostAnswer{Backend: store.NewLeaseBackend(s)}
	k, err := lease.Start(context.Background(), lb, inst(), lease.Config{DrainGrace: time.Millisecond, MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatalf("start after a lost first answer: %v", err)
	}
	closeAtEnd(t, k)
	if lb.calls != 2 {
		t.Fatalf("%d registration attempts, want the lost one and its retry", lb.calls)
	}
	leases, err := cli.Leases(context.Background())
	if err != nil || len(leases.Leases) != 1 || int64(leases.Leases[0].ID) != k.Status().LeaseID {
		t.Fatalf("leases %v (%v), want only the keeper's %x", leases, err, k.Status().LeaseID)
	}
}

// lostAnswer registers for real but reports the first registration as
// failed, the way a caller sees an answer that never arrived.
type lostAnswer struct {
	lease.Backend
	calls int
}

func (l *lostAnswer) Register(ctx context.Context, in *registryv1.Instance, ttl time.Duration, secret string) (lease.Grant, error) {
	l.calls++
	g, err := l.Backend.Register(ctx, in, ttl, secret)
	if l.calls == 1 && err == nil {
		return lease.Grant{}, errors.New("connection reset before the answer")
	}
	return g, err
}
