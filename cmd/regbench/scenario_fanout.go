package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/client"
)

// Allocation stacks are told apart by the code they run through.
var (
	oursSides = classifier(
		sideMarkers{"server", []string{"google.golang.org/grpc.(*Server)", "grpc/internal/transport.(*http2Server)",
			"grpc/internal/transport.NewServerTransport", "google.golang.org/grpc.(*serverStream)",
			"github.com/regcluster/registry/internal/fanout.", "github.com/regcluster/registry/server."}},
		sideMarkers{"client", []string{"github.com/regcluster/registry/client.", "grpc/internal/transport.(*http2Client)",
			"google.golang.org/grpc.(*clientStream)", "google.golang.org/grpc.newClientStream",
			"google.golang.org/grpc.(*ClientConn)", "google.golang.org/grpc.(*addrConn)", "main.runFanout"}},
	)
	etcdSides = classifier(
		sideMarkers{"server", []string{"go.etcd.io/etcd/server/", "google.golang.org/grpc.(*Server)",
			"grpc/internal/transport.(*http2Server)", "google.golang.org/grpc.(*serverStream)"}},
		sideMarkers{"client", []string{"go.etcd.io/etcd/client/v3.", "grpc/internal/transport.(*http2Client)",
			"google.golang.org/grpc.(*clientStream)", "google.golang.org/grpc.newClientStream", "main.directWatcher", "main.runFanout"}},
	)
)

// runFanout: S subscribers on one regnode, all through ONE SDK client (one
// gRPC ClientConn, one Subscribe stream; its S subscriptions of the
// service share one feed, so the regnode serves one subscriber unless
// -fanout-clients spreads the child's over more clients), against S etcd watchers on ONE
// clientv3 client (one gRPC watch stream, S watchers on it). Measured:
// memory per subscriber and CPU at a steady change rate. Memory is read
// twice: with the subscribers in this process (RSS and Go heap of both
// sides, split by allocation stack), and with the subscribers in a child
// process (so this process's RSS delta is the serving side alone). The
// CPU phase runs with the subscribers in the child.
func runFanout(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	S := cfg.fanSubs
	r := newResult("fanout", fmt.Sprintf("%d subscribers on one regnode (one SDK client, one ClientConn) vs %d etcd watchers (one clientv3 client): memory per subscriber, CPU at a steady change rate", S, S))
	r.param("subs", S)
	r.param("instances", cfg.propInstances)
	r.param("rate_per_s", cfg.fanRate)
	r.param("cpu_phase_s", cfg.fanDur.Seconds())
	r.param("child_sdk_clients", cfg.fanClients)
	cs := fmt.Sprintf("S=%d", S)
	const base = kindWatch

	e.progress.set("starting etcd and a regnode")
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
	cli, err := etcdClient(sideWriter, etcd.URL, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { cli.Close() })
	service := "fan"
	writes := int(cfg.fanRate*cfg.fanDur.Seconds()) + 1
	p, err := makePlan(service, cfg.propInstances, 2*writes, 11)
	if err != nil {
		return r, err
	}
	ns, err := newNamespaces(cli, service)
	if err != nil {
		return r, err
	}
	if err := ns.writeInitial(ctx, cli, p); err != nil {
		return r, err
	}
	if err := waitChan(ctx, n.Hub().Ready()); err != nil {
		return r, err
	}
	prevRate := runtime.MemProfileRate
	defer func() { runtime.MemProfileRate = prevRate }()

	// ---- 1. in this process: ours
	{
		c, err := regClient(e, n.Addr())
		if err != nil {
			return r, err
		}
		subs := make([]*client.Subscription, 0, S+1)
		closeAll := func() {
			for _, s := range subs {
				s.Close()
			}
			subs = nil
			c.Close()
		}
		// One subscription first, so that the connection is not counted
		// per subscriber.
		warm, err := c.Subscribe(ctx, service, client.SubscribeOptions{})
		if err != nil {
			closeAll()
			return r, err
		}
		subs = append(subs, warm)
		if err := warm.WaitReady(ctx); err != nil {
			closeAll()
			return r, err
		}
		e.progress.set("ours in-process: %d subscriptions", S)
		var last atomic.Int64
		runtime.MemProfileRate = 1
		before := takeMem(oursSides)
		if err := writeHeap(cfg.memprofile, ".before"); err != nil {
			closeAll()
			return r, err
		}
		t0 := time.Now()
		for range S {
			var s *client.Subscription
			labeled(sideClient, func() {
				s, err = c.Subscribe(ctx, service, client.SubscribeOptions{OnChange: func(ch client.Change) { last.Store(ch.Revision) }})
			})
			if err != nil {
				closeAll()
				return r, err
			}
			subs = append(subs, s)
		}
		for k, s := range subs {
			if err := s.WaitReady(ctx); err != nil {
				closeAll()
				return r, err
			}
			if k%500 == 0 {
				e.progress.set("ours in-process: %d/%d subscriptions ready", k, S)
			}
		}
		ready := time.Since(t0)
		after := takeMem(oursSides)
		if err := writeHeap(cfg.memprofile, ""); err != nil {
			closeAll()
			return r, err
		}
		runtime.MemProfileRate = prevRate
		closeAll()
		r.ours(cs, "subscribe_all_ms", ms(ready))
		memPerSub(before, after, S, sideRegnode).report(func(k string, v any) { r.ours(cs, k, v) })
	}

	// ---- 1. in this process: etcd watchers
	{
		wc, err := etcdClient(sideClient, etcd.URL, nil)
		if err != nil {
			return r, err
		}
		ws := newWatchers(ctx, func(int) *clientv3.Client { return wc }, ns.direct, service)
		closeAll := func() { ws.stop(); wc.Close() }
		if err := ws.start(1, func(int, int64, time.Time) {}); err != nil {
			closeAll()
			return r, err
		}
		e.progress.set("etcd in-process: %d watchers", S)
		runtime.MemProfileRate = 1
		before := takeMem(etcdSides)
		t0 := time.Now()
		var last atomic.Int64
		if err := ws.start(S, func(_ int, rev int64, _ time.Time) { last.Store(rev) }); err != nil {
			closeAll()
			return r, err
		}
		ready := time.Since(t0)
		after := takeMem(etcdSides)
		runtime.MemProfileRate = prevRate
		closeAll()
		r.base(base, cs, "subscribe_all_ms", ms(ready))
		memPerSub(before, after, S, sideEtcd).report(func(k string, v any) { r.base(base, cs, k, v) })
	}

	// ---- 2. subscribers in a child process: the serving side's memory
	// alone, and CPU at a steady change rate.
	for _, kind := range []string{"ours", "etcd"} {
		endpoint, which, put := n.Addr(), "ours", func(k string, v any) { r.ours(cs, k, v) }
		server := []string{sideRegnode, sideEtcd}
		if kind == "etcd" {
			endpoint, which, put = etcd.URL, "direct", func(k string, v any) { r.base(base, cs, k, v) }
			server = []string{sideEtcd}
		}
		e.progress.set("%s: starting a process of %d subscribers", kind, S)
		proc, err := startSubscribers(ctx, kind, endpoint, service, S, cfg.fanClients)
		if err != nil {
			return r, err
		}
		res, err := func() (fanoutCPU, error) {
			defer proc.stop()
			rss0 := settledRSS()
			if err := proc.go_(); err != nil {
				return fanoutCPU{}, err
			}
			rss1 := settledRSS()
			put("server_rss_per_sub_kib", kib(float64(rss1-rss0)/float64(S)))
			put("client_rss_per_sub_kib", kib(float64(proc.rss1-proc.rss0)/float64(S)))
			e.progress.set("%s: %d changes at %.0f/s to %d subscribers", kind, writes, cfg.fanRate, S)
			from := 0
			if kind == "etcd" {
				from = writes
			}
			return fanoutPhase(ctx, e, cli, ns, which, p, from, from+writes, proc)
		}()
		if err != nil {
			return r, fmt.Errorf("%s: %w", kind, err)
		}
		res.report(put, server)
		if kind == "ours" && res.bySide != nil {
			put("cpu_regnode_cores", round3(res.bySide[sideRegnode].Seconds()/res.dur.Seconds()))
		}
	}

	r.skipRatio("subscribe_all_ms")
	srv, _ := lookup(r.Ours, cs, "server_rss_per_sub_kib").(float64)
	rss, _ := lookup(r.Ours, cs, "rss_per_sub_kib").(float64)
	r.target("regnode memory per subscriber (subscribers in another process: regnode's RSS delta / S)", "<= 10 KiB", fmt.Sprintf("%.2f KiB", srv), srv <= 10)
	r.target("whole-process RSS per subscriber (regnode AND, in the same process, each subscriber's own cache, stream and goroutines)", "<= 10 KiB", fmt.Sprintf("%.2f KiB", rss), rss <= 10)
	r.note("memory, subscribers in this process: before/after subscribing S, each after two GCs and debug.FreeOSMemory: rss = VmRSS delta / S, heap = HeapInuse delta / S, stack = StackInuse delta / S. server/client_heap: the heap delta split by allocation stack from the Go heap profile taken with runtime.MemProfileRate = 1 while subscribing (every allocation recorded): grpc server transport/streams, regnode's server and fan-out (baseline: etcd's server packages) → server; SDK, grpc client transport/streams (baseline: clientv3) → client. Goroutines per subscriber are counted by pprof label")
	r.note("memory, subscribers in a child process (regbench re-executed): server_rss = this process's VmRSS delta / S, i.e. the regnode (baseline: etcd) alone, stacks included; client_rss = the child's own VmRSS delta / S")
	r.note("one connection: ours = client.New once and Subscribe S times (one gRPC ClientConn, one Subscribe stream, one feed of the service shared by the S subscriptions: the regnode holds one subscriber; in the child process -fanout-clients=%d clients, so the regnode holds that many subscribers, and the RSS of all but the first client's connection counts per subscriber); baseline = one clientv3.Client with S Watch calls (clientv3 puts them on one gRPC watch stream; etcd holds S watchers), in the child spread over as many clientv3 clients. Each opened one subscription before measuring so the connection is not counted", cfg.fanClients)
	r.note("cpu (subscribers in the child): cpu_server_cores from a CPU profile of this process over the phase, by pprof label (regnode + etcd for ours, etcd for the baseline; every goroutine runs under a label naming its component); cpu_process_cores = getrusage of this process (adds the writer); cpu_client_cores = getrusage of the child. all_subs_ms: commit → the moment every subscriber's view had the change (the child polls all S every 1ms)")
	return r, nil
}

// writeHeap writes the heap profile to file+suffix, if file is set.
func writeHeap(file, suffix string) error {
	if file == "" {
		return nil
	}
	f, err := os.Create(file + suffix)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}

// memStats is what subscribing S added, per subscriber.
type memStats struct {
	rss, heap, stack           float64 // KiB per subscriber
	serverHeap, clientHeap     float64 // KiB per subscriber
	other                      float64 // KiB per subscriber
	goroutinesSrv, goroutinesC float64 // per subscriber
}

func memPerSub(before, after memSnap, S int, serverLabel string) memStats {
	per := func(b int64) float64 { return kib(float64(b) / float64(S)) }
	hd := heapDelta(before, after)
	gs := after.goroutines[serverLabel] - before.goroutines[serverLabel]
	gc := after.goroutines[sideClient] - before.goroutines[sideClient]
	return memStats{
		rss: per(after.rss - before.rss), heap: per(after.heapInuse - before.heapInuse),
		stack:      per(after.stackInuse - before.stackInuse),
		serverHeap: per(hd["server"]), clientHeap: per(hd["client"]), other: per(hd["other"]),
		goroutinesSrv: round3(float64(gs) / float64(S)), goroutinesC: round3(float64(gc) / float64(S)),
	}
}

func (m memStats) report(put func(string, any)) {
	put("rss_per_sub_kib", m.rss)
	put("heap_per_sub_kib", m.heap)
	put("stack_per_sub_kib", m.stack)
	put("server_heap_per_sub_kib", m.serverHeap)
	put("client_heap_per_sub_kib", m.clientHeap)
	put("unattributed_heap_per_sub_kib", m.other)
	put("server_goroutines_per_sub", m.goroutinesSrv)
	put("client_goroutines_per_sub", m.goroutinesC)
}

type fanoutCPU struct {
	dur, process, child time.Duration
	bySide              map[string]time.Duration
	perr                error
	all                 Lat
	rate                float64
}

func (c fanoutCPU) report(put func(string, any), server []string) {
	put("all_subs_ms", c.all)
	put("changes_per_s", round3(c.rate))
	cores := func(d time.Duration) float64 { return round3(d.Seconds() / c.dur.Seconds()) }
	if c.bySide == nil {
		put("cpu_server_cores", "unavailable: "+fmt.Sprint(c.perr))
	} else {
		var srv time.Duration
		for _, s := range server {
			srv += c.bySide[s]
		}
		put("cpu_server_cores", cores(srv))
	}
	put("cpu_process_cores", cores(c.process))
	put("cpu_client_cores", cores(c.child))
}

// fanoutPhase writes ops [from, to) of the plan at the configured rate
// into one namespace and measures CPU here and in the subscriber process,
// and the time until every subscriber had each change.
func fanoutPhase(ctx context.Context, e *env, cli *clientv3.Client, ns *namespaces, which string, p *plan, from, to int, proc *subscriberProc) (fanoutCPU, error) {
	cfg := e.cfg
	var (
		commits []commit
		werr    error
		st      fanoutCPU
	)
	child0, err := proc.cpu()
	if err != nil {
		return st, err
	}
	cpu0 := cpuTime()
	t0 := time.Now()
	write := func() {
		tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.fanRate))
		defer tick.Stop()
		for i := from; i < to; i++ {
			select {
			case <-ctx.Done():
				werr = ctx.Err()
				return
			case <-tick.C:
			}
			var c commit
			labeled(sideWriter, func() { c, werr = ns.apply(ctx, cli, which, p, i) })
			if werr != nil {
				return
			}
			commits = append(commits, c)
		}
	}
	st.bySide, st.perr = cpuProfile(write)
	st.dur = time.Since(t0)
	st.process = cpuTime() - cpu0
	child1, err := proc.cpu()
	if err != nil {
		return st, err
	}
	st.child = child1 - child0
	if werr != nil {
		return st, werr
	}
	st.rate = float64(len(commits)) / st.dur.Seconds()
	var mon *observer
	if len(commits) > 0 {
		last := commits[len(commits)-1].key
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = waitFor(sctx, 20*time.Millisecond, func() bool {
			mon, err = proc.sightings()
			return err != nil || mon.reached(last)
		})
		cancel()
		if err != nil {
			return st, err
		}
	}
	if mon != nil {
		ds, _, _ := latencies(commits, []*observer{mon})
		st.all = summarize(ds)
	}
	return st, nil
}
