package main

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/roundrobin"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/balance"
	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/pickertap"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

const pickMethod = "/grpc.health.v1.Health/Check"

// runPick: the cost of one pick (Picker.Pick, then the result's Done) of
// our policy against grpc-go's round_robin, over the same N ready
// endpoints. Both pickers are the real ones: each built by its real
// balancer on a real grpc.ClientConn fed by our registry resolver, over
// subconns connected to real loopback backends, and taken from the
// channel by a tap between the ClientConn and the balancer
// (pickertap.go). The loop then calls them as grpc's pick does, without
// the transport; the sides alternate in rounds.
func runPick(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	r := newResult("pick", "cost of one pick (Pick + Done) of registry_weighted (P2C; WRR; P2C inside the retry interceptor) vs grpc's round_robin, the real pickers of real channels over N connected loopback backends, alternating rounds")
	r.param("endpoints", cfg.pickN)
	r.param("ops", cfg.pickOps)
	r.param("rounds", cfg.pickRounds)
	const base = "round_robin"

	maxN := 0
	for _, n := range cfg.pickN {
		maxN = max(maxN, n)
	}
	e.progress.set("starting etcd, a regnode, %d backends", maxN)
	etcd, err := startEtcd(ctx, e, false)
	if err != nil {
		return r, err
	}
	e.onClose(etcd.Close)
	n, err := startNode(ctx, e, []string{etcd.URL}, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { n.Close() })
	backends := make([]*backend, maxN)
	e.onClose(func() {
		for _, b := range backends {
			if b != nil {
				b.kill()
			}
		}
	})
	for i := range backends {
		if backends[i], err = startBackend("127.0.0.1:0", 0); err != nil {
			return r, err
		}
	}
	c, err := regClient(e, n.Addr())
	if err != nil {
		return r, err
	}
	e.onClose(func() { c.Close() })
	var regs []*client.Registration
	e.onClose(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, g := range regs {
			_ = g.Close(cctx)
		}
	})

	for _, N := range cfg.pickN {
		cs := fmt.Sprintf("N=%d", N)
		service := fmt.Sprintf("pick%d", N)
		e.progress.set("%s: registering %d instances", cs, N)
		// No health check: the prober stays quiet, so that the process's
		// allocation count during a measure is the picks' (UNKNOWN health
		// is routable). Weights 100 and 200 in turn.
		for i := range N {
			var g *client.Registration
			labeled(sideBackend, func() {
				g, err = c.Register(ctx, &registryv1.Instance{Service: service, Id: fmt.Sprintf("p%d", i),
					Address: backends[i].addr, Weight: uint32(100 * (1 + i%2))},
					client.RegisterOptions{TTL: 30 * time.Second})
			})
			if err != nil {
				return r, fmt.Errorf("register %s/p%d: %w", service, i, err)
			}
			regs = append(regs, g)
		}
		target := "registry:///" + service
		chans := map[string]*pickertap.Tap{}
		var p2cCC *grpc.ClientConn
		for _, side := range []struct{ name, config string }{
			{balance.Name + "_p2c", `{"picker":"p2c"}`},
			{balance.Name + "_wrr", `{"picker":"wrr"}`},
			{roundrobin.Name, `{}`},
		} {
			policy := balance.Name
			if side.name == roundrobin.Name {
				policy = roundrobin.Name
			}
			// Our resolver pushes registry_weighted in its service config:
			// ignore it and take the tapped policy of this side.
			var cc *grpc.ClientConn
			labeled(sideClient, func() {
				cc, err = grpc.NewClient(target, grpc.WithResolvers(c.ResolverBuilder()),
					grpc.WithTransportCredentials(insecure.NewCredentials()),
					grpc.WithDisableServiceConfig(),
					grpc.WithDefaultServiceConfig(pickertap.ServiceConfig(policy, side.config)))
			})
			if err != nil {
				return r, err
			}
			e.onClose(func() { cc.Close() })
			cc.Connect()
			// Wait until the channel's picker spreads picks over all N
			// subconns: every endpoint connected and in the picker.
			var t *pickertap.Tap
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			err = waitFor(wctx, 10*time.Millisecond, func() bool {
				if t == nil {
					// Built once the resolver's first state arrives.
					if t = pickertap.Of(policy, cc.Target()); t == nil {
						return false
					}
				}
				p, ok := t.Ready()
				return ok && distinctSubConns(ctx, p, 40*N) == N
			})
			wcancel()
			if err != nil {
				return r, fmt.Errorf("%s %s: the picker never reached all %d endpoints: %w", cs, side.name, N, err)
			}
			chans[side.name] = t
			if side.name == balance.Name+"_p2c" {
				// The same picker through the retry interceptor: what one
				// call adds on top of the pick (its per-call record, the
				// budget's deposit) without the transport.
				chans["interceptor"] = t
				p2cCC = cc
			}
		}

		type sample struct{ ns, allocs, bytes []float64 }
		samples := map[string]*sample{}
		// Each measure once per round: the sides on one goroutine, then
		// on GOMAXPROCS goroutines at once (what a lock or a shared
		// counter costs under contention); the interceptor on one.
		par := runtime.GOMAXPROCS(0)
		order := []string{balance.Name + "_p2c", roundrobin.Name, balance.Name + "_wrr", "interceptor",
			balance.Name + "_p2c/par", roundrobin.Name + "/par", balance.Name + "_wrr/par"}
		for round := range cfg.pickRounds {
			for k := range order {
				// Rotate the order each round so no side always runs first.
				key := order[(k+round)%len(order)]
				name, parallel := strings.CutSuffix(key, "/par")
				e.progress.set("%s: round %d/%d, %s", cs, round+1, cfg.pickRounds, key)
				if ctx.Err() != nil {
					return r, ctx.Err()
				}
				p, ok := chans[name].Ready()
				if !ok {
					return r, fmt.Errorf("%s %s: channel no longer READY", cs, name)
				}
				f := pickDone(ctx, p)
				if name == "interceptor" {
					f = pickIntercepted(ctx, p, p2cCC)
				}
				g := 1
				if parallel {
					g = par
				}
				ns, allocs, bytes := measure(cfg.pickOps, g, f)
				s := samples[key]
				if s == nil {
					s = &sample{}
					samples[key] = s
				}
				s.ns, s.allocs, s.bytes = append(s.ns, ns), append(s.allocs, allocs), append(s.bytes, bytes)
			}
		}
		put := func(rec func(metric string, v any), prefix string, s *sample) {
			rec(prefix+"ns_per_op", round3(median(s.ns)))
			rec(prefix+"allocs_per_op", round3(median(s.allocs)))
			rec(prefix+"bytes_per_op", round3(median(s.bytes)))
		}
		ours := func(m string, v any) { r.ours(cs, m, v) }
		rr := func(m string, v any) { r.base(base, cs, m, v) }
		put(ours, "", samples[balance.Name+"_p2c"])
		put(rr, "", samples[roundrobin.Name])
		ours("parallel_ns_per_op", round3(median(samples[balance.Name+"_p2c/par"].ns)))
		rr("parallel_ns_per_op", round3(median(samples[roundrobin.Name+"/par"].ns)))
		put(ours, "wrr_", samples[balance.Name+"_wrr"])
		ours("wrr_parallel_ns_per_op", round3(median(samples[balance.Name+"_wrr/par"].ns)))
		put(ours, "p2c_in_retry_interceptor_", samples["interceptor"])
	}
	r.note("each figure is the median over %d rounds of %d picks; one pick is Picker.Pick(PickInfo{method, ctx}) then PickResult.Done(DoneInfo{}) if set, on the picker the balancer last gave its channel (state READY), called in a loop on one goroutine without any RPC", cfg.pickRounds, cfg.pickOps)
	r.note("parallel_ns_per_op: wall time per pick with %d goroutines picking at once on the same picker (GOMAXPROCS; ops split between them): below ns_per_op when picks scale over the cores, above it when they contend", runtime.GOMAXPROCS(0))
	r.note("allocs and bytes per op come from runtime.MemStats (Mallocs, TotalAlloc) around the loop, so they count the whole process: the instances are registered without health checks to keep the prober quiet, and what else runs (lease renewals, grpc keepalives) shows as a fraction of an alloc")
	r.note("ours: registry_weighted with the default policy (P2C), its WRR option, and P2C called inside balance.UnaryClientInterceptor (the invoker does the pick and Done: the interceptor's per-call record and retry-budget deposit on top of the pick); slow start is on (instances just registered), which changes weights, not the work of a pick")
	r.note("round_robin: grpc-go's, over the same resolver and endpoints (endpointsharding with pickfirst children, like ours)")
	return r, nil
}

// distinctSubConns is how many different subconns k picks return.
func distinctSubConns(ctx context.Context, p balancer.Picker, k int) int {
	seen := map[balancer.SubConn]bool{}
	info := balancer.PickInfo{FullMethodName: pickMethod, Ctx: ctx}
	for range k {
		res, err := p.Pick(info)
		if err != nil {
			return 0
		}
		seen[res.SubConn] = true
		if res.Done != nil {
			res.Done(balancer.DoneInfo{})
		}
	}
	return len(seen)
}

// pickDone is one pick as grpc's does it for a call that succeeds: Pick,
// then Done once the call is over.
func pickDone(ctx context.Context, p balancer.Picker) func() {
	info := balancer.PickInfo{FullMethodName: pickMethod, Ctx: ctx}
	di := balancer.DoneInfo{BytesSent: true, BytesReceived: true}
	return func() {
		res, err := p.Pick(info)
		if err != nil {
			panic(fmt.Sprintf("pick: %v", err)) // the picker was READY over N subconns
		}
		if res.Done != nil {
			res.Done(di)
		}
	}
}

// pickIntercepted is pickDone inside the retry interceptor: the invoker
// picks with the context the interceptor made (which carries the call's
// record of attempts). cc is only passed through to the invoker.
func pickIntercepted(ctx context.Context, p balancer.Picker, cc *grpc.ClientConn) func() {
	icpt := balance.UnaryClientInterceptor()
	di := balancer.DoneInfo{BytesSent: true, BytesReceived: true}
	invoker := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		res, err := p.Pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		if err != nil {
			return err
		}
		if res.Done != nil {
			res.Done(di)
		}
		return nil
	}
	return func() {
		if err := icpt(ctx, pickMethod, nil, nil, cc, invoker); err != nil {
			panic(fmt.Sprintf("intercepted pick: %v", err))
		}
	}
}

// measure runs f ops times, split over g goroutines at once, and returns
// the wall time, allocations and bytes allocated per call (process-wide
// counts, see the note).
func measure(ops, g int, f func()) (nsPerOp, allocsPerOp, bytesPerOp float64) {
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	var wg sync.WaitGroup
	for j := range g {
		n := ops / g
		if j < ops%g {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				f()
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	runtime.ReadMemStats(&m1)
	n := float64(ops)
	return float64(d.Nanoseconds()) / n, float64(m1.Mallocs-m0.Mallocs) / n, float64(m1.TotalAlloc-m0.TotalAlloc) / n
}
