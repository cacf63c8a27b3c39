package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/node"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Peers of the flood: the limits key by IP, and Linux routes all of
// 127.0.0.0/8 to the loopback interface, so binding the client's source
// address makes two peers of one host.
const (
	attackerIP = "127.0.0.2"
	victimIP   = "127.0.0.1"
)

// runFlood: what a flood of Registers from one peer costs another. One
// regnode with the default per-peer limits (but for -flood-cap and
// -flood-in-flight), on its
// own etcd (fsync on); the victim (127.0.0.1) lists its service, one call
// after the other, first while nothing else runs (idle), then while the
// attacker (127.0.0.2) sends a bounded flood of Registers as fast as its
// connections let it, in the same run. Reported: the attacker's accepted
// and refused calls (by limit), the victim's List latency during the
// flood against idle, and the victim's failures (want none).
func runFlood(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	r := newResult("flood", "victim's List latency during a Register flood from another peer (ours) vs idle (baseline), one regnode with default limits, same run")
	limits := peerlimit.DefaultConfig()
	if cfg.floodCap > 0 {
		limits.MaxRegistrations = cfg.floodCap
	}
	if cfg.floodInFlight > 0 {
		limits.MaxWritesInFlight = cfg.floodInFlight
	}
	r.param("flood_registers", cfg.floodN)
	r.param("flood_conc", cfg.floodConc)
	r.param("victim_idle_calls", cfg.floodCalls)
	r.param("victim_instances", cfg.floodInstances)
	r.param("write_rate", limits.WriteRate)
	r.param("write_burst", limits.WriteBurst)
	r.param("max_registrations", limits.MaxRegistrations)
	r.param("max_writes_in_flight", limits.MaxWritesInFlight)
	r.param("fsync", true)
	r.param("attacker", attackerIP)
	r.param("victim", victimIP)

	e.progress.set("starting etcd (fsync on) and a regnode with default limits")
	etcd, err := startEtcd(ctx, e, true)
	if err != nil {
		return r, err
	}
	e.onClose(etcd.Close)
	n, err := startNode(ctx, e, []string{etcd.URL}, func(c *node.Config) { c.Limits = limits })
	if err != nil {
		return r, err
	}
	e.onClose(func() { n.Close() })
	victim, closeV, err := dialFrom(n.Addr(), victimIP)
	if err != nil {
		return r, err
	}
	e.onClose(closeV)
	// Several connections, as several attacking processes of one host
	// would open: one connection's stream cap does not bound the flood.
	attackers := make([]registryv1.RegistryClient, max(1, min(cfg.floodConc, 8)))
	for i := range attackers {
		api, closeA, err := dialFrom(n.Addr(), attackerIP)
		if err != nil {
			return r, err
		}
		e.onClose(closeA)
		attackers[i] = api
	}

	for i := range cfg.floodInstances {
		if _, err := victim.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{
			Service: "victim", Id: fmt.Sprint("v-", i), Address: "10.0.0.1:80"}, Ttl: durationpb.New(time.Minute)}); err != nil {
			return r, fmt.Errorf("victim's own registrations: %w", err)
		}
	}
	list := func() (time.Duration, error) {
		t := time.Now()
		resp, err := victim.List(ctx, &registryv1.ListRequest{Service: "victim"})
		if err == nil && len(resp.Instances) != cfg.floodInstances {
			err = fmt.Errorf("listed %d instances, want %d", len(resp.Instances), cfg.floodInstances)
		}
		return time.Since(t), err
	}
	// Warm the victim's path, then measure it idle.
	for range min(20, cfg.floodCalls) {
		if _, err := list(); err != nil {
			return r, fmt.Errorf("victim's List: %w", err)
		}
	}
	e.progress.set("victim idle: %d Lists", cfg.floodCalls)
	idle := make([]time.Duration, 0, cfg.floodCalls)
	idleFailed := 0
	for range cfg.floodCalls {
		d, err := list()
		if err != nil {
			if ctx.Err() != nil {
				return r, ctx.Err()
			}
			idleFailed++
			continue
		}
		idle = append(idle, d)
	}

	// The flood, with the victim listing until it is over.
	var (
		next                               atomic.Int64
		accepted, byRate, byCap, otherErrs atomic.Int64
		firstOther                         atomic.Value
		wg                                 sync.WaitGroup
		floodDone                          = make(chan struct{})
		during                             []time.Duration
		duringFailed                       int
		firstVictimErr                     error
	)
	e.progress.set("flood of %d Registers from %s", cfg.floodN, attackerIP)
	start := time.Now()
	for w := range cfg.floodConc {
		api := attackers[w%len(attackers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(cfg.floodN) || ctx.Err() != nil {
					return
				}
				_, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{
					Service: "flood", Id: fmt.Sprint("a-", i), Address: "10.0.0.2:80"}, Ttl: durationpb.New(time.Minute)})
				st := status.Convert(err)
				switch {
				case err == nil:
					accepted.Add(1)
				case st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), peerlimit.Registrations):
					byCap.Add(1)
				case st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), peerlimit.WriteRate):
					byRate.Add(1)
				default:
					otherErrs.Add(1)
					firstOther.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(floodDone) }()
	for flooding := true; flooding; {
		select {
		case <-floodDone:
			flooding = false
			continue
		default:
		}
		d, err := list()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			duringFailed++
			if firstVictimErr == nil {
				firstVictimErr = err
			}
			continue
		}
		during = append(during, d)
	}
	<-floodDone
	floodTime := time.Since(start)
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	if err, ok := firstOther.Load().(error); ok {
		return r, fmt.Errorf("attacker: %d Registers failed otherwise than limited, first: %w", otherErrs.Load(), err)
	}

	const vc = "victim_list"
	limited := byRate.Load() + byCap.Load()
	r.ours(vc, "latency_ms", summarize(during))
	r.ours(vc, "failed", duringFailed)
	r.base("idle", vc, "latency_ms", summarize(idle))
	r.base("idle", vc, "failed", idleFailed)
	const ac = "attacker"
	r.ours(ac, "sent", int(accepted.Load()+limited))
	r.ours(ac, "accepted", int(accepted.Load()))
	r.ours(ac, "limited", int(limited))
	r.ours(ac, "limited_write_rate", int(byRate.Load()))
	r.ours(ac, "limited_registrations", int(byCap.Load()))
	r.ours(ac, "flood_s", round3(floodTime.Seconds()))
	r.ours(ac, "per_sec", round3(float64(accepted.Load()+limited)/floodTime.Seconds()))
	m := n.Metrics()
	r.ours(ac, "regnode_limited_total", int(testutil.ToFloat64(m.Limited.WithLabelValues(peerlimit.WriteRate))+
		testutil.ToFloat64(m.Limited.WithLabelValues(peerlimit.Registrations))))
	r.skipRatio("failed")

	fl, il := summarize(during), summarize(idle)
	r.target("attacker limited", "> 0 of the flood refused", fmt.Sprintf("%d of %d (%d write rate, %d registrations cap)",
		limited, cfg.floodN, byRate.Load(), byCap.Load()), limited > 0)
	got := fmt.Sprintf("%d failed of %d during the flood, %d of %d idle", duringFailed, len(during)+duringFailed, idleFailed, len(idle)+idleFailed)
	if firstVictimErr != nil {
		got += "; first: " + firstVictimErr.Error()
	}
	r.target("victim's Lists all succeed", "0 failed", got, duringFailed == 0 && idleFailed == 0)
	if il.P50 > 0 && il.P99 > 0 {
		r.note("victim List p50 %.2fms idle, %.2fms during the flood (x%.2f); p99 %.2fms idle, %.2fms during (x%.2f); %d Lists during a flood of %.2fs",
			il.P50, fl.P50, fl.P50/il.P50, il.P99, fl.P99, fl.P99/il.P99, len(during), floodTime.Seconds())
	}
	r.note("the victim's calls are limited by nothing here (Lists are not rate limited); what they share with the attacker is the regnode's CPU, its etcd and the host: the ratio is that cost, the limits bound it to what the attacker's accepted Registers make")
	return r, nil
}

// dialFrom is a plain gRPC connection to addr whose source address is
// local: a peer of its own to the regnode's per-peer limits.
func dialFrom(addr, local string) (registryv1.RegistryClient, func(), error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	var (
		cc  *grpc.ClientConn
		err error
	)
	labeled(sideClient, func() {
		cc, err = grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	})
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s from %s: %w", addr, local, err)
	}
	return registryv1.NewRegistryClient(cc), func() { cc.Close() }, nil
}
