package balance_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/regcluster/registry/balance"
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
