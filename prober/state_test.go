package prober_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/probe"
	"github.com/regcluster/registry/prober"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// An instance's first probe runs at once, whether it registers while the
// prober leads or was registered before the prober took over: with a check
// interval of an hour, a first probe spread over the interval would almost
// never come within the test.
func TestFirstProbeAtOnce(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	st, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer serveTCP(lis)()
	hourly := &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP, Interval: durationpb.New(time.Hour),
		Timeout: durationpb.New(2 * time.Second), SlowThreshold: durationpb.New(time.Second)}
	before := recordKey(t, cli, record.DefaultPrefix, "before")
	if _, err := st.Register(context.Background(), &registryv1.Instance{Service: "orders", Id: "before",
		Address: lis.Addr().String(), Check: hourly}, 0); err != nil {
		t.Fatal(err)
	}
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, SessionTTL: 2 * time.Second}, m.ClientURL)
	if h := before.await(healthy, 30*time.Second); h.Reason != "first probe ok" {
		t.Fatalf("registered before the takeover: %v", h)
	}
	after := recordKey(t, cli, record.DefaultPrefix, "after")
	f := &fixture{rn: rn, api: apiOf(t, rn)}
	f.register(t, "after", lis.Addr().String(), hourly)
	if h := after.await(healthy, 30*time.Second); h.Reason != "first probe ok" {
		t.Fatalf("registered while leading: %v", h)
	}
}

// An instance that never answers goes UNAVAILABLE after N failures, in one
// write, never through DEGRADED, and is routable at no version of its
// record.
func TestNeverHealthyGoesUnavailable(t *testing.T) {
	f := newFixture(t)
	rec := f.record(t, "dead-1")
	f.register(t, "dead-1", closedAddr(t), steady(registryv1.CheckKind_CHECK_KIND_TCP, ""))
	h := rec.await(unavailable, 30*time.Second)
	if !strings.HasPrefix(h.Reason, "never healthy: 3 consecutive errors") {
		t.Fatalf("reason %q", h.Reason)
	}
	if got := rec.states(); len(got) != 1 {
		t.Fatalf("health written %v, want UNAVAILABLE alone", got)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, in := range rec.versions {
		if record.Routable(in) {
			t.Fatalf("routable at revision %d: %v", in.ModRevision, in)
		}
	}
}

// The leader deletes, through its fence, the saved state of an instance
// whose record is gone, and keeps the saved state of a live one.
func TestSweepsOrphanedState(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	st, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var gone *store.Registration
	for _, id := range []string{"live", "gone"} {
		reg, err := st.Register(ctx, &registryv1.Instance{Service: "orders", Id: id, Address: "127.0.0.1:1", Incarnation: id}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		gone = reg
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(gone.LeaseID)); err != nil {
		t.Fatal(err)
	}
	// A leadership as the election grants it: a key and its create revision.
	lk := record.NewKeys("").Election() + "/test"
	put, err := cli.Put(ctx, lk, "test")
	if err != nil {
		t.Fatal(err)
	}
	pb, err := probe.New(probe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	p, err := prober.New(prober.Config{Store: st, View: cache.New().Snapshot, Probe: pb, OrphanRetention: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Lead(lctx, &election.Leadership{Key: lk, Rev: put.Header.Revision}) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := cli.Get(ctx, st.StateKey("orders", "gone"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphaned saved state was never deleted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp, err := cli.Get(ctx, st.StateKey("orders", "live")); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the live instance's saved state: %v, %v", resp, err)
	}
}

func apiOf(t *testing.T, rn *regnodetest.Regnode) registryv1.RegistryClient {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.API()
}

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A leader whose fence no longer holds deletes no saved state: the fence
// refuses the delete, and the sweep stops.
func TestDeposedLeaderSweepsNothing(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	st, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reg, err := st.Register(ctx, &registryv1.Instance{Service: "orders", Id: "gone", Address: "127.0.0.1:1", Incarnation: "x"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(reg.LeaseID)); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	pb, err := probe.New(probe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	p, err := prober.New(prober.Config{Store: st, View: cache.New().Snapshot, Probe: pb, OrphanRetention: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	// A leadership whose key is gone: what a paused leader holds after its
	// session expired.
	go func() {
		done <- p.Lead(lctx, &election.Leadership{Key: record.NewKeys("").Election() + "/expired", Rev: 2})
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "sweep refused by the fence") {
		if time.Now().After(deadline) {
			t.Fatalf("the sweep never met the fence; logs:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp, err := cli.Get(ctx, st.StateKey("orders", "gone")); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("a deposed leader deleted the saved state: %v, %v", resp, err)
	}
}
