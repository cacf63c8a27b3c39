package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer/roundrobin"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/regcluster/registry/client"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// firstCallArg, as the first argument, makes regbench (or its test
// binary) the fresh process of firstcall:
//
//	__regbench-firstcall ours|round_robin TARGET
//
// ours: a Client of the regnode at TARGET and a registry:///firstcall
// channel with its DialOptions; round_robin: a passthrough:///TARGET
// channel with grpc's round_robin. Either way it makes one fail-fast call
// at once and, until one succeeds, another (each failure counted), then
// prints "first NANOS FAILED" (NANOS since its main began) and exits.
const firstCallArg = "__regbench-firstcall"

// firstCallService is the service firstcall registers.
const firstCallService = "firstcall"

// firstCallMain is the child process of firstcall.
func firstCallMain(args []string) int {
	began := time.Now()
	if len(args) != 2 {
		fmt.Fprintf(os.Stderr, "regbench firstcall: want ours|round_robin TARGET, got %q\n", args)
		return 2
	}
	var opts []grpc.DialOption
	target := "passthrough:///" + args[1]
	switch args[0] {
	case "ours":
		c, err := client.New(client.Config{Endpoints: []string{args[1]}, Logger: quiet(false)})
		if err != nil {
			fmt.Fprintf(os.Stderr, "regbench firstcall: %v\n", err)
			return 1
		}
		defer c.Close()
		opts, target = c.DialOptions(), "registry:///"+firstCallService
	case roundrobin.Name:
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)}
	default:
		fmt.Fprintf(os.Stderr, "regbench firstcall: unknown side %q\n", args[0])
		return 2
	}
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "regbench firstcall: %v\n", err)
		return 1
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	failed := 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil {
			break
		}
		if failed++; failed >= 1000 {
			fmt.Fprintf(os.Stderr, "regbench firstcall: %d calls failed, the last: %v\n", failed, err)
			return 1
		}
	}
	fmt.Printf("first %d %d\n", time.Since(began).Nanoseconds(), failed)
	return 0
}

// runFirstCall: the time from a fresh process's start to its first
// successful call, ours (Client, registry:/// channel, first view, pick)
// against grpc's round_robin over passthrough:/// to one of the same
// backends (no registry at all: the floor), in alternating trials, each a
// new process; and how many calls failed before the first success
// (ours must be none: a channel waits for its first view).
func runFirstCall(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	r := newResult("firstcall", "process start to first successful call: a new process with a registry:/// channel vs round_robin over passthrough:/// (no registry), alternating, one process per trial")
	r.param("trials", cfg.firstTrials)
	e.progress.set("starting etcd, a regnode, 3 backends")
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
	c, err := regClient(e, n.Addr())
	if err != nil {
		return r, err
	}
	e.onClose(func() { c.Close() })
	var addrs []string
	for i := range 3 {
		b, err := startBackend("127.0.0.1:0", 0)
		if err != nil {
			return r, err
		}
		e.onClose(b.kill)
		addrs = append(addrs, b.addr)
		var g *client.Registration
		labeled(sideBackend, func() {
			g, err = c.Register(ctx, &registryv1.Instance{Service: firstCallService, Id: fmt.Sprintf("f%d", i), Address: b.addr},
				client.RegisterOptions{TTL: 30 * time.Second})
		})
		if err != nil {
			return r, fmt.Errorf("register %s/f%d: %w", firstCallService, i, err)
		}
		e.onClose(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = g.Close(cctx)
		})
	}
	// The regnode's view holds the three before any process starts: its
	// first view must be a list to call, not one a moment early.
	if err := waitFor(ctx, 10*time.Millisecond, func() bool {
		return len(n.Hub().Cache().Snapshot().Instances(firstCallService)) == len(addrs)
	}); err != nil {
		return r, fmt.Errorf("the regnode's view of %s: %w", firstCallService, err)
	}
	const cs = "fresh process"
	type side struct {
		name, target     string
		total, inProcess []time.Duration
		failed           int
	}
	sides := []*side{{name: "ours", target: n.Addr()}, {name: roundrobin.Name, target: addrs[0]}}
	for i := range cfg.firstTrials {
		for _, s := range sides {
			e.progress.set("trial %d/%d: %s", i+1, cfg.firstTrials, s.name)
			total, inProc, failed, err := firstCallTrial(ctx, s.name, s.target)
			if err != nil {
				return r, fmt.Errorf("%s trial %d: %w", s.name, i+1, err)
			}
			s.total, s.inProcess = append(s.total, total), append(s.inProcess, inProc)
			s.failed += failed
		}
	}
	ours, rr := sides[0], sides[1]
	r.ours(cs, "start_to_first_ok_ms", summarize(ours.total))
	r.ours(cs, "main_to_first_ok_ms", summarize(ours.inProcess))
	r.ours(cs, "failed_before_first_ok", ours.failed)
	r.base(rr.name, cs, "start_to_first_ok_ms", summarize(rr.total))
	r.base(rr.name, cs, "main_to_first_ok_ms", summarize(rr.inProcess))
	r.base(rr.name, cs, "failed_before_first_ok", rr.failed)
	r.skipRatio("failed_before_first_ok")
	r.target("calls failed before the first success, ours", "0",
		strconv.Itoa(ours.failed), ours.failed == 0)
	r.note("start_to_first_ok: from exec to the child's report of its first successful call, read by the parent; main_to_first_ok: from the child's main to that call (Client, channel, first view from the regnode, connection to a backend, the call)")
	return r, nil
}

// firstCallTrial runs one fresh process of side against target and
// returns the time from its start to the report of its first successful
// call, that time as the child measured it from its main, and how many
// calls failed before it.
func firstCallTrial(ctx context.Context, side, target string) (total, inProc time.Duration, failed int, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	start := time.Now()
	p, err := startChild(ctx, "firstcall "+side, firstCallArg, side, target)
	if err != nil {
		return 0, 0, 0, err
	}
	defer p.stop()
	f, err := p.line("first")
	total = time.Since(start)
	if err != nil {
		return 0, 0, 0, err
	}
	if len(f) != 2 {
		return 0, 0, 0, fmt.Errorf("bad first line %q", strings.Join(f, " "))
	}
	ns, err1 := strconv.ParseInt(f[0], 10, 64)
	failed, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return 0, 0, 0, fmt.Errorf("bad first line %q", strings.Join(f, " "))
	}
	return total, time.Duration(ns), failed, nil
}
