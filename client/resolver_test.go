package client_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// backend is a real gRPC server counting the calls it answers.
type backend struct {
	addr  string
	calls atomic.Int64
}

func startBackend(t *testing.T) *backend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		b.calls.Add(1)
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return b
}

// The resolver routes to SERVING instances, stops routing to one that is
// drained, marked UNAVAILABLE or deregistered, and carries weight, zone
// and health as attributes.
func TestResolverFollowsRoutableInstances(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	api := c.API()
	ctx := context.Background()
	b1, b2 := startBackend(t), startBackend(t)
	for i, b := range []*backend{b1, b2} {
		id := []string{"b1", "b2"}[i]
		if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{
			Service: "orders", Id: id, Address: b.addr, Zone: "z" + id, Weight: 200}}); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := grpc.NewClient("registry:///orders", grpc.WithResolvers(c.ResolverBuilder()),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	call := func(n int) {
		t.Helper()
		for range n {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			_, err := hc.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	call(20)
	if b1.calls.Load() == 0 || b2.calls.Load() == 0 {
		t.Fatalf("round robin over both: b1 %d, b2 %d", b1.calls.Load(), b2.calls.Load())
	}
	routesOnlyTo := func(what string, want *backend, other *backend) {
		t.Helper()
		waitFor(t, time.Minute, what, func() bool {
			before := other.calls.Load()
			call(10)
			return other.calls.Load() == before
		})
		before := want.calls.Load()
		call(10)
		if want.calls.Load() != before+10 {
			t.Fatalf("%s: %d of 10 calls reached the remaining backend", what, want.calls.Load()-before)
		}
	}
	if _, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "b2"}); err != nil {
		t.Fatal(err)
	}
	routesOnlyTo("drained b2 out of rotation", b1, b2)
	if _, err := api.Undrain(ctx, &registryv1.UndrainRequest{Service: "orders", Id: "b2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "b2 back", func() bool {
		before := b2.calls.Load()
		call(10)
		return b2.calls.Load() > before
	})
	// A health write as the prober makes it: UNAVAILABLE leaves rotation.
	st, err := storeFor(t, rn)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Update(ctx, "orders", "b1", func(in *registryv1.Instance) error {
		in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Since: timestamppb.Now(), Reason: "test"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	routesOnlyTo("UNAVAILABLE b1 out of rotation", b2, b1)
	if _, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "b1"}); err != nil {
		t.Fatal(err)
	}
	call(5)
}

// Resolvers of one service share one subscription: building many does
// not open many Watch streams, and closing all of them keeps it for reuse.
func TestResolversShareOneSubscription(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	if _, err := c.API().Register(context.Background(), &registryv1.RegisterRequest{Instance: &registryv1.Instance{
		Service: "orders", Id: "o-1", Address: "127.0.0.1:1", Zone: "eu-1", Weight: 40}}); err != nil {
		t.Fatal(err)
	}
	b := c.ResolverBuilder()
	var ccs []*fakeConn
	var rs []resolver.Resolver
	for range 10 {
		fc := &fakeConn{}
		r, err := b.Build(resolver.Target{URL: *mustURL(t, "registry:///orders")}, fc, resolver.BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ccs, rs = append(ccs, fc), append(rs, r)
	}
	waitFor(t, time.Minute, "all resolvers updated", func() bool {
		for _, fc := range ccs {
			if len(fc.state().Addresses) != 1 {
				return false
			}
		}
		return true
	})
	a := ccs[0].state().Addresses[0]
	if a.Addr != "127.0.0.1:1" || client.Weight(a) != 40 || client.Zone(a) != "eu-1" || client.Health(a) != registryv1.HealthState_HEALTH_STATE_UNKNOWN {
		t.Fatalf("address %v weight %d zone %q health %v", a.Addr, client.Weight(a), client.Zone(a), client.Health(a))
	}
	if n := rn.Node.Hub().Subscribers(); n != 1 {
		t.Fatalf("10 resolvers opened %d subscriptions, want 1", n)
	}
	// The same with real gRPC client connections.
	for range 5 {
		cc, err := grpc.NewClient("registry:///orders", grpc.WithResolvers(b), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		cc.Connect()
		defer cc.Close()
		waitFor(t, time.Minute, "the channel to leave idle (its resolver built)", func() bool {
			return cc.GetState() != connectivity.Idle
		})
	}
	// The channels' failed connections make grpc-go call ResolveNow, and
	// each resync reopens the shared subscription's stream: the regnode
	// may count the old stream and the new one for a moment, so what is
	// asserted is where the count settles: channels with subscriptions
	// of their own would keep it above one.
	waitFor(t, time.Minute, "one subscription", func() bool { return rn.Node.Hub().Subscribers() == 1 })
	for _, r := range rs {
		r.ResolveNow(resolver.ResolveNowOptions{})
		r.Close()
	}
	// Rebuilt after all closed (grpc-go's idle mode): served at once from
	// the lingering subscription.
	fc := &fakeConn{}
	r, err := b.Build(resolver.Target{URL: *mustURL(t, "registry:///orders")}, fc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(fc.state().Addresses) != 1 {
		t.Fatal("a rebuilt resolver did not get the shared view at once")
	}
	if _, err := b.Build(resolver.Target{URL: *mustURL(t, "registry:///Not_Valid")}, &fakeConn{}, resolver.BuildOptions{}); err == nil {
		t.Fatal("invalid service accepted")
	}
}

// fakeConn records what a resolver reports; it is the resolver's test
// double in grpc-go's own style (resolver.ClientConn is an interface that
// the resolver calls into).
type fakeConn struct {
	resolver.ClientConn
	mu sync.Mutex
	st resolver.State
}

func (f *fakeConn) UpdateState(s resolver.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st = s
	return nil
}

func (f *fakeConn) state() resolver.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}
