package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcdresolver "go.etcd.io/etcd/client/v3/naming/resolver"
	"google.golang.org/grpc/resolver"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/record"
)

// The three ways to follow a service that propagate compares.
const (
	kindOurs     = "ours"          // SDK Subscribe through one regnode
	kindWatch    = "etcd_watch"    // clientv3 Get + Watch on the prefix
	kindResolver = "etcd_resolver" // etcd's naming/resolver, fed by endpoints.Manager
	kindXDS      = "xds"           // xDS (ADS) streams to the same regnode, as gRPC's clients speak it
)

// runPropagate: one writer changes instances at a steady rate; S
// subscribers of each kind measure the time from the write's commit (taken
// right after the etcd call returns) to the change being in their view.
// The kinds take turns (rounds, rotating which goes first), each on its
// own copy of the service, so they never load each other's consumers.
func runPropagate(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	r := newResult("propagate", "latency from a write's commit to the change in each subscriber's view: SDK Subscribe via one regnode vs S xDS streams to it vs S direct etcd watchers vs S etcd naming resolvers")
	r.param("subs", cfg.propSubs)
	r.param("rate_per_s", cfg.propRate)
	r.param("changes_per_kind_round", cfg.propWrites)
	r.param("rounds", cfg.propRounds)
	r.param("instances", cfg.propInstances)
	r.param("per_client", cfg.perClient)

	e.progress.set("starting etcd and a regnode")
	etcd, err := startEtcd(ctx, e, false)
	if err != nil {
		return r, err
	}
	e.onClose(etcd.Close)
	w0, _ := etcdWatchers()
	n, err := startNode(ctx, e, []string{etcd.URL}, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { n.Close() })
	if err := waitChan(ctx, n.Hub().Ready()); err != nil {
		return r, err
	}
	sleep(ctx, 300*time.Millisecond) // the election settles
	w1, _ := etcdWatchers()
	nodeWatchers := w1 - w0
	cli, err := etcdClient(sideWriter, etcd.URL, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { cli.Close() })

	var lastOurs, lastWatch, lastXDS Lat
	var lastWatchers int
	for si, S := range cfg.propSubs {
		cs := fmt.Sprintf("S=%d", S)
		res, err := propagateCase(ctx, e, etcd, n.Addr(), n.XDS().Revision, cli, S, uint64(si+1))
		if err != nil {
			return r, fmt.Errorf("%s: %w", cs, err)
		}
		for _, k := range []string{kindOurs, kindXDS, kindWatch, kindResolver} {
			kr := res[k]
			if kr == nil || kr.lat.N == 0 && !slices.Contains(cfg.propKinds, k) {
				continue
			}
			put := func(metric string, v any) {
				if k == kindOurs {
					r.ours(cs, metric, v)
				} else {
					r.base(k, cs, metric, v)
				}
			}
			put("latency_ms", kr.lat)
			watchers := kr.watchers
			if k == kindOurs {
				watchers += nodeWatchers
			}
			put("etcd_watchers", watchers)
			put("changes_per_s", round3(kr.rate))
			put("cpu_ms_per_change", ms(kr.cpuPerChange))
			if k == kindOurs || k == kindXDS {
				put("heap_kib_per_consumer", round3(kr.heapPerConsumer))
			}
			put("missed", kr.missed)
			put("early", kr.early)
			if k == kindResolver {
				put("unmatched_updates", kr.unmatched)
			}
		}
		lastOurs, lastWatch, lastWatchers = res[kindOurs].lat, res[kindWatch].lat, res[kindOurs].watchers+nodeWatchers
		lastXDS = res[kindXDS].lat
	}
	r.skipRatio("missed", "early", "changes_per_s")
	S := cfg.propSubs[len(cfg.propSubs)-1]
	if lastWatch.N > 0 { // the kind may be left out (-propagate-kinds)
		q := lastOurs.P99 / lastWatch.P99
		r.target(fmt.Sprintf("S=%d p99 ours / direct etcd watchers", S), "<= 0.50",
			fmt.Sprintf("%.3f (%.2fms vs %.2fms)", q, lastOurs.P99, lastWatch.P99), q <= 0.5)
	}
	if x := lastXDS; x.N > 0 {
		r.target(fmt.Sprintf("S=%d p99 xDS streams / SDK subscriptions", S), "<= 1.00",
			fmt.Sprintf("%.3f (%.2fms vs %.2fms)", x.P99/lastOurs.P99, x.P99, lastOurs.P99), x.P99 <= lastOurs.P99)
	}
	r.target(fmt.Sprintf("S=%d etcd watchers the subscribers of ours added", S), "0 (the regnode's own watches serve them all)",
		fmt.Sprint(lastWatchers-nodeWatchers), lastWatchers == nodeWatchers)
	r.note("etcd watchers: etcd_debugging_mvcc_watcher_total from the embedded server's Prometheus registry (prometheus.DefaultGatherer), difference before/after starting each kind's consumers; ours counts the regnode's own (measured when it started: %d, its watch of the instances and its watch of the regnodes' announcements, which shares probing) plus what S subscribers added", nodeWatchers)
	r.note("clients: every kind shares one client connection among %d consumers: ours %d subscriptions per client.New (one gRPC conn, one Subscribe stream, one feed of the service: the regnode holds one subscriber per client); etcd_watch %d clientv3 watchers per clientv3.Client (clientv3 multiplexes them on one gRPC watch stream; etcd still holds one watcher each); etcd_resolver %d resolvers per clientv3.Client", cfg.perClient, cfg.perClient, cfg.perClient, cfg.perClient)
	r.note("etcd_resolver: the real go.etcd.io/etcd/client/v3/naming/resolver built with a recording resolver.ClientConn standing where grpc's ClientConn would (no balancer), fed by endpoints.Manager writing the same changes as endpoint updates; each update's address list names the change it reflects (every write gives a unique address), so batching cannot hide a change")
	r.note("xds: S ADS streams (state of the world, as gRPC's xDS clients speak it: the service's endpoints named, each response acknowledged) to the same regnode, one stream per gRPC process that would hold it (grpc-go shares one xDS stream per process); a response's version is mapped by the regnode to the revision it was built from. They follow a copy of the service under another name (the same records, written in their own rounds), so ours and xds never carry each other's changes")
	r.note("heap_kib_per_consumer: the settled heap (two GCs) the S consumers of that kind added to this process, both ends of their streams (the regnode and the consumers share it), per consumer")
	r.note("etcd_watch: clientv3 Get then Watch from the next revision on a prefix with the same record layout, decoding each record into a map (what a direct consumer does)")
	r.note("cpu_ms_per_change: CPU time of the whole process (getrusage: etcd, regnode, writer and the S consumers) during that kind's writing phases, per change")
	r.note("commit time is taken right after the etcd Put/Delete (or endpoints.Manager call) returns; 'early' counts views that had the change before that (latency counted as 0)")
	return r, nil
}

type kindResult struct {
	lat                      Lat
	watchers                 int
	rate                     float64
	missed, early, unmatched int
	cpuPerChange             time.Duration
	heapPerConsumer          float64 // KiB of settled heap the S consumers added, both ends (in-process)
}

// settledHeap is the heap in use after two collections.
func settledHeap() float64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapInuse)
}

// propagateCase runs every round for S consumers of each kind.
func propagateCase(ctx context.Context, e *env, etcd *etcdServer, regnode string, xdsRev func(string) int64, cli *clientv3.Client, S int, seed uint64) (map[string]*kindResult, error) {
	cfg := e.cfg
	service := fmt.Sprintf("prop-%d", S)
	rounds := max(1, cfg.propRounds)
	p, err := makePlan(service, cfg.propInstances, rounds*cfg.propWrites, seed)
	if err != nil {
		return nil, err
	}
	ns, err := newNamespaces(cli, service)
	if err != nil {
		return nil, err
	}
	defer ns.cleanup(ctx, cli, service)
	if err := ns.writeInitial(ctx, cli, p); err != nil {
		return nil, err
	}
	clients := (S + cfg.perClient - 1) / cfg.perClient
	out := map[string]*kindResult{kindOurs: {}, kindXDS: {}, kindWatch: {}, kindResolver: {}}
	obs := map[string][]*observer{}
	for _, k := range []string{kindOurs, kindXDS, kindWatch, kindResolver} {
		for range S {
			obs[k] = append(obs[k], &observer{})
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// ours: S subscriptions over `clients` SDK clients.
	e.progress.set("S=%d: %d subscriptions", S, S)
	wa, _ := etcdWatchers()
	heap0 := settledHeap()
	var subs []*client.Subscription
	var regs []*client.Client
	defer func() {
		for _, s := range subs {
			s.Close()
		}
		for _, c := range regs {
			c.Close()
		}
	}()
	for range clients {
		c, err := regClient(e, regnode)
		if err != nil {
			return nil, err
		}
		regs = append(regs, c)
	}
	for i := range S {
		o := obs[kindOurs][i]
		var s *client.Subscription
		labeled(sideClient, func() {
			s, err = regs[i/cfg.perClient].Subscribe(cctx, service, client.SubscribeOptions{OnChange: func(ch client.Change) {
				if !ch.Progress {
					o.saw(ch.Revision, time.Now())
				}
			}})
		})
		if err != nil {
			return nil, err
		}
		subs = append(subs, s)
	}
	for _, s := range subs {
		if err := s.WaitReady(ctx); err != nil {
			return nil, err
		}
	}
	sleep(ctx, 100*time.Millisecond)
	wb, _ := etcdWatchers()
	out[kindOurs].watchers = wb - wa
	heap1 := settledHeap()
	out[kindOurs].heapPerConsumer = (heap1 - heap0) / 1024 / float64(S)

	// xds: S ADS streams to the same regnode, over `clients` connections.
	if slices.Contains(cfg.propKinds, kindXDS) {
		e.progress.set("S=%d: %d xDS streams", S, S)
		xf, err := startXDSFollowers(cctx, regnode, xdsService(service), S, cfg.perClient, xdsRev, func(i int, rev int64, at time.Time) { obs[kindXDS][i].saw(rev, at) })
		if err != nil {
			return nil, err
		}
		defer xf.stop()
		sleep(ctx, 100*time.Millisecond)
		out[kindXDS].heapPerConsumer = (settledHeap() - heap1) / 1024 / float64(S)
	}

	// etcd_watch: S watchers over `clients` clientv3 clients.
	e.progress.set("S=%d: %d etcd watchers", S, S)
	var ecs []*clientv3.Client
	defer func() {
		for _, c := range ecs {
			c.Close()
		}
	}()
	for range clients {
		c, err := etcdClient(sideClient, etcd.URL, nil)
		if err != nil {
			return nil, err
		}
		ecs = append(ecs, c)
	}
	ws := newWatchers(cctx, func(i int) *clientv3.Client { return ecs[i/cfg.perClient] }, ns.direct, service)
	defer ws.stop()
	if err := ws.start(S, func(i int, rev int64, at time.Time) { obs[kindWatch][i].saw(rev, at) }); err != nil {
		return nil, err
	}
	sleep(ctx, 100*time.Millisecond)
	wc, _ := etcdWatchers()
	out[kindWatch].watchers = wc - wb

	// etcd_resolver: S of etcd's naming resolvers over `clients` clients.
	e.progress.set("S=%d: %d etcd naming resolvers", S, S)
	var rcs []*clientv3.Client
	defer func() {
		for _, c := range rcs {
			c.Close()
		}
	}()
	for range clients {
		c, err := etcdClient(sideClient, etcd.URL, nil)
		if err != nil {
			return nil, err
		}
		rcs = append(rcs, c)
	}
	var resolvers []resolver.Resolver
	defer func() {
		for _, r := range resolvers {
			r.Close()
		}
	}()
	var ccs []*recordingCC
	for i := range S {
		b, err := etcdresolver.NewBuilder(rcs[i/cfg.perClient])
		if err != nil {
			return nil, err
		}
		cc := &recordingCC{obs: obs[kindResolver][i], fps: p.fps}
		var res resolver.Resolver
		labeled(sideClient, func() {
			res, err = b.Build(resolver.Target{URL: url.URL{Scheme: "etcd", Path: "/" + ns.target}}, cc, resolver.BuildOptions{})
		})
		if err != nil {
			return nil, err
		}
		resolvers = append(resolvers, res)
		ccs = append(ccs, cc)
	}
	if err := waitFor(ctx, 5*time.Millisecond, func() bool {
		for _, o := range obs[kindResolver] {
			if !o.reached(-1) {
				return false
			}
		}
		return true
	}); err != nil {
		return nil, fmt.Errorf("resolvers' first update: %w", err)
	}
	sleep(ctx, 100*time.Millisecond)
	wd, _ := etcdWatchers()
	out[kindResolver].watchers = wd - wc

	// The rounds.
	commits := map[string][]commit{}
	active := map[string]time.Duration{}
	cpu := map[string]time.Duration{}
	interval := time.Duration(float64(time.Second) / cfg.propRate)
	kinds := cfg.propKinds
	which := map[string]string{kindOurs: "ours", kindXDS: "xds", kindWatch: "direct", kindResolver: "naming"}
	for round := range rounds {
		for k := range kinds {
			kind := kinds[(round+k)%len(kinds)]
			from, to := round*cfg.propWrites, (round+1)*cfg.propWrites
			tick := time.NewTicker(interval)
			start, cpu0 := time.Now(), cpuTime()
			for i := from; i < to; i++ {
				select {
				case <-ctx.Done():
					tick.Stop()
					return nil, ctx.Err()
				case <-tick.C:
				}
				var c commit
				labeled(sideWriter, func() { c, err = ns.apply(ctx, cli, which[kind], p, i) })
				if err != nil {
					tick.Stop()
					return nil, fmt.Errorf("%s write %d: %w", kind, i, err)
				}
				commits[kind] = append(commits[kind], c)
				if i%10 == 0 {
					e.progress.set("S=%d round %d/%d %s: %d/%d changes", S, round+1, rounds, kind, i-from, to-from)
				}
			}
			tick.Stop()
			active[kind] += time.Since(start)
			cpu[kind] += cpuTime() - cpu0
			// Settle: every consumer has the last change, or 5s passed.
			last := commits[kind][len(commits[kind])-1].key
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			err := waitFor(sctx, 2*time.Millisecond, func() bool {
				for _, o := range obs[kind] {
					if !o.reached(last) {
						return false
					}
				}
				return true
			})
			scancel()
			if err != nil && ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
	}
	for _, kind := range kinds {
		ds, early, missed := latencies(commits[kind], obs[kind])
		kr := out[kind]
		kr.lat, kr.early, kr.missed = summarize(ds), early, missed
		kr.rate = float64(len(commits[kind])) / active[kind].Seconds()
		kr.cpuPerChange = cpu[kind] / time.Duration(max(1, len(commits[kind])))
	}
	for _, cc := range ccs {
		out[kindResolver].unmatched += int(cc.unmatched.Load())
	}
	return out, nil
}

// directWatcher is a plain etcd consumer of a prefix of registry records:
// Get, then Watch from the next revision, decoding every record into its
// map. It reports on created once the watch is established (or failed).
func directWatcher(ctx context.Context, c *clientv3.Client, keys record.Keys, prefix string, saw func(int64, time.Time), created chan<- error) {
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		created <- err
		return
	}
	view := map[string]any{}
	for _, kv := range resp.Kvs {
		if in, err := keys.Decode(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision); err == nil {
			view[string(kv.Key)] = in
		}
	}
	saw(resp.Header.Revision, time.Now())
	wch := c.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1), clientv3.WithCreatedNotify())
	first := true
	for wr := range wch {
		if first {
			first = false
			if err := wr.Err(); err != nil {
				created <- err
				return
			}
			created <- nil
			if wr.Created {
				continue
			}
		}
		if wr.Err() != nil {
			return
		}
		var rev int64
		for _, ev := range wr.Events {
			rev = max(rev, ev.Kv.ModRevision)
			if ev.Type == clientv3.EventTypeDelete {
				delete(view, string(ev.Kv.Key))
				continue
			}
			if in, err := keys.Decode(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision); err == nil {
				view[string(ev.Kv.Key)] = in
			}
		}
		if rev > 0 {
			saw(rev, time.Now())
		}
	}
	if first {
		created <- errors.New("watch closed before it was created")
	}
}

func waitChan(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// watchers is a set of direct etcd watchers (directWatcher) of one
// service's prefix; stop cancels them and waits for their goroutines.
type watchers struct {
	ctx       context.Context
	cancel    context.CancelFunc
	keys      record.Keys
	prefix    string
	clientFor func(i int) *clientv3.Client
	wg        sync.WaitGroup
}

func newWatchers(ctx context.Context, clientFor func(i int) *clientv3.Client, keys record.Keys, service string) *watchers {
	ctx, cancel := context.WithCancel(ctx)
	return &watchers{ctx: ctx, cancel: cancel, keys: keys, prefix: keys.Service(service), clientFor: clientFor}
}

// start starts n more watchers, 32 at a time, and returns once every one
// is established; watcher i reports what it sees to saw(i, ...).
func (w *watchers) start(n int, saw func(i int, rev int64, at time.Time)) error {
	sem := make(chan struct{}, 32)
	errs := make(chan error, n)
	var helpers sync.WaitGroup
	defer helpers.Wait()
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-w.ctx.Done():
			return w.ctx.Err()
		}
		created := make(chan error, 1)
		w.wg.Add(1)
		labeled(sideClient, func() {
			go func() {
				defer w.wg.Done()
				directWatcher(w.ctx, w.clientFor(i), w.keys, w.prefix, func(rev int64, at time.Time) { saw(i, rev, at) }, created)
			}()
		})
		helpers.Add(1)
		go func() { // releases the slot once the watch is established
			defer helpers.Done()
			var err error
			select {
			case err = <-created:
			case <-w.ctx.Done():
				err = w.ctx.Err()
			}
			<-sem
			errs <- err
		}()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (w *watchers) stop() {
	w.cancel()
	w.wg.Wait()
}
