package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/naming/endpoints"
	etcdresolver "go.etcd.io/etcd/client/v3/naming/resolver"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/balance"
	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/node"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

const sideBackend = "backend"

// backend is a real gRPC server with grpc.health.v1 (SERVING), which also
// answers the load: Health/Check of loadService is the request, and takes
// the backend's work time, so that calls are in flight when it is killed
// (the prober checks service "", answered at once).
type backend struct {
	addr string
	srv  *grpc.Server
	done chan struct{}
}

// loadService is the health service name the load asks for.
const loadService = "regbench.load"

// workingHealth is the health server, with work on loadService's checks.
type workingHealth struct {
	*grpchealth.Server
	work time.Duration
}

func (h workingHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.GetService() == loadService && h.work > 0 {
		t := time.NewTimer(h.work)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done(): // the call was cancelled, or the server stopped
			return nil, ctx.Err()
		}
	}
	return h.Server.Check(ctx, req)
}

// startBackend listens on addr ("127.0.0.1:0" for any port) and serves;
// each load call takes work.
func startBackend(addr string, work time.Duration) (*backend, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &backend{addr: lis.Addr().String(), srv: grpc.NewServer(), done: make(chan struct{})}
	hs := grpchealth.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(loadService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(b.srv, workingHealth{Server: hs, work: work})
	labeled(sideBackend, func() {
		go func() {
			defer close(b.done)
			_ = b.srv.Serve(lis)
		}()
	})
	return b, nil
}

// kill closes the server at once: listener and every connection, the
// calls in flight failing on the client as when the process dies (a
// kill -9 closes the sockets the same way, from the kernel).
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
	err        error
}

// Sides of the failover scenario: the same load through three channels
// on every subscriber, killed backends and all.
const (
	foOurs      = "ours"           // registry:/// with c.DialOptions(): registry_weighted, retries
	foRRReg     = "rr_registry"    // round_robin over our resolver (same subscription)
	foRRNaming  = "rr_etcd_naming" // round_robin over etcd's naming resolver
	foNamingKey = "regbench/naming/fo"
)

// foSide is one side's channels (one per subscriber) and their calls.
type foSide struct {
	name  string
	conns []*grpc.ClientConn

	mu   sync.Mutex
	reqs [][]request // by subscriber
}

func (s *foSide) add(k int, q request) {
	s.mu.Lock()
	s.reqs[k] = append(s.reqs[k], q)
	s.mu.Unlock()
}

// answeredSince reports whether every subscriber of the side has had a
// call started after t answered by addr.
func (s *foSide) answeredSince(addr string, t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range s.reqs {
		ok := false
		for i := len(rs) - 1; i >= 0 && !ok; i-- {
			ok = rs[i].err == nil && rs[i].peer == addr && rs[i].start.After(t)
		}
		if !ok {
			return false
		}
	}
	return true
}

// rerouted is, for each subscriber, the time from t to the end of the
// first call answered by addr that started after t.
func (s *foSide) rerouted(addr string, t time.Time) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Duration
	for _, rs := range s.reqs {
		for _, q := range rs {
			if q.err == nil && q.peer == addr && q.start.After(t) {
				out = append(out, q.end.Sub(t))
				break
			}
		}
	}
	return out
}

// runFailover: a backend is killed (its gRPC server closed at once) under
// steady load, in every trial, while three channels per subscriber carry
// the same load: ours (registry:/// with the SDK's DialOptions: our
// balancer and retries, the load's method named idempotent), round_robin
// over our resolver, and round_robin over etcd's naming resolver. The
// regnode probes every 100ms and takes an instance out after N failures
// (DEGRADED, still routable) and M more (UNAVAILABLE). Measured: the calls
// that failed on each side, and kill → the resolver update without the
// backend for each subscriber, against the theoretical probe interval ×
// (N+M).
func runFailover(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	th := health.DefaultThresholds()
	theory := cfg.foProbe * time.Duration(th.FailuresToDegraded+th.FailuresToUnavailable)
	r := newResult("failover", fmt.Sprintf("kill a backend under load: failed calls of ours (registry:/// with DialOptions, retries) vs round_robin over our resolver vs round_robin over etcd's naming resolver, same load, same kills; kill → last subscriber's resolver update without it, vs probe interval × (N+M) = %s × %d = %s",
		cfg.foProbe, th.FailuresToDegraded+th.FailuresToUnavailable, theory))
	r.param("backends", cfg.foBackends)
	r.param("trials", cfg.foTrials)
	r.param("subscribers", cfg.foConns)
	r.param("rps_per_channel", cfg.foRPS)
	r.param("work_ms", ms(cfg.foWork))
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
	writer, err := etcdClient(sideBackend, etcd.URL, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { writer.Close() })
	em, err := endpoints.NewManager(writer, foNamingKey)
	if err != nil {
		return r, err
	}

	backends := make([]*backend, cfg.foBackends)
	e.onClose(func() {
		for _, b := range backends {
			if b != nil {
				b.kill()
			}
		}
	})
	for i := range backends {
		if backends[i], err = startBackend("127.0.0.1:0", cfg.foWork); err != nil {
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
		// The same backend in etcd's naming: it stays there while killed,
		// as it would while the process holding its lease lives.
		if err := em.AddEndpoint(ctx, fmt.Sprintf("%s/b%d", foNamingKey, i), endpoints.Endpoint{Addr: b.addr}); err != nil {
			return r, fmt.Errorf("naming endpoint of b%d: %w", i, err)
		}
	}

	// Subscribers: each its own SDK client (its own subscription), shared
	// by its ours and round_robin channels so both see the same updates at
	// the same moment, and its own etcd client for the naming resolver.
	pol := client.DefaultPolicy()
	pol.Idempotent = []string{"/grpc.health.v1.Health/Check"}
	sides := []*foSide{{name: foOurs}, {name: foRRReg}, {name: foRRNaming}}
	taps := make([]*resolverTap, cfg.foConns)
	var sdks []*client.Client
	rr := `{"loadBalancingConfig":[{"round_robin":{}}]}`
	for k := range cfg.foConns {
		var (
			c  *client.Client
			ec *clientv3.Client
		)
		labeled(sideClient, func() {
			c, err = client.New(client.Config{Endpoints: []string{n.Addr()}, Logger: e.log, Policy: &pol})
		})
		if err != nil {
			return r, err
		}
		e.onClose(func() { c.Close() })
		sdks = append(sdks, c)
		if ec, err = etcdClient(sideClient, etcd.URL, nil); err != nil {
			return r, err
		}
		e.onClose(func() { ec.Close() })
		nb, err := etcdresolver.NewBuilder(ec)
		if err != nil {
			return r, err
		}
		taps[k] = &resolverTap{inner: c.ResolverBuilder()}
		for _, s := range sides {
			var cc *grpc.ClientConn
			labeled(sideClient, func() {
				switch s.name {
				case foOurs:
					cc, err = grpc.NewClient("registry:///fo", c.DialOptions()...)
				case foRRReg:
					cc, err = grpc.NewClient("registry:///fo", grpc.WithResolvers(taps[k]),
						grpc.WithTransportCredentials(insecure.NewCredentials()),
						// The resolver pushes registry_weighted in its service
						// config: ignore it, this side is round_robin.
						grpc.WithDisableServiceConfig(), grpc.WithDefaultServiceConfig(rr))
				case foRRNaming:
					cc, err = grpc.NewClient("etcd:///"+foNamingKey, grpc.WithResolvers(nb),
						grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(rr))
				}
			})
			if err != nil {
				return r, fmt.Errorf("%s channel: %w", s.name, err)
			}
			e.onClose(func() { cc.Close() })
			s.conns = append(s.conns, cc)
			s.reqs = append(s.reqs, nil)
		}
	}

	// Steady load: on every channel, a call every 1/rps, each in its own
	// goroutine (a slow or failing call does not hold the next one back),
	// with a 1s deadline for all its attempts.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadWG sync.WaitGroup
	e.onClose(func() { stopLoad(); loadWG.Wait() })
	for _, s := range sides {
		for k, cc := range s.conns {
			hc := healthpb.NewHealthClient(cc)
			loadWG.Add(1)
			labeled(sideClient, func() {
				go func() {
					defer loadWG.Done()
					var calls sync.WaitGroup
					defer calls.Wait()
					t := time.NewTicker(time.Duration(float64(time.Second) / float64(cfg.foRPS)))
					defer t.Stop()
					for {
						select {
						case <-loadCtx.Done():
							return
						case <-t.C:
						}
						calls.Add(1)
						go func() {
							defer calls.Done()
							var p peer.Peer
							rctx, cancel := context.WithTimeout(loadCtx, time.Second)
							start := time.Now()
							_, err := hc.Check(rctx, &healthpb.HealthCheckRequest{Service: loadService}, grpc.Peer(&p))
							cancel()
							if loadCtx.Err() != nil {
								return // stopped, not failed
							}
							q := request{start: start, end: time.Now(), err: err}
							if p.Addr != nil {
								q.peer = p.Addr.String()
							}
							s.add(k, q)
						}()
					}
				}()
			})
		}
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
	// Before the first kill, every channel of every side answers from every
	// backend.
	e.progress.set("waiting for every channel to reach every backend")
	t0 := time.Now()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err = waitFor(wctx, 10*time.Millisecond, func() bool {
		for _, s := range sides {
			for _, b := range backends {
				if !s.answeredSince(b.addr, t0) {
					return false
				}
			}
		}
		return true
	})
	wcancel()
	if err != nil {
		return r, fmt.Errorf("not every channel reached every backend: %w", err)
	}

	var (
		removal, lastSub, unavailable, degraded []time.Duration
		missedRemovals                          int
		lastHit                                 = map[string][]time.Duration{}
		reroute                                 = map[string][]time.Duration{}
		notRerouted                             = map[string]int{}
		phaseStart, phaseEnd                    time.Time
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
		if trial == 0 {
			phaseStart = killAt
		}
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
		for _, s := range sides {
			var hit time.Duration
			s.mu.Lock()
			for _, rs := range s.reqs {
				for _, q := range rs {
					if q.err == nil && q.peer == addr && q.end.After(killAt) {
						hit = max(hit, q.end.Sub(killAt))
					}
				}
			}
			s.mu.Unlock()
			lastHit[s.name] = append(lastHit[s.name], hit)
		}

		// Bring it back on the same address; the registration never
		// stopped (the process is alive, its server was not).
		e.progress.set("trial %d/%d: restarting b%d", trial+1, cfg.foTrials, i)
		restartAt := time.Now()
		if backends[i], err = startBackend(addr, cfg.foWork); err != nil {
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
		// Every side's channels call it again (ours ramps it up from 5%
		// of its weight: slow start), within a bound.
		wctx, wcancel = context.WithTimeout(ctx, cfg.foReroute)
		_ = waitFor(wctx, 10*time.Millisecond, func() bool {
			for _, s := range sides {
				if !s.answeredSince(addr, restartAt) {
					return false
				}
			}
			return true
		})
		wcancel()
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		for _, s := range sides {
			ds := s.rerouted(addr, restartAt)
			notRerouted[s.name] += len(s.conns) - len(ds)
			reroute[s.name] = append(reroute[s.name], ds...)
		}
		phaseEnd = time.Now()
	}
	stopLoad()
	loadWG.Wait()

	// Every call from the first kill to the end of the last trial counts.
	type tally struct {
		calls, failed int
		errs          map[string]int
	}
	tallies := map[string]*tally{}
	for _, s := range sides {
		t := &tally{errs: map[string]int{}}
		tallies[s.name] = t
		for _, rs := range s.reqs {
			for _, q := range rs {
				if q.end.Before(phaseStart) || q.start.After(phaseEnd) {
					continue
				}
				t.calls++
				if q.err != nil {
					t.failed++
					t.errs[status.Code(q.err).String()+": "+status.Convert(q.err).Message()]++
				}
			}
		}
	}
	rec := func(side string, metric string, v any) {
		if side == foOurs {
			r.ours(cs, metric, v)
		} else {
			r.base(side, cs, metric, v)
		}
	}
	for _, s := range sides {
		t := tallies[s.name]
		rec(s.name, "failed_calls", t.failed)
		rec(s.name, "calls", t.calls)
		ratio := 0.0
		if t.calls > 0 {
			ratio = math.Round(float64(t.calls-t.failed)/float64(t.calls)*1e5) / 1e5
		}
		rec(s.name, "success_ratio", ratio)
		rec(s.name, "last_hit_ms", summarize(lastHit[s.name]))
		rec(s.name, "reroute_after_restart_ms", summarize(reroute[s.name]))
		rec(s.name, "not_rerouted", notRerouted[s.name])
	}
	// What our balancer and interceptor did (only ours's channels use
	// them; round_robin ignores the metrics the resolver hands it).
	var mc balance.Counts
	for _, c := range sdks {
		x := c.Metrics().Counts()
		mc.Retries += x.Retries
		mc.BudgetExhausted += x.BudgetExhausted
		mc.Ejections += x.Ejections
		mc.NoInstance += x.NoInstance
	}
	r.ours(cs, "retries", mc.Retries)
	r.ours(cs, "retry_budget_exhausted", mc.BudgetExhausted)
	r.ours(cs, "ejections", mc.Ejections)
	r.ours(cs, "no_instance_picks", mc.NoInstance)
	r.ours(cs, "last_subscriber_ms", summarize(lastSub))
	r.ours(cs, "removal_ms", summarize(removal))
	r.ours(cs, "regnode_degraded_ms", summarize(degraded))
	r.ours(cs, "regnode_unavailable_ms", summarize(unavailable))
	r.ours(cs, "missed_removals", missedRemovals)
	tl := Lat{P50: ms(theory), P99: ms(theory), Max: ms(theory), N: 1}
	r.base(base, cs, "last_subscriber_ms", tl)
	r.base(base, cs, "removal_ms", tl)
	r.base(base, cs, "regnode_unavailable_ms", tl)
	th3 := ms(cfg.foProbe * time.Duration(th.FailuresToDegraded))
	r.base(base, cs, "regnode_degraded_ms", Lat{P50: th3, P99: th3, Max: th3, N: 1})
	r.skipRatio("failed_calls", "calls", "missed_removals", "last_hit_ms", "not_rerouted",
		"retries", "retry_budget_exhausted", "ejections", "no_instance_picks")

	ot := tallies[foOurs]
	r.target("ours (retries, the load's method idempotent): failed calls across the kills", "0",
		fmt.Sprintf("%d of %d", ot.failed, ot.calls), ot.calls > 0 && ot.failed == 0)
	ls := summarize(lastSub)
	over := ls.P50 - ms(theory)
	r.target("overhead of the last subscriber's removal over probe interval × (N+M), median trial", fmt.Sprintf("<= %s", cfg.foProbe),
		fmt.Sprintf("%.0fms (p50 %.0fms, worst trial %.0fms, vs %s)", over, ls.P50, ls.Max, theory), ls.N > 0 && over <= ms(cfg.foProbe))
	r.note("sides, each one channel per subscriber with the same load (%d calls/s, each taking %s on the backend, 1s deadline for all attempts): ours = grpc.NewClient(\"registry:///fo\", c.DialOptions()...) with Policy.Idempotent = [/grpc.health.v1.Health/Check] (retries on Unavailable, on another instance); rr_registry = round_robin over our resolver (WithDisableServiceConfig), on the same SDK client, so the same subscription; rr_etcd_naming = round_robin over go.etcd.io/etcd/client/v3/naming/resolver, the backends added with endpoints.Manager (they stay there while killed, as while the process holding their lease lives)", cfg.foRPS, cfg.foWork)
	r.note("kill: the backend's grpc.Server.Stop() (listener and connections closed at once, calls in flight fail on the client as on a kill -9 of its process); it comes back on the same address after the last subscriber's removal + 200ms")
	r.note("failed_calls/calls: every call that ended after the first kill and started before the end of the last trial (the restarted backend called again by every channel, or %s)", cfg.foReroute)
	for _, s := range sides {
		if t := tallies[s.name]; t.failed > 0 {
			r.note("%s's failures: %s", s.name, topErrors(t.errs, 3))
		}
	}
	r.note("reroute_after_restart: restart → the first call the restarted backend answered, per channel (ours ramps it from 5%% of its weight, slow start; round_robin waits for its reconnect backoff); not_rerouted: channels that had not called it within %s", cfg.foReroute)
	r.note("removal: kill → the first address list without the backend that the registry resolver hands each grpc ClientConn (a tap between the resolver and the rr_registry channel); last_subscriber is the slowest of the %d subscribers in each trial", cfg.foConns)
	r.note("regnode_degraded/unavailable: kill → the state in the regnode's own cache, i.e. the prober's detection; removal − unavailable is propagation to subscribers")
	r.note("last_hit: kill → end of the last call the killed backend answered")
	r.note("retries, retry_budget_exhausted, ejections, no_instance_picks: the counts of the SDK clients' balance.Metrics over the whole run (ours's channels only)")
	r.note("theoretical: the first failed probe comes within one interval of the kill and the (N+M)th %d intervals after it, so detection falls in %s..%s; %s is that upper bound, before any write or propagation", th.FailuresToDegraded+th.FailuresToUnavailable-1, theory-cfg.foProbe, theory, theory)
	return r, nil
}

// topErrors lists the k most frequent errors with their counts.
func topErrors(errs map[string]int, k int) string {
	type ec struct {
		msg string
		n   int
	}
	var l []ec
	for m, n := range errs {
		l = append(l, ec{m, n})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].n > l[j].n || l[i].n == l[j].n && l[i].msg < l[j].msg })
	var out []string
	for _, x := range l[:min(k, len(l))] {
		out = append(out, fmt.Sprintf("%d× %s", x.n, x.msg))
	}
	return strings.Join(out, "; ")
}
