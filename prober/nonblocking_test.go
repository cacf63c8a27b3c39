package prober_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/probe"
	"github.com/regcluster/registry/prober"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// A health write held by a silent etcd (the prober's link paused) does not
// hold up probing: a transition is due and sent, and while it has not
// come back the prober runs 30 more probes. Once the link is back, it
// lands.
func TestProbingGoesOnWhileWriteIsHeld(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	link := etcdtest.NewProxy(t, m.ClientURL)
	// Txn calls sent, and those that came back, answered or not.
	var txnsSent, txnsDone atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != "/etcdserverpb.KV/Txn" {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		txnsSent.Add(1)
		defer txnsDone.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{link.URL()}, DialTimeout: 5 * time.Second, Logger: etcdtest.QuietLogger(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	st, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	dst, err := store.New(store.Config{Client: direct})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Two targets that answer, stored HEALTHY: nothing to write at first.
	var stops []func()
	for _, id := range []string{"a", "b"} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, serveTCP(lis))
		if _, err := dst.Register(ctx, &registryv1.Instance{Service: "orders", Id: id, Address: lis.Addr().String(),
			Check: steady(registryv1.CheckKind_CHECK_KIND_TCP, "")}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dst.Update(ctx, "orders", id, func(in *registryv1.Instance) error {
			in.Health = &registryv1.Health{State: healthy, Reason: "stored"}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	defer func() { stops[1]() }()
	insts, rev, _, err := dst.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	view := cache.New()
	if _, err := view.Apply(cache.Batch{Revision: rev, Snapshot: true, Instances: insts}); err != nil {
		t.Fatal(err)
	}
	lr, err := direct.Put(ctx, "/test/leader", "me")
	if err != nil {
		t.Fatal(err)
	}

	var probes, landed atomic.Int64
	pb, err := probe.New(probe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	pr, err := prober.New(prober.Config{Store: st, View: view.Snapshot, Probe: pb,
		Interval: 100 * time.Millisecond, OrphanRetention: -1, Node: "p", WriteTimeout: 10 * time.Minute,
		OnProbe:      func(health.Outcome, time.Duration) { probes.Add(1) },
		OnTransition: func(health.Transition) { landed.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pr.Lead(lctx, &election.Leadership{Key: "/test/leader", Rev: lr.Header.Revision}) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Lead: %v", err)
		}
	}()
	waitUntil(t, "the first probes", func() bool { return probes.Load() >= 4 })

	link.Pause()
	sent0, txns0 := txnsSent.Load(), txnsDone.Load()
	stops[0]() // a stops answering: DEGRADED is due, and its write is held
	waitUntil(t, "a's write to be sent", func() bool { return txnsSent.Load() > sent0 })
	p0 := probes.Load()
	waitUntil(t, "30 probes while the write is held", func() bool { return probes.Load() >= p0+30 })
	if n := txnsDone.Load() - txns0; n != 0 || landed.Load() != 0 {
		t.Fatalf("%d writes came back while the link was paused (%d landed): the probes above ran only after a write gave up", n, landed.Load())
	}
	link.Resume()
	waitUntil(t, "the held write to land", func() bool { return landed.Load() >= 1 })
	got, _, err := dst.Get(ctx, "orders", "a")
	if err != nil {
		t.Fatal(err)
	}
	if s := got.GetHealth().GetState(); s != degraded && s != unavailable {
		t.Fatalf("a's health after the link came back: %v", got.GetHealth())
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
