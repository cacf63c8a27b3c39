package lease_test

import (
	"context"
	"errors"
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

// A lease revoked behind the registration's back comes back by itself
// within about one TTL, under the same id, and keeps its lifecycle.
func TestRevokedLeaseComesBack(t *testing.T) {
	s, cli := setup(t)
	ctx := context.Background()
	changes := make(chan lease.Status, 16)
	k, err := lease.Start(ctx, lease.NewEtcdBackend(s), inst(), lease.Config{TTL: 3 * time.Second, DrainGrace: 100 * time.Millisecond,
		OnChange: func(st lease.Status) { changes <- st }})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	first := k.Status()
	if !first.Registered || first.Registrations != 1 {
		t.Fatalf("status after start = %+v", first)
	}
	if err := k.Drain(ctx, "maintenance"); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(first.LeaseID)); err != nil {
		t.Fatal(err)
	}
	var got *registryv1.Instance
	waitFor(t, 6*time.Second, "re-registration", func() bool {
		got, _, err = s.Get(ctx, "orders", "o-1")
		return err == nil
	})
	took := time.Since(revoked)
	t.Logf("re-registered %s after the revoke (TTL 3s)", took.Round(time.Millisecond))
	if got.LeaseId == first.LeaseID {
		t.Fatal("came back under the revoked lease")
	}
	if got.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || got.LifecycleReason != "maintenance" {
		t.Fatalf("re-registered as %v %q, want DRAINING kept", got.Lifecycle, got.LifecycleReason)
	}
	st := k.Status()
	if !st.Registered || st.Registrations != 2 || st.LeaseID != got.LeaseId {
		t.Fatalf("status = %+v, want registered twice under lease %x", st, got.LeaseId)
	}
	// OnChange saw: registered(1), lost, registered(2).
	var seen []bool
	for len(changes) > 0 {
		seen = append(seen, (<-changes).Registered)
	}
	if len(seen) < 2 || seen[len(seen)-2] || !seen[len(seen)-1] {
		t.Fatalf("OnChange sequence = %v, want ... lost, registered", seen)
	}
}

// An instance whose key was deleted behind its back (with its lease, as an
// operator's deregister does) also comes back.
func TestDeregisteredBehindItsBackComesBack(t *testing.T) {
	s, _ := setup(t)
	ctx := context.Background()
	k, err := lease.Start(ctx, lease.NewEtcdBackend(s), inst(), lease.Config{TTL: 2 * time.Second, DrainGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	if deleted, _, err := s.Deregister(ctx, "orders", "o-1", 0); err != nil || !deleted {
		t.Fatalf("deregister: %v %v", deleted, err)
	}
	waitFor(t, 5*time.Second, "re-registration", func() bool {
		_, _, err := s.Get(ctx, "orders", "o-1")
		return err == nil
	})
}

// Close writes DRAINING, waits the grace period, then deletes and revokes:
// a watcher sees DRAINING before the delete.
func TestCloseDrainsThenDeletes(t *testing.T) {
	s, cli := setup(t)
	ctx := context.Background()
	k, err := lease.Start(ctx, lease.NewEtcdBackend(s), inst(), lease.Config{TTL: 5 * time.Second, DrainGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	leaseID := k.Status().LeaseID
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	key := s.Keys().Instance("orders", "o-1")
	wch := cli.Watch(wctx, key)
	start := time.Now()
	if err := k.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("Close took %s, shorter than the drain grace", took)
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
	if seq[0] != "LIFECYCLE_DRAINING" || seq[1] != "delete" {
		t.Fatalf("events = %v, want DRAINING then delete", seq)
	}
	ttl, _ := cli.TimeToLive(ctx, clientv3.LeaseID(leaseID))
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

func TestStartRefusesBadInputAndDuplicates(t *testing.T) {
	s, cli := setup(t)
	ctx := context.Background()
	bad := inst()
	bad.Weight = 5000
	if _, err := lease.Start(ctx, lease.NewEtcdBackend(s), bad, lease.Config{}); !errors.Is(err, record.ErrInvalid) {
		t.Fatalf("bad weight: %v", err)
	}
	if _, err := lease.Start(ctx, lease.NewEtcdBackend(s), inst(), lease.Config{TTL: 500 * time.Millisecond}); !errors.Is(err, record.ErrInvalid) {
		t.Fatalf("ttl 500ms: %v", err)
	}
	k, err := lease.Start(ctx, lease.NewEtcdBackend(s), inst(), lease.Config{DrainGrace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	if _, err := lease.Start(ctx, lease.NewEtcdBackend(s), inst(), lease.Config{}); !errors.Is(err, record.ErrAlreadyExists) {
		t.Fatalf("second owner of the same id: %v", err)
	}
	for _, prefix := range []string{s.Keys().Instances(), s.States()} {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 1 {
			t.Fatalf("etcd holds %d keys under %s (%v), want the first owner's only", resp.Count, prefix, err)
		}
	}
}

// The first registration waits out an unavailable backend until ctx ends.
func TestStartGivesUpOnlyWithContext(t *testing.T) {
	s, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	fb := &flaky{Backend: lease.NewEtcdBackend(s), failFirst: 3}
	k, err := lease.Start(ctx, fb, inst(), lease.Config{DrainGrace: time.Millisecond, MinBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("start through 3 transient failures: %v", err)
	}
	k.Close(context.Background())
	fb2 := &flaky{Backend: lease.NewEtcdBackend(s), failFirst: 1 << 30}
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

func (f *flaky) Register(ctx context.Context, in *registryv1.Instance, ttl time.Duration) (lease.Grant, error) {
	f.calls++
	if f.calls <= f.failFirst {
		return lease.Grant{}, errors.New("connection refused")
	}
	return f.Backend.Register(ctx, in, ttl)
}
