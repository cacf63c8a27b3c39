package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/node"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

const sideBackend = "backend"

// backend is a real gRPC server with grpc.health.v1 (SERVING), which also
// answers the load (Health/Check is the request).
type backend struct {
	addr string
	srv  *grpc.Server
	done chan struct{}
}

func startBackend(addr string) (*backend, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &backend{addr: lis.Addr().String(), srv: grpc.NewServer(), done: make(chan struct{})}
	hs := grpchealth.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(b.srv, hs)
	labeled(sideBackend, func() {
		go func() {
			defer close(b.done)
			_ = b.srv.Serve(lis)
		}()
	})
	return b, nil
}

// kill closes the server at once: listener and every connection.
func (b *backend) kill() {
	b.srv.Stop()
	<-b.done
}

// resolverTap wraps a resolver builder so that every address list the
// resolver gives grpc is recorded (time, addresses) before grpc gets it.
type resolverTap struct {
	inner resolver.Builder

	mu      sync.Mutex
	at      time.Time
	addrs   map[string]bool
	updates []tapUpdate
}

type tapUpdate struct {
	at    time.Time
	addrs map[string]bool
}

func (t *resolverTap) Scheme() string { return t.inner.Scheme() }

func (t *resolverTap) Build(target resolver.Target, cc resolver.ClientConn, opts resolver.BuildOptions) (resolver.Resolver, error) {
	return t.inner.Build(target, &tapCC{ClientConn: cc, t: t}, opts)
}

type tapCC struct {
	resolver.ClientConn
	t *resolverTap
}

func (c *tapCC) UpdateState(s resolver.State) error {
	set := map[string]bool{}
	for _, a := range s.Addresses {
		set[a.Addr] = true
	}
	for _, ep := range s.Endpoints {
		for _, a := range ep.Addresses {
			set[a.Addr] = true
		}
	}
	now := time.Now()
	c.t.mu.Lock()
	c.t.at, c.t.addrs = now, set
	c.t.updates = append(c.t.updates, tapUpdate{now, set})
	c.t.mu.Unlock()
	return c.ClientConn.UpdateState(s)
}

func (t *resolverTap) has(addr string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addrs[addr]
}

// firstWithout is the time of the first update after since without addr.
func (t *resolverTap) firstWithout(addr string, since time.Time) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, u := range t.updates {
		if u.at.After(since) && !u.addrs[addr] {
			return u.at, true
		}
	}
	return time.Time{}, false
}

type request struct {
	start, end time.Time
	peer       string
	err        bool
}

// runFailover: a backend is killed (its gRPC server closed) under steady
// load through our gRPC resolver; the regnode probes every 100ms and takes
// an instance out after N failures (DEGRADED, still routable) and M more
// (UNAVAILABLE). Measured: kill → the resolver update without it, for
// each subscriber, against the theoretical probe interval × (N+M).
func runFailover(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	th := health.DefaultThresholds()
	theory := cfg.foProbe * time.Duration(th.FailuresToDegraded+th.FailuresToUnavailable)
	r := newResult("failover", fmt.Sprintf("kill a backend under load through registry:/// (round_robin): kill → last subscriber's resolver update without it, vs the theoretical probe interval × (N+M) = %s × %d = %s",
		cfg.foProbe, th.FailuresToDegraded+th.FailuresToUnavailable, theory))
	r.param("backends", cfg.foBackends)
	r.param("trials", cfg.foTrials)
	r.param("subscribers", cfg.foConns)
	r.param("rps_per_subscriber", cfg.foRPS)
	r.param("probe_interval_ms", ms(cfg.foProbe))
	r.param("N", th.FailuresToDegraded)
	r.param("M", th.FailuresToUnavailable)
	const base = "theoretical"
	cs := fmt.Sprintf("B=%d", cfg.foBackends)

	e.progress.set("starting etcd, a regnode, %d backends", cfg.foBackends)
	etcd, err := startEtcd(ctx, e, false)
	if err != nil {
		return r, err
	}
	e.onClose(etcd.Close)
	n, err := startNode(ctx, e, []string{etcd.URL}, func(c *node.Config) { c.ProbeInterval = cfg.foProbe })
	if err != nil {
		return r, err
	}
	e.onClose(func() { n.Close() })

	backends := make([]*backend, cfg.foBackends)
	e.onClose(func() {
		for _, b := range backends {
			if b != nil {
				b.kill()
			}
		}
	})
	for i := range backends {
		if backends[i], err = startBackend("127.0.0.1:0"); err != nil {
			return r, err
		}
	}
	rc, err := regClient(e, n.Addr())
	if err != nil {
		return r, err
	}
	e.onClose(func() { rc.Close() })
	var regs []*client.Registration
	e.onClose(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, g := range regs {
			_ = g.Close(cctx)
		}
	})
	for i, b := range backends {
		var g *client.Registration
		labeled(sideBackend, func() {
			g, err = rc.Register(ctx, &registryv1.Instance{Service: "fo", Id: fmt.Sprintf("b%d", i), Address: b.addr,
				Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_GRPC}},
				client.RegisterOptions{TTL: 10 * time.Second, DrainGrace: 10 * time.Millisecond})
		})
		if err != nil {
			return r, err
		}
		regs = append(regs, g)
	}

	// Subscribers: each its own SDK client (its own subscription), a grpc
	// ClientConn on registry:///fo with round_robin, and steady load.
	taps := make([]*resolverTap, cfg.foConns)
	conns := make([]*grpc.ClientConn, cfg.foConns)
	reqs := make([][]request, cfg.foConns)
	var reqMu sync.Mutex
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadWG sync.WaitGroup
	e.onClose(func() { stopLoad(); loadWG.Wait() })
	for k := range conns {
		c, err := regClient(e, n.Addr())
		if err != nil {
			return r, err
		}
		e.onClose(func() { c.Close() })
		taps[k] = &resolverTap{inner: c.ResolverBuilder()}
		labeled(sideClient, func() {
			conns[k], err = grpc.NewClient("registry:///fo", grpc.WithResolvers(taps[k]),
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				// The resolver pushes registry_weighted in its service config:
				// ignore it, this scenario measures round_robin over the resolver.
				grpc.WithDisableServiceConfig(),
				grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
		})
		if err != nil {
			return r, err
		}
		cc := conns[k]
		e.onClose(func() { cc.Close() })
		hc := healthpb.NewHealthClient(cc)
		loadWG.Add(1)
		labeled(sideClient, func() {
			go func() {
				defer loadWG.Done()
				t := time.NewTicker(time.Duration(float64(time.Second) / float64(cfg.foRPS)))
				defer t.Stop()
				for {
					select {
					case <-loadCtx.Done():
						return
					case <-t.C:
					}
					var p peer.Peer
					rctx, cancel := context.WithTimeout(loadCtx, time.Second)
					start := time.Now()
					_, err := hc.Check(rctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
					cancel()
					if loadCtx.Err() != nil {
						return
					}
					q := request{start: start, end: time.Now(), err: err != nil}
					if p.Addr != nil {
						q.peer = p.Addr.String()
					}
					reqMu.Lock()
					reqs[k] = append(reqs[k], q)
					reqMu.Unlock()
				}
			}()
		})
	}

	stateOf := func(i int) registryv1.HealthState {
		in, ok := n.Hub().Cache().Get("fo", fmt.Sprintf("b%d", i))
		if !ok {
			return -1
		}
		return in.GetHealth().GetState()
	}
	allReady := func() bool {
		for i, b := range backends {
			if stateOf(i) != registryv1.HealthState_HEALTH_STATE_HEALTHY {
				return false
			}
			for _, t := range taps {
				if !t.has(b.addr) {
					return false
				}
			}
		}
		return true
	}

	var (
		removal, lastSub, unavailable, degraded, lastHit, recover []time.Duration
		failedReqs, totalReqs, missedRemovals                     int
	)
	for trial := range cfg.foTrials {
		i := trial % len(backends)
		e.progress.set("trial %d/%d: waiting for every backend HEALTHY in every subscriber", trial+1, cfg.foTrials)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		err := waitFor(wctx, 10*time.Millisecond, allReady)
		wcancel()
		if err != nil {
			return r, fmt.Errorf("trial %d: backends not all healthy and routed: %w", trial+1, err)
		}
		sleep(ctx, 300*time.Millisecond) // steady load on every backend
		addr := backends[i].addr
		e.progress.set("trial %d/%d: killing b%d (%s)", trial+1, cfg.foTrials, i, addr)
		killAt := time.Now()
		backends[i].kill()
		backends[i] = nil
		var degAt, unAt time.Time
		wctx, wcancel = context.WithTimeout(ctx, 10*time.Second)
		_ = waitFor(wctx, time.Millisecond, func() bool {
			st := stateOf(i)
			if degAt.IsZero() && (st == registryv1.HealthState_HEALTH_STATE_DEGRADED || st == registryv1.HealthState_HEALTH_STATE_UNAVAILABLE) {
				degAt = time.Now()
			}
			if unAt.IsZero() && st == registryv1.HealthState_HEALTH_STATE_UNAVAILABLE {
				unAt = time.Now()
			}
			for _, t := range taps {
				if t.has(addr) {
					return false
				}
			}
			return true
		})
		wcancel()
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		var last time.Duration
		for _, t := range taps {
			at, ok := t.firstWithout(addr, killAt)
			if !ok {
				missedRemovals++
				continue
			}
			d := at.Sub(killAt)
			removal = append(removal, d)
			last = max(last, d)
		}
		lastSub = append(lastSub, last)
		if !degAt.IsZero() {
			degraded = append(degraded, degAt.Sub(killAt))
		}
		if !unAt.IsZero() {
			unavailable = append(unavailable, unAt.Sub(killAt))
		}
		sleep(ctx, 200*time.Millisecond)
		windowEnd := killAt.Add(last + 200*time.Millisecond)
		var hit time.Duration
		reqMu.Lock()
		for _, rs := range reqs {
			for _, q := range rs {
				if q.end.Before(killAt) || q.start.After(windowEnd) {
					continue
				}
				totalReqs++
				if q.err {
					failedReqs++
				} else if q.peer == addr {
					hit = max(hit, q.end.Sub(killAt))
				}
			}
		}
		reqMu.Unlock()
		lastHit = append(lastHit, hit)

		// Bring it back on the same address; the registration never
		// stopped (the process is alive, its server was not).
		e.progress.set("trial %d/%d: restarting b%d", trial+1, cfg.foTrials, i)
		restartAt := time.Now()
		if backends[i], err = startBackend(addr); err != nil {
			return r, fmt.Errorf("restart backend on %s: %w", addr, err)
		}
		wctx, wcancel = context.WithTimeout(ctx, 20*time.Second)
		err = waitFor(wctx, 5*time.Millisecond, func() bool {
			for _, t := range taps {
				if !t.has(addr) {
					return false
				}
			}
			return true
		})
		wcancel()
		if err != nil {
			return r, fmt.Errorf("trial %d: restarted backend not routed again: %w", trial+1, err)
		}
		recover = append(recover, time.Since(restartAt))
	}
	stopLoad()
	loadWG.Wait()

	r.ours(cs, "last_subscriber_ms", summarize(lastSub))
	r.ours(cs, "removal_ms", summarize(removal))
	r.ours(cs, "regnode_degraded_ms", summarize(degraded))
	r.ours(cs, "regnode_unavailable_ms", summarize(unavailable))
	r.ours(cs, "last_hit_ms", summarize(lastHit))
	r.ours(cs, "failed_requests", failedReqs)
	r.ours(cs, "requests", totalReqs)
	r.ours(cs, "missed_removals", missedRemovals)
	r.ours(cs, "reroute_after_restart_ms", summarize(recover))
	tl := Lat{P50: ms(theory), P99: ms(theory), Max: ms(theory), N: 1}
	r.base(base, cs, "last_subscriber_ms", tl)
	r.base(base, cs, "removal_ms", tl)
	r.base(base, cs, "regnode_unavailable_ms", tl)
	th3 := ms(cfg.foProbe * time.Duration(th.FailuresToDegraded))
	r.base(base, cs, "regnode_degraded_ms", Lat{P50: th3, P99: th3, Max: th3, N: 1})
	r.skipRatio("failed_requests", "requests", "missed_removals", "last_hit_ms", "reroute_after_restart_ms")
	ls := summarize(lastSub)
	over := ls.P50 - ms(theory)
	r.target("overhead of the last subscriber's removal over probe interval × (N+M), median trial", fmt.Sprintf("<= %s", cfg.foProbe),
		fmt.Sprintf("%.0fms (p50 %.0fms, worst trial %.0fms, vs %s)", over, ls.P50, ls.Max, theory), ls.N > 0 && over <= ms(cfg.foProbe))
	r.note("removal: kill → the first address list without the backend that the registry resolver hands each grpc ClientConn (a tap between the resolver and grpc); last_subscriber is the slowest of the %d subscribers in each trial", cfg.foConns)
	r.note("regnode_degraded/unavailable: kill → the state in the regnode's own cache, i.e. the prober's detection; removal − unavailable is propagation to subscribers")
	r.note("last_hit: kill → end of the last request answered by the killed backend; failed_requests: requests that failed between the kill and the last removal + 200ms (round_robin stops picking a subconn whose connection closed, so few fail)")
	r.note("theoretical: the first failed probe comes within one interval of the kill and the (N+M)th %d intervals after it, so detection falls in %s..%s; %s is that upper bound, before any write or propagation", th.FailuresToDegraded+th.FailuresToUnavailable-1, theory-cfg.foProbe, theory, theory)
	return r, nil
}
