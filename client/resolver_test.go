package client_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
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

// stateRecorder is a gRPC balancer that records every resolver state the
// ClientConn hands it, in order, and makes no connections. Each Build is
// sent on recorders, so a test can reach the balancer's ClientConn (to call
// ResolveNow as a real balancer does when a subchannel fails).
type stateRecorder struct {
	cc     balancer.ClientConn
	mu     sync.Mutex
	states [][]string // sorted addresses of each state
	revs   []int64    // client.StateRevision of each state
}

const recorderName = "registry_test_recorder"

var recorders = make(chan *stateRecorder, 8)

type recorderBuilder struct{}

func (recorderBuilder) Name() string { return recorderName }

func (recorderBuilder) Build(cc balancer.ClientConn, _ balancer.BuildOptions) balancer.Balancer {
	r := &stateRecorder{cc: cc}
	recorders <- r
	return r
}

func (r *stateRecorder) UpdateClientConnState(s balancer.ClientConnState) error {
	addrs := make([]string, 0, len(s.ResolverState.Addresses))
	for _, a := range s.ResolverState.Addresses {
		addrs = append(addrs, a.Addr)
	}
	slices.Sort(addrs)
	r.mu.Lock()
	r.states = append(r.states, addrs)
	r.revs = append(r.revs, client.StateRevision(s.ResolverState))
	r.mu.Unlock()
	return nil
}

func (r *stateRecorder) ResolverError(error)                                        {}
func (r *stateRecorder) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {}
func (r *stateRecorder) Close()                                                     {}
func (r *stateRecorder) ExitIdle()                                                  {}

func (r *stateRecorder) recorded() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.states)
}

func (r *stateRecorder) revisions() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.revs)
}

func init() { balancer.Register(recorderBuilder{}) }

// watchStreamsEnded is how many subscription streams (Watch or Subscribe)
// rn has seen end.
func watchStreamsEnded(t *testing.T, rn *regnodetest.Regnode) int {
	t.Helper()
	fams, err := rn.Node.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fams {
		if f.GetName() != "registry_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && (l.GetValue() == "/registry.v1.Registry/Watch" || l.GetValue() == "/registry.v1.Registry/Subscribe") {
					n += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return n
}

// Views reach grpc in revision order while changes arrive and grpc calls
// ResolveNow at the same time (as it does whenever a subchannel fails):
// instances are registered one by one, so the state at each revision is a
// prefix of them, and every state the ClientConn hands its balancer must
// be a prefix at least as long as the one before. ResolveNow on a healthy
// subscription must not tear its Watch stream down.
func TestResolverUpdatesInRevisionOrder(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	cc, err := grpc.NewClient("registry:///orders", grpc.WithResolvers(c.ResolverBuilder()),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The resolver pushes our policy's service config; disabled, the
		// recorder given here is used instead.
		grpc.WithDisableServiceConfig(),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"`+recorderName+`":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cc.Connect()
	var rec *stateRecorder
	select {
	case rec = <-recorders:
	case <-time.After(10 * time.Second):
		t.Fatal("the ClientConn built no balancer")
	}
	const n = 150
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", 20000+i) }
	// The subscription is up before the race starts (its first, empty
	// state reached grpc), so every ResolveNow below meets a healthy one.
	// (The resolver's very first state, pushed at Build before any
	// snapshot, has revision 0: it says the list is not known yet.)
	waitFor(t, 10*time.Second, "the first state", func() bool {
		revs := rec.revisions()
		return len(revs) > 0 && revs[len(revs)-1] > 0
	})
	ended := watchStreamsEnded(t, rn)

	var (
		wg      sync.WaitGroup
		lastPut atomic.Int64
	)
	writing := make(chan struct{})
	var resolveNows atomic.Int64
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(writing)
		for i := 1; i <= n; i++ {
			b, err := record.Encode(&registryv1.Instance{Service: "orders", Id: fmt.Sprintf("o-%03d", i), Address: addr(i),
				Weight: 100, Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING})
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := rn.Etcd.Put(context.Background(), keys.Instance("orders", fmt.Sprintf("o-%03d", i)), string(b))
			if err != nil {
				t.Error(err)
				return
			}
			lastPut.Store(resp.Header.Revision)
		}
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-writing:
				return
			default:
			}
			rec.cc.ResolveNow(resolver.ResolveNowOptions{})
			resolveNows.Add(1)
			runtime.Gosched()
		}
	}()
	wg.Wait()
	waitFor(t, 20*time.Second, "all instances in the last state", func() bool {
		st := rec.recorded()
		return len(st[len(st)-1]) == n
	})
	states := rec.recorded()
	prev := -1
	for i, st := range states {
		for j, a := range st {
			if want := addr(j + 1); a != want {
				t.Fatalf("state %d of %d: address %d is %s, want %s: not the view of one revision", i, len(states), j, a, want)
			}
		}
		if len(st) < prev {
			t.Fatalf("state %d of %d has %d instances after one with %d: an older view after a newer one", i, len(states), len(st), prev)
		}
		prev = len(st)
	}
	revs := rec.revisions()
	for i := 1; i < len(revs); i++ {
		if revs[i] < revs[i-1] {
			t.Fatalf("state %d carries revision %d after %d", i, revs[i], revs[i-1])
		}
	}
	if last := revs[len(revs)-1]; last != lastPut.Load() {
		t.Fatalf("the last state carries revision %d, the last put was at %d", last, lastPut.Load())
	}
	if got := watchStreamsEnded(t, rn) - ended; got != 0 {
		t.Fatalf("%d ResolveNow calls on a healthy subscription ended %d Watch streams, want 0", resolveNows.Load(), got)
	}
	t.Logf("%d states pushed, %d ResolveNow calls", len(states), resolveNows.Load())
}
