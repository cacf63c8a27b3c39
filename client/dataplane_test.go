package client_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/balance"
	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// ParseServiceConfig lets fakeConn (resolver_test.go) take the service
// config the resolver pushes: it refuses it, as a ClientConn with service
// configs disabled would, and the resolver pushes the state without one.
func (f *fakeConn) ParseServiceConfig(string) *serviceconfig.ParseResult {
	return &serviceconfig.ParseResult{Err: errors.New("fakeConn parses no service config")}
}

func register(t *testing.T, api registryv1.RegistryClient, id, addr string, weight uint32) {
	t.Helper()
	// A TTL longer than any test here: nothing keeps these leases alive.
	if _, err := api.Register(context.Background(), &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute), Instance: &registryv1.Instance{
		Service: "orders", Id: id, Address: addr, Weight: weight}}); err != nil {
		t.Fatal(err)
	}
}

// shares makes n calls and returns each backend's share in percent.
func shares(t *testing.T, cc *grpc.ClientConn, n int, bs ...*backend) []float64 {
	t.Helper()
	hc := healthpb.NewHealthClient(cc)
	before := make([]int64, len(bs))
	for i, b := range bs {
		before[i] = b.calls.Load()
	}
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	out := make([]float64, len(bs))
	for i, b := range bs {
		out[i] = float64(b.calls.Load()-before[i]) * 100 / float64(n)
	}
	return out
}

func noSlowStart() *client.Policy {
	p := client.DefaultPolicy()
	p.SlowStartWindow = 0
	return &p
}

// End to end on a real regnode: c.DialOptions() alone gives weighted
// balancing over the registered instances, and so does
// grpc.WithResolvers(c.ResolverBuilder()) alone, through the service
// config the resolver pushes (pick_first, grpc-go's default, would send
// every call to one instance).
func TestDialOptionsBalanceByWeight(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Policy: noSlowStart()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bs := []*backend{startBackend(t), startBackend(t), startBackend(t)}
	for i, w := range []uint32{100, 100, 200} {
		register(t, c.API(), fmt.Sprintf("b%d", i), bs[i].addr, w)
	}
	for name, opts := range map[string][]grpc.DialOption{
		"DialOptions":   c.DialOptions(),
		"WithResolvers": {grpc.WithResolvers(c.ResolverBuilder()), grpc.WithTransportCredentials(insecure.NewCredentials())},
	} {
		t.Run(name, func(t *testing.T) {
			cc, err := grpc.NewClient("registry:///orders", opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			waitFor(t, 10*time.Second, "calls reaching all three", func() bool {
				s := shares(t, cc, 30, bs...)
				return s[0] > 0 && s[1] > 0 && s[2] > 0
			})
			got := shares(t, cc, 2000, bs...)
			for i, want := range []float64{25, 25, 50} {
				if math.Abs(got[i]-want) > 5 {
					t.Errorf("b%d: %.1f%% of calls, want %.0f±5 (all %v)", i, got[i], want, got)
				}
			}
		})
	}
	if c.Metrics().Counts().Picks["orders/b2"] == 0 {
		t.Error("picks not counted in the client's metrics")
	}
}

// Bad policies are refused by New, naming the field.
func TestPolicyValidatedByNew(t *testing.T) {
	p := client.DefaultPolicy()
	p.MaxEjectionPercent = 101
	if _, err := client.New(client.Config{Policy: &p}); !errors.Is(err, balance.ErrInvalidPolicy) || !strings.Contains(err.Error(), "maxEjectionPercent") {
		t.Fatalf("bad Policy: %v", err)
	}
	p = client.DefaultPolicy()
	p.Picker = "random"
	if _, err := client.New(client.Config{Policies: map[string]client.Policy{"orders": p}}); !errors.Is(err, balance.ErrInvalidPolicy) || !strings.Contains(err.Error(), `"orders"`) {
		t.Fatalf("bad Policies entry: %v", err)
	}
}

// Two independent clients compute the same slow-start weight for one
// instance at the same moment, from the time in its record: one that
// starts well after the instance became routable does not ramp it from
// its own start.
func TestTwoClientsRampInStep(t *testing.T) {
	rn := regnodetest.Start(t)
	p := client.DefaultPolicy()
	p.SlowStartWindow = 12 * time.Second // steps at 4, 8 and 12 s
	newC := func() (*client.Client, *grpc.ClientConn) {
		c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Policy: &p})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		cc.Connect()
		return c, cc
	}
	b := startBackend(t)
	c1, cc1 := newC()
	register(t, c1.API(), "b0", b.addr, 200)
	got, err := c1.API().Get(context.Background(), &registryv1.GetRequest{Service: "orders", Id: "b0"})
	if err != nil {
		t.Fatal(err)
	}
	since := got.GetInstance().GetRoutableSince().AsTime()
	if got.GetInstance().GetRoutableSince() == nil || time.Since(since) > time.Minute {
		t.Fatalf("routable_since %v not stamped at registration", got.GetInstance().GetRoutableSince())
	}
	if _, err := healthpb.NewHealthClient(cc1).Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the first step over", func() bool { return time.Since(since) >= p.SlowStartWindow/3 })
	c2, cc2 := newC()
	if _, err := healthpb.NewHealthClient(cc2).Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	var w1, w2, want int64
	waitFor(t, 10*time.Second, "both clients at the record's step", func() bool {
		pct, _ := balance.RampPercent(since, time.Now(), p.SlowStartWindow)
		want = int64(200 * pct / 100)
		w1, w2 = c1.Metrics().Counts().Weights["orders/b0"], c2.Metrics().Counts().Weights["orders/b0"]
		if want == 200 {
			t.Fatal("the ramp ended before both clients agreed on a step of it")
		}
		return w1 == want && w2 == want
	})
	if w2 <= 10 {
		t.Fatalf("the late client ramps from its own start: weight %d", w2)
	}
	t.Logf("both clients at weight %d of 200", w2)
}

// End to end: 3 of 4 instances UNAVAILABLE in the registry (health
// written as the prober writes it): calls spread over all 4 and the panic
// counter moves; all drained: Unavailable with the draining message, at
// once.
func TestPanicAndAllDrainingEndToEnd(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Policy: noSlowStart()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := storeFor(t, rn)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var bs []*backend
	for i := range 4 {
		b := startBackend(t)
		bs = append(bs, b)
		register(t, c.API(), fmt.Sprintf("b%d", i), b.addr, 100)
	}
	for i := 1; i < 4; i++ {
		if _, _, err := st.Update(ctx, "orders", fmt.Sprintf("b%d", i), func(in *registryv1.Instance) error {
			in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Reason: "test"}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	waitFor(t, 10*time.Second, "calls on all four in panic mode", func() bool {
		s := shares(t, cc, 40, bs...)
		return s[0] > 0 && s[1] > 0 && s[2] > 0 && s[3] > 0
	})
	got := shares(t, cc, 400, bs...)
	for i, s := range got {
		if s < 12 {
			t.Errorf("b%d: %.1f%% of calls in panic mode (%v)", i, s, got)
		}
	}
	if n := c.Metrics().Counts().PanicEnters; n == 0 {
		t.Fatal("panic mode not counted")
	}
	for i := range 4 {
		if _, err := c.API().Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: fmt.Sprintf("b%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	hc := healthpb.NewHealthClient(cc)
	waitFor(t, 10*time.Second, "the draining message", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		start := time.Now()
		_, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		if time.Since(start) > 10*time.Second {
			t.Fatalf("a call to an all-draining service waited: %v", err)
		}
		return status.Code(err) == codes.Unavailable && status.Convert(err).Message() == "all 4 instances of orders are draining"
	})
}

// Config.Zone reaches the balancer: with six instances over zones a and
// b, a caller in a keeps ≥ 95% of its calls in a.
func TestZoneEndToEnd(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Policy: noSlowStart(), Zone: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var bs []*backend
	for i := range 6 {
		b := startBackend(t)
		bs = append(bs, b)
		if _, err := c.API().Register(context.Background(), &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute), Instance: &registryv1.Instance{
			Service: "orders", Id: fmt.Sprintf("b%d", i), Address: b.addr, Zone: []string{"a", "b"}[i%2]}}); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cc.Connect()
	waitFor(t, 10*time.Second, "six instances ready", func() bool { return len(c.Metrics().Counts().Weights) == 6 })
	s := shares(t, cc, 1000, bs...)
	if inA := s[0] + s[2] + s[4]; inA < 95 {
		t.Fatalf("zone a got %.1f%% of calls (%v), want ≥ 95%%", inA, s)
	}
}

// startSickBackend is a real gRPC server that fails every call with
// Unavailable after counting it: an instance that is up but sick.
func startSickBackend(t *testing.T) *backend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		b.calls.Add(1)
		return nil, status.Error(codes.Unavailable, "sick")
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return b
}

// Config.Policies changes the policy of one service, through the service
// config the resolver pushes for it (DialOptions' default is the Config's
// Policy). The same three backends are registered as orders and as
// payments, one of them failing every call with Unavailable (after the
// call reached it: only an idempotent method may be retried): orders,
// whose own policy names the method idempotent, retries on another
// instance and no call fails; payments, on the default policy, sees the
// failures.
func TestPerServicePolicy(t *testing.T) {
	rn := regnodetest.Start(t)
	def := client.DefaultPolicy()
	def.SlowStartWindow = 0
	def.ConsecutiveFailures = 1000 // no ejection: the sick one keeps its share
	orders := def
	orders.Idempotent = []string{"/grpc.health.v1.Health/*"}
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Policy: &def, Policies: map[string]client.Policy{"orders": orders}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bs := []*backend{startBackend(t), startBackend(t), startSickBackend(t)}
	for _, svc := range []string{"orders", "payments"} {
		for i, b := range bs {
			if _, err := c.API().Register(context.Background(), &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
				Instance: &registryv1.Instance{Service: svc, Id: fmt.Sprintf("b%d", i), Address: b.addr}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	failed := map[string]int{}
	for _, svc := range []string{"orders", "payments"} {
		cc, err := grpc.NewClient("registry:///"+svc, c.DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		hc := healthpb.NewHealthClient(cc)
		call := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			return err
		}
		// Connected to all three (a call reached each) before counting.
		before := make([]int64, len(bs))
		for i, b := range bs {
			before[i] = b.calls.Load()
		}
		waitFor(t, 30*time.Second, svc+" calling all three", func() bool {
			_ = call()
			for i, b := range bs {
				if b.calls.Load() == before[i] {
					return false
				}
			}
			return true
		})
		sick := bs[2].calls.Load()
		for range 100 {
			if err := call(); err != nil {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("%s: %v", svc, err)
				}
				failed[svc]++
			}
		}
		if bs[2].calls.Load()-sick < 10 {
			t.Fatalf("%s: the sick backend got %d of 100 calls: the test proves less", svc, bs[2].calls.Load()-sick)
		}
	}
	t.Logf("failed calls of 100: %v", failed)
	if failed["orders"] != 0 || failed["payments"] == 0 {
		t.Fatalf("failed calls of 100: %v; want none for orders (its policy retries), some for payments (the default does not)", failed)
	}
}

// Panic mode calls instances the prober judges sick, never one that says
// itself it is not ready: with one HEALTHY, two UNAVAILABLE and one
// STARTING instance, calls spread over the first three (panic: one of
// three healthy) and none reaches the STARTING one (the closest right
// thing to the "every non-DRAINING instance": STARTING is the
// instance's own word that it must not get calls yet).
func TestPanicLeavesStartingOut(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Policy: noSlowStart()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := storeFor(t, rn)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var bs []*backend
	for i := range 4 {
		b := startBackend(t)
		bs = append(bs, b)
		in := &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("b%d", i), Address: b.addr}
		if i == 3 {
			in.Lifecycle = registryv1.Lifecycle_LIFECYCLE_STARTING
		}
		if _, err := c.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute), Instance: in}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < 3; i++ {
		if _, _, err := st.Update(ctx, "orders", fmt.Sprintf("b%d", i), func(in *registryv1.Instance) error {
			in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Reason: "test"}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	waitFor(t, 10*time.Second, "calls on the three non-STARTING ones in panic mode", func() bool {
		s := shares(t, cc, 30, bs...)
		return s[0] > 0 && s[1] > 0 && s[2] > 0
	})
	if n := c.Metrics().Counts().PanicEnters; n == 0 {
		t.Fatal("panic mode not counted")
	}
	got := shares(t, cc, 300, bs...)
	if got[3] != 0 || bs[3].calls.Load() != 0 {
		t.Fatalf("the STARTING instance got calls in panic mode: %v (%d in all)", got, bs[3].calls.Load())
	}
}
