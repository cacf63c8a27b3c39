package balance_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/roundrobin"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/regcluster/registry/balance"
	"github.com/regcluster/registry/internal/pickertap"
)

// BenchmarkUnaryCall is one unary call on loopback through our policy
// (P2C, WRR, with the retry interceptor) and through grpc-go's
// round_robin, side by side: the difference is the pick's and the
// interceptor's cost.
func BenchmarkUnaryCall(b *testing.B) {
	bs := make([]*backend, 3)
	for i := range bs {
		bs[i] = startBackend(b, fmt.Sprint("b", i))
	}
	var insts []inst
	for _, x := range bs {
		insts = append(insts, serving(x, 100))
	}
	p := balance.DefaultPolicy()
	wrr := p
	wrr.Picker = balance.PickerWRR
	ours := func(p balance.Policy) string { sc, _ := balance.ServiceConfig(p); return sc }
	for _, tc := range []struct {
		name, sc string
		retry    bool
	}{
		{"registry_weighted_p2c", ours(p), true},
		{"registry_weighted_wrr", ours(wrr), true},
		{"round_robin", `{"loadBalancingConfig":[{"round_robin":{}}]}`, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := manual.NewBuilderWithScheme(fmt.Sprintf("bench%d", schemes.Add(1)))
			r.InitialState(benchState(insts))
			opts := []grpc.DialOption{grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultServiceConfig(tc.sc)}
			if tc.retry {
				opts = append(opts, grpc.WithChainUnaryInterceptor(balance.UnaryClientInterceptor()))
			}
			cc, err := grpc.NewClient(r.Scheme()+":///orders", opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Close()
			hc := healthpb.NewHealthClient(cc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for range 30 { // connect all three
				if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchState(insts []inst) resolver.State {
	svc := &balance.Service{Name: "orders", Known: true, Registered: len(insts)}
	var eps []resolver.Endpoint
	for _, in := range insts {
		eps = append(eps, balance.WithInstance(resolver.Endpoint{Addresses: []resolver.Address{{Addr: in.b.addr}}},
			balance.Instance{ID: in.b.id, Weight: in.weight, Health: in.health, Lifecycle: in.lifecycle, Routable: true}))
	}
	return balance.WithService(resolver.State{Endpoints: eps}, svc)
}

// BenchmarkPick is one pick alone (Picker.Pick, then PickResult.Done) of
// our policy (P2C, WRR) and of grpc-go's round_robin, over N connected
// loopback backends: the pickers are the ones the real balancers hand a
// real grpc.ClientConn, caught by a tap between the two (internal/pickertap), and
// called in a loop without any RPC.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{3, 20} {
		bs := make([]*backend, n)
		var insts []inst
		for i := range bs {
			bs[i] = startBackend(b, fmt.Sprint("b", i))
			insts = append(insts, serving(bs[i], uint32(100*(1+i%2))))
		}
		p := balance.DefaultPolicy()
		wrr := p
		wrr.Picker = balance.PickerWRR
		for _, tc := range []struct{ name, policy, sc string }{
			{"registry_weighted_p2c", balance.Name, tapped(b, p)},
			{"registry_weighted_wrr", balance.Name, tapped(b, wrr)},
			{"round_robin", roundrobin.Name, pickertap.ServiceConfig(roundrobin.Name, `{}`)},
		} {
			b.Run(fmt.Sprintf("%s/N=%d", tc.name, n), func(b *testing.B) {
				pk, info := tappedPicker(b, tc.policy, tc.sc, insts)
				di := balancer.DoneInfo{BytesSent: true, BytesReceived: true}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					res, err := pk.Pick(info)
					if err != nil {
						b.Fatal(err)
					}
					if res.Done != nil {
						res.Done(di)
					}
				}
			})
		}
	}
}

// tappedPicker is the picker a real channel over insts (all connected)
// is given by policy in sc, tapped (pickertap.Prefix), once it spreads
// picks over every instance; and the PickInfo of a call to pick with.
func tappedPicker(tb testing.TB, policy, sc string, insts []inst) (balancer.Picker, balancer.PickInfo) {
	n := len(insts)
	r := manual.NewBuilderWithScheme(fmt.Sprintf("bench%d", schemes.Add(1)))
	r.InitialState(benchState(insts))
	cc, err := grpc.NewClient(r.Scheme()+":///orders", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	cc.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	info := balancer.PickInfo{FullMethodName: "/grpc.health.v1.Health/Check", Ctx: ctx}
	// Wait until the channel's picker reaches all n subconns.
	for {
		if ctx.Err() != nil {
			tb.Fatalf("the picker never reached all %d backends", n)
		}
		if t := pickertap.Of(policy, cc.Target()); t != nil {
			if cand, ok := t.Ready(); ok {
				seen := map[balancer.SubConn]bool{}
				for range 40 * n {
					res, err := cand.Pick(info)
					if err != nil {
						break
					}
					seen[res.SubConn] = true
					if res.Done != nil {
						res.Done(balancer.DoneInfo{})
					}
				}
				if len(seen) == n {
					return cand, info
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tapped is the service config of policy p through the tap.
func tapped(tb testing.TB, p balance.Policy) string {
	sc, err := balance.ServiceConfig(p)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Replace(sc, `"`+balance.Name+`"`, `"`+pickertap.Prefix+balance.Name+`"`, 1)
}
