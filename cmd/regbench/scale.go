package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// The services of the scale scenario: N instances in services of
// catalogSize (written straight into etcd); the service every subscriber
// follows, where propagation is measured; the rolling restarts' services.
const (
	catalogSize   = 100
	scaleWatched  = "watched"
	watchedBase   = 10 // instances of scaleWatched before the changes
	scaleRollName = "roll-%d"
)

// runScale: three regnode processes (the real cmd/regnode binary) on one
// external etcd (embedded in this process), N instances, S subscribers in
// child processes (each subscriber one SDK client of all three regnodes,
// so its Subscribe stream lands on any). Measured: a regnode's cold start
// on N instances; regnode memory per instance and per subscriber; a
// change through one regnode until every subscriber has it (against S
// raw etcd watchers); rolling restarts of a service at two sizes (what
// subscribers receive per change); a regnode SIGKILLed and its
// subscribers moved.
func runScale(ctx context.Context, e *env) (*Result, error) {
	var nodes []*regnodeProc
	r, err := scale(ctx, e, &nodes)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		// A child killed or a call cut short by the deadline: say so.
		err = fmt.Errorf("%w: %v", ctx.Err(), err)
	}
	if err != nil {
		// A regnode that exited by itself (not the one the scenario
		// killed) is most likely why: its last words.
		for _, p := range nodes {
			select {
			case <-p.done:
				if !p.killed.Load() {
					err = fmt.Errorf("%w\n%s exited by itself (%v); its stderr ends:\n%s", err, p.name, p.cmd.ProcessState, p.tail())
				}
			default:
			}
		}
	}
	return r, err
}

func scale(ctx context.Context, e *env, started *[]*regnodeProc) (*Result, error) {
	cfg := e.cfg
	N, S, P := cfg.scaleN, cfg.scaleS, min(cfg.scaleProcs, cfg.scaleS)
	r := newResult("scale", fmt.Sprintf("%d instances, %d subscribers (SDK clients in %d processes) over 3 regnode processes on one etcd: cold start, memory, propagation vs %d raw etcd watchers, rolling restarts, a regnode SIGKILLed", N, S, P, S))
	r.param("instances", N)
	r.param("subscribers", S)
	r.param("subscriber_processes", P)
	r.param("changes", cfg.scaleChanges)
	r.param("max_rate_per_s", cfg.scaleRate)
	r.param("roll_sizes", cfg.scaleRoll)
	r.param("roll_wave", cfg.scaleWave)
	cs := fmt.Sprintf("N=%d,S=%d", N, S)
	keys := record.NewKeys("")

	dir, bin, err := regnodeBinary(ctx, e, "regbench-scale-")
	if err != nil {
		return r, err
	}
	e.progress.set("starting etcd")
	etcd, err := startEtcd(ctx, e, false)
	if err != nil {
		return r, err
	}
	e.onClose(etcd.Close)
	cli, err := etcdClient(sideWriter, etcd.URL, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { cli.Close() })

	var nodes []*regnodeProc
	e.onClose(func() {
		for _, p := range nodes {
			p.kill()
		}
	})
	startNodeProc := func(i int) (*regnodeProc, error) {
		p, err := startRegnodeProc(bin, fmt.Sprintf("rn%d", i+1), etcd.URL, dir)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, p)
		*started = nodes
		return p, nil
	}

	// ---- memory per instance: two regnodes follow an empty registry,
	// then N instances are written.
	e.progress.set("starting rn1, rn2 on an empty registry")
	for i := range 2 {
		p, err := startNodeProc(i)
		if err != nil {
			return r, err
		}
		if err := p.waitServing(ctx); err != nil {
			return r, err
		}
	}
	sleep(ctx, time.Second)
	rssEmpty := []int64{nodes[0].rss(), nodes[1].rss()}
	etcd0 := settledRSS()
	if err := populateCatalog(ctx, e, cli, keys, N); err != nil {
		return r, err
	}
	for k := range watchedBase {
		if err := putInstance(ctx, cli, keys, scaleWatched, fmt.Sprintf("w%d", k)); err != nil {
			return r, err
		}
		if err := putInstance(ctx, cli, record.NewKeys(directPrefix), scaleWatched, fmt.Sprintf("w%d", k)); err != nil {
			return r, err
		}
	}
	etcd1 := settledRSS()
	total := int64(N + watchedBase)
	for _, p := range nodes {
		e.progress.set("waiting for %s to hold %d instances", p.name, total)
		if err := p.waitCount(ctx, total); err != nil {
			return r, err
		}
	}
	sleep(ctx, time.Second)
	var perInst []float64
	for i := range 2 {
		perInst = append(perInst, float64(nodes[i].rss()-rssEmpty[i])/float64(N))
	}
	r.ours(cs, "rss_per_instance_kib", kib(median(perInst)))
	r.base("etcd", cs, "rss_per_instance_kib", kib(float64(etcd1-etcd0)/float64(N)))

	// ---- cold start: rn3 exec'd on N instances, until a subscription of
	// everything through it holds them all.
	e.progress.set("cold start of rn3 on %d instances", N)
	rn3, err := startNodeProc(2)
	if err != nil {
		return r, err
	}
	var coldC *client.Client
	labeled(sideClient, func() {
		coldC, err = client.New(client.Config{Endpoints: []string{rn3.api}, Logger: e.log, DialOptions: []grpc.DialOption{fastReconnect}})
	})
	if err != nil {
		return r, err
	}
	var all *client.Subscription
	labeled(sideClient, func() {
		all, err = coldC.Subscribe(ctx, "", client.SubscribeOptions{MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	})
	if err != nil {
		coldC.Close()
		return r, err
	}
	err = rn3.waitServing(ctx)
	servingAt := time.Now()
	if err == nil {
		err = all.WaitReady(ctx)
	}
	snapAt := time.Now()
	got := all.Snapshot().Len()
	all.Close()
	coldC.Close()
	if err != nil {
		return r, err
	}
	if int64(got) < total {
		return r, fmt.Errorf("rn3's first snapshot holds %d instances, want %d", got, total)
	}
	cold := snapAt.Sub(rn3.startedAt)
	rawD, rawN, err := rawList(ctx, cli, keys.Instances(), &keys)
	if err != nil {
		return r, err
	}
	if int64(rawN) < total {
		return r, fmt.Errorf("raw Get read %d instances, want %d", rawN, total)
	}
	r.ours(cs, "cold_start_serving_ms", ms(servingAt.Sub(rn3.startedAt)))
	r.ours(cs, "cold_start_full_snapshot_ms", ms(cold))
	r.ours(cs, "cold_start_snapshot_after_serving_ms", ms(snapAt.Sub(servingAt)))
	r.base("etcd_get_decode", cs, "cold_start_full_snapshot_ms", ms(rawD))
	r.base("etcd_get_decode", cs, "cold_start_snapshot_after_serving_ms", ms(rawD))
	api := []string{nodes[0].api, nodes[1].api, nodes[2].api}

	// ---- baseline: S raw etcd watchers (one clientv3 client each) in a
	// child process; etcd's memory per watcher and propagation to all.
	e.progress.set("baseline: %d etcd watchers", S)
	{
		proc, err := startSubscribers(ctx, "etcd", etcd.URL, scaleWatched, S, S)
		if err != nil {
			return r, err
		}
		err = func() error {
			defer proc.stop()
			rss0 := settledRSS()
			if err := proc.go_(); err != nil {
				return err
			}
			sleep(ctx, time.Second)
			r.base("etcd", cs, "rss_per_subscriber_kib", kib(float64(settledRSS()-rss0)/float64(S)))
			dkeys := record.NewKeys(directPrefix)
			var seq int
			write := func(i int) (commit, error) {
				id := fmt.Sprintf("p%d", i/2)
				if i%2 == 1 {
					resp, err := cli.Delete(ctx, dkeys.Instance(scaleWatched, id))
					if err != nil {
						return commit{}, err
					}
					return commit{resp.Header.Revision, time.Now()}, nil
				}
				v, err := record.Encode(instanceN(scaleWatched, seq))
				seq++
				if err != nil {
					return commit{}, err
				}
				resp, err := cli.Put(ctx, dkeys.Instance(scaleWatched, id), string(v))
				if err != nil {
					return commit{}, err
				}
				return commit{resp.Header.Revision, time.Now()}, nil
			}
			lat, rate, err := scalePropagate(ctx, e, "etcd watchers", write, func() ([]*observer, error) {
				o, err := proc.sightings()
				return []*observer{o}, err
			})
			if err != nil {
				return fmt.Errorf("propagation: %w", err)
			}
			r.base("etcd", cs, "propagation_all_subscribers_ms", lat)
			r.base("etcd", cs, "propagation_changes_per_s", rate)
			return scaleRollBaseline(ctx, e, r, cli, proc)
		}()
		if err != nil {
			if ctx.Err() != nil {
				return r, fmt.Errorf("baseline: %w", err)
			}
			// The baseline giving up (etcd timing out its writes under S
			// watchers) is a result: ours is still measured.
			r.base("etcd", cs, "failed", err.Error())
			r.note("baseline etcd failed, the rest of it not measured: %v", err)
		}
	}

	// ---- S subscribers in P processes; regnode memory per subscriber.
	sleep(ctx, time.Second)
	rssIdle := make([]int64, 3)
	for i, p := range nodes {
		rssIdle[i] = p.rss()
	}
	var procs []*scaleProc
	e.onClose(func() {
		for _, p := range procs {
			p.stop()
		}
	})
	for i := range P {
		K := S / P
		if i < S%P {
			K++
		}
		p, err := startScaleProc(ctx, api, scaleWatched, K)
		if err != nil {
			return r, err
		}
		procs = append(procs, p)
	}
	t0 := time.Now()
	for i, p := range procs {
		e.progress.set("%d subscribers: process %d/%d subscribing", S, i+1, P)
		if err := p.ready(); err != nil {
			return r, err
		}
	}
	subscribeAll := time.Since(t0)
	sleep(ctx, time.Second)
	var grow, childGrow int64
	for i, p := range nodes {
		grow += p.rss() - rssIdle[i]
	}
	for _, p := range procs {
		childGrow += p.rss1 - p.rss0
	}
	var spread []string
	for _, p := range nodes {
		spread = append(spread, fmt.Sprintf("%s=%.0f", p.name, p.metric(ctx, "registry_subscribers")))
	}
	// streams is the number of Subscribe streams the subscribers have
	// opened: one each, and one more for every resume (a stream that
	// broke, or whose regnode went quiet past the receive deadline).
	streams := func() (n int64, err error) {
		for _, p := range procs {
			v, err := p.ints("streams")
			if err != nil {
				return 0, err
			}
			n += v[0]
		}
		return n, nil
	}
	streams0, err := streams()
	if err != nil {
		return r, err
	}
	r.ours(cs, "subscribe_all_ms", ms(subscribeAll))
	r.ours(cs, "subscribe_all_stream_resumes", streams0-int64(S))
	r.ours(cs, "rss_per_subscriber_kib", kib(float64(grow)/float64(S)))
	r.ours(cs, "client_rss_per_subscriber_kib", kib(float64(childGrow)/float64(S)))
	r.ours(cs, "subscribers_by_regnode", strings.Join(spread, " "))

	// ---- propagation: Register/Deregister through rn1 until every
	// subscriber on every regnode has it.
	ttl := durationpb.New(30 * time.Minute)
	{
		var secret string
		var lease int64
		write := func(i int) (commit, error) {
			id := fmt.Sprintf("p%d", i/2)
			if i%2 == 1 {
				resp, err := nodes[0].reg.Deregister(ctx, &registryv1.DeregisterRequest{Service: scaleWatched, Id: id, LeaseId: lease, Secret: secret})
				if err != nil {
					return commit{}, fmt.Errorf("deregister %s: %w", id, err)
				}
				return commit{resp.GetRevision(), time.Now()}, nil
			}
			in := instanceN(scaleWatched, i/2)
			in.Id = id
			resp, err := nodes[0].reg.Register(ctx, &registryv1.RegisterRequest{Instance: in, Ttl: ttl})
			if err != nil {
				return commit{}, fmt.Errorf("register %s: %w", id, err)
			}
			secret, lease = resp.GetSecret(), resp.GetLeaseId()
			return commit{resp.GetRevision(), time.Now()}, nil
		}
		res, rate, err := scalePropagate(ctx, e, "ours", write, func() ([]*observer, error) {
			var obs []*observer
			for _, p := range procs {
				o, err := p.sightings()
				if err != nil {
					return nil, err
				}
				obs = append(obs, o)
			}
			return obs, nil
		})
		if err != nil {
			return r, fmt.Errorf("propagation: %w", err)
		}
		streams1, err := streams()
		if err != nil {
			return r, err
		}
		r.ours(cs, "propagation_all_subscribers_ms", res)
		r.ours(cs, "propagation_changes_per_s", rate)
		r.ours(cs, "propagation_stream_resumes", streams1-streams0)
	}

	// ---- rolling restarts.
	ask := func(cmd string) ([][]int64, error) {
		var out [][]int64
		for _, p := range procs {
			v, err := p.ints(cmd)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	// sum adds up field i of every process's answer; minOf takes the least.
	sum := func(a [][]int64, i int) (s int64) {
		for _, v := range a {
			s += v[i]
		}
		return s
	}
	minOf := func(a [][]int64, i int) int64 {
		m := int64(-1)
		for _, v := range a {
			if m < 0 || v[i] < m {
				m = v[i]
			}
		}
		return m
	}
	resets := func() (s float64) {
		for _, p := range nodes {
			s += p.metric(ctx, "registry_resets_sent_total")
		}
		return s
	}
	var bytesPerEvent []float64
	var regressions int64
	for _, M := range cfg.scaleRoll {
		service := fmt.Sprintf(scaleRollName, M)
		rc := fmt.Sprintf("roll M=%d", M)
		e.progress.set("%s: registering %d instances", rc, M)
		type reg struct {
			in            *registryv1.Instance
			secret        string
			lease, origin int64
		}
		regs := make([]reg, M)
		var retries atomic.Int64
		register := func(k int) (int64, error) {
			in := instanceN(service, k)
			var rev int64
			err := retried(ctx, &retries, func(retry bool) error {
				if retry {
					// The attempt that timed out may have committed, and
					// its secret is lost: take the record down as an
					// operator (this host is loopback) and register anew.
					_, err := nodes[k%3].reg.Deregister(ctx, &registryv1.DeregisterRequest{Service: service, Id: in.Id})
					if err != nil && status.Code(err) != codes.NotFound { // NotFound: it had not
						return err
					}
				}
				resp, err := nodes[k%3].reg.Register(ctx, &registryv1.RegisterRequest{Instance: in, Ttl: ttl})
				if err != nil {
					return err
				}
				regs[k] = reg{in: in, secret: resp.GetSecret(), lease: resp.GetLeaseId()}
				rev = resp.GetRevision()
				return nil
			})
			if err != nil {
				return 0, fmt.Errorf("register %s/%s: %w", service, in.Id, err)
			}
			return rev, nil
		}
		if _, err := inWaves(M, cfg.scaleWave, register); err != nil {
			return r, err
		}
		e.progress.set("%s: %d subscribers subscribing", rc, S)
		if _, err := ask("sub " + service); err != nil {
			return r, err
		}
		st0, err := ask("stats " + service)
		if err != nil {
			return r, err
		}
		resets0 := resets()
		retries0 := retries.Load()
		streamsRoll0, err := streams()
		if err != nil {
			return r, err
		}
		e.progress.set("%s: rolling restart, waves of %d", rc, cfg.scaleWave)
		cpu0 := cpuOf(nodes, procs)
		var (
			callMu sync.Mutex
			calls  []time.Duration
		)
		timed := func(f func() (int64, error)) (int64, error) {
			t := time.Now()
			rev, err := f()
			callMu.Lock()
			calls = append(calls, time.Since(t))
			callMu.Unlock()
			return rev, err
		}
		t0 := time.Now()
		last, err := inWaves(M, cfg.scaleWave, func(k int) (int64, error) {
			g := regs[k]
			if _, err := timed(func() (rev int64, err error) {
				err = retried(ctx, &retries, func(retry bool) error {
					resp, err := nodes[k%3].reg.Deregister(ctx, &registryv1.DeregisterRequest{Service: service, Id: g.in.Id, LeaseId: g.lease, Secret: g.secret})
					if retry && status.Code(err) == codes.NotFound {
						return nil // the attempt that timed out had deleted it
					}
					rev = resp.GetRevision()
					return err
				})
				return rev, err
			}); err != nil {
				return 0, fmt.Errorf("deregister %s/%s: %w", service, g.in.Id, err)
			}
			return timed(func() (int64, error) { return register(k) })
		})
		if err != nil {
			return r, err
		}
		rolled := time.Since(t0)
		var st1 [][]int64
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = waitFor(wctx, 50*time.Millisecond, func() bool {
			st1, err = ask("stats " + service)
			return err != nil || minOf(st1, 5) >= last
		})
		cancel()
		if err != nil {
			return r, fmt.Errorf("%s: not every subscriber reached revision %d: %w", rc, last, err)
		}
		delivered := time.Since(t0)
		cpu1 := cpuOf(nodes, procs)
		changes, events := sum(st1, 0)-sum(st0, 0), sum(st1, 1)-sum(st0, 1)
		snaps, bytes := sum(st1, 2)-sum(st0, 2), sum(st1, 3)-sum(st0, 3)
		regressions = max(regressions, sum(st1, 4))
		written := 2 * M
		r.ours(rc, "changes_written", written)
		r.ours(rc, "changes_delivered", changes)
		r.ours(rc, "events_delivered", events)
		r.ours(rc, "events_per_subscriber_per_change", round3(float64(events)/float64(S)/float64(written)))
		r.ours(rc, "bytes_per_event", round3(float64(bytes)/float64(max(events, 1))))
		r.ours(rc, "bytes_per_subscriber_per_change", round3(float64(bytes)/float64(S)/float64(written)))
		r.ours(rc, "snapshots_received", snaps)
		r.ours(rc, "resets_sent", int64(resets()-resets0))
		streamsRoll1, err := streams()
		if err != nil {
			return r, err
		}
		r.ours(rc, "stream_resumes", streamsRoll1-streamsRoll0)
		r.ours(rc, "roll_ms", ms(rolled))
		r.ours(rc, "all_delivered_ms", ms(delivered))
		r.ours(rc, "call_ms", summarize(calls))
		// Calls a loaded regnode failed with its call timeout (or
		// Unavailable), and that the roll sent again, as an instance
		// restarting would.
		r.ours(rc, "call_retries", retries.Load()-retries0)
		deliveries := float64(S) * float64(written)
		r.ours(rc, "cpu_s_etcd", round3((cpu1["etcd"] - cpu0["etcd"]).Seconds()))
		r.ours(rc, "cpu_s_server", round3((cpu1["server"] - cpu0["server"]).Seconds()))
		r.ours(rc, "cpu_s_subscribers", round3((cpu1["subscribers"] - cpu0["subscribers"]).Seconds()))
		r.ours(rc, "server_cpu_us_per_delivery", round3(float64(cpu1["server"]-cpu0["server"])/1e3/deliveries))
		r.ours(rc, "subscriber_cpu_us_per_delivery", round3(float64(cpu1["subscribers"]-cpu0["subscribers"])/1e3/deliveries))
		bytesPerEvent = append(bytesPerEvent, float64(bytes)/float64(max(events, 1)))
		if _, err := ask("unsub " + service); err != nil {
			return r, err
		}
	}

	// ---- a regnode SIGKILLed: its subscribers move.
	victim := nodes[2]
	where := map[string]int{}
	for _, p := range procs {
		f, err := p.ask("where")
		if err != nil {
			return r, err
		}
		for _, kv := range f {
			a, n, _ := strings.Cut(kv, "=")
			k, _ := strconv.Atoi(n)
			for _, nd := range nodes {
				if nd.api == a {
					a = nd.name
				}
			}
			where[a] += k
		}
	}
	spread = spread[:0]
	for _, nd := range nodes {
		spread = append(spread, fmt.Sprintf("%s=%d", nd.name, where[nd.name]))
	}
	if k := where["none"]; k > 0 {
		spread = append(spread, fmt.Sprintf("none=%d", k))
	}
	marks, err := ask("mark " + victim.api)
	if err != nil {
		return r, err
	}
	marked := sum(marks, 0)
	e.progress.set("SIGKILL %s (%d subscribers on it)", victim.name, marked)
	killAt := time.Now()
	victim.kill()
	in := instanceN(scaleWatched, 999999)
	in.Id = "after-kill"
	resp, err := nodes[0].reg.Register(ctx, &registryv1.RegisterRequest{Instance: in, Ttl: ttl})
	if err != nil {
		return r, fmt.Errorf("write after the kill: %w", err)
	}
	target := resp.GetRevision()
	if _, err := ask(fmt.Sprintf("target %d", target)); err != nil {
		return r, err
	}
	var mv [][]int64
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = waitFor(wctx, 20*time.Millisecond, func() bool {
		mv, err = ask("moved")
		if err != nil {
			return true
		}
		moved := int64(0)
		for _, v := range mv {
			moved += int64(len(v) - 2)
		}
		return moved == marked && sum(mv, 1) == int64(S)
	})
	cancel()
	if err != nil {
		return r, fmt.Errorf("after the kill of %s: not every subscriber moved and converged: %w", victim.name, err)
	}
	var moves []time.Duration
	for _, v := range mv {
		for _, t := range v[2:] {
			moves = append(moves, time.Unix(0, t).Sub(killAt))
		}
	}
	st, err := ask("stats " + scaleWatched)
	if err != nil {
		return r, err
	}
	regressions = max(regressions, sum(st, 4))
	kc := fmt.Sprintf("kill %s", victim.name)
	r.ours(kc, "streams_by_regnode_before", strings.Join(spread, " "))
	r.ours(kc, "subscribers_moved", marked)
	r.ours(kc, "moved_and_converged_ms", summarize(moves))
	r.ours(kc, "converged", sum(mv, 1))
	r.ours(kc, "revision_regressions", regressions)
	spread = spread[:0]
	for _, p := range nodes[:2] {
		spread = append(spread, fmt.Sprintf("%s=%.0f", p.name, p.metric(ctx, "registry_subscribers")))
	}
	r.ours(kc, "subscribers_by_regnode_after", strings.Join(spread, " "))

	r.skipRatio("subscribe_all_ms")
	op, bp := lookup(r.Ours, cs, "propagation_all_subscribers_ms"), lookup(r.Baseline, "etcd", cs, "propagation_all_subscribers_ms")
	if o, ok := op.(Lat); ok {
		if b, ok := bp.(Lat); ok && b.P99 > 0 {
			r.target("propagation p99 to every subscriber, ours / raw etcd watchers", "<= 0.50",
				fmt.Sprintf("%.3f (%.1fms vs %.1fms)", o.P99/b.P99, o.P99, b.P99), o.P99/b.P99 <= 0.5)
		}
	}
	sub, _ := lookup(r.Ours, cs, "rss_per_subscriber_kib").(float64)
	r.target("regnode RSS per subscriber (subscribers in other processes)", "<= 4 KiB", fmt.Sprintf("%.2f KiB", sub), sub <= 4)
	if len(bytesPerEvent) >= 2 {
		q := bytesPerEvent[len(bytesPerEvent)-1] / bytesPerEvent[0]
		r.target(fmt.Sprintf("rolling restart O(changes): bytes per event at M=%d / at M=%d", cfg.scaleRoll[len(cfg.scaleRoll)-1], cfg.scaleRoll[0]),
			"<= 1.25", fmt.Sprintf("%.3f", q), q <= 1.25)
	}
	var worst float64
	for _, M := range cfg.scaleRoll {
		v, _ := lookup(r.Ours, fmt.Sprintf("roll M=%d", M), "events_per_subscriber_per_change").(float64)
		worst = max(worst, v)
	}
	r.target("rolling restart: events delivered per subscriber per change written (a delete and a register in one batch arrive as one update)", "<= 1.0",
		fmt.Sprintf("%.3f (worst size)", worst), worst <= 1.0)
	r.target("subscribers whose revision went back", "0", fmt.Sprint(regressions), regressions == 0)
	r.target("subscribers of the killed regnode moved and converged", fmt.Sprint(marked), fmt.Sprintf("%d (all %d at the revision after the kill)", len(moves), sum(mv, 1)), int64(len(moves)) == marked && marked > 0)

	r.note("regnodes: the cmd/regnode binary (built with go build unless -regnode-bin), three processes with --etcd-endpoints on one etcd embedded in this process (fsync off), no per-peer limits (every client is one loopback peer); one external etcd rather than three embedded members so that a regnode's RSS is the regnode alone and the kill takes a regnode, not an etcd member")
	r.note("rss_per_instance: VmRSS growth of rn1 and rn2 (median) from an empty registry to %d instances (services of %d, written straight into etcd 128 per txn), each read after 1s idle without forcing a GC in the regnode; etcd: this process's RSS growth over the same writes (after GC)", N, catalogSize)
	r.note("cold start: exec of rn3 → SERVING health, and → a Subscribe of every service through it (5–20ms retry and reconnect backoff, not grpc's 1s) holding all %d instances; snapshot_after_serving is the second minus the first; etcd_get_decode: a paginated Get (1000 a page, one revision) of the whole prefix, decoding every record", total)
	r.note("subscribers: %d SDK clients in %d processes, each client.New of all three regnodes, client i listing them from the (i mod 3)-th (it connects one regnode of its list at random, another only if that one is not ready within 250ms, keeping the first ready), subscribing to %q (%d instances); rss_per_subscriber: the three regnodes' VmRSS growth / S (each client holds one connection, to the regnode its stream is on: client/pick.go); etcd: %d clientv3 clients with one watcher each in one process, this process's RSS growth / S", S, P, scaleWatched, watchedBase, S)
	r.note("propagation: %d changes, Register then Deregister of one instance through rn1's API (ours) or Put then Delete of the same records straight into etcd (baseline), each written once every subscriber has the one before and at most %.0f a second (changes_per_s: what each side reached), from the call's return to the moment the slowest subscriber of every process had the revision (each process polls its subscribers every 1ms)", cfg.scaleChanges, cfg.scaleRate)
	r.note("rolling restart: every instance of a service of M registered through the three regnodes (raw API, 30min leases) is deregistered and registered again, %d at a time; every subscriber subscribes to the service first; counted over all subscribers from their views' callbacks (changes, instance events, snapshots) and their Subscribe streams' gRPC wire bytes; resets_sent: the regnodes' registry_resets_sent_total over the roll; call_ms: each Deregister and Register call; cpu_s: CPU seconds over the roll until every subscriber had it (/proc/PID/stat, getrusage), of this process (etcd, writer: cpu_s_etcd), the three regnodes (cpu_s_server) and the subscriber processes; *_cpu_us_per_delivery: that over S × changes written. Baseline etcd: the same Deletes and Puts straight into etcd, in the same waves, of records in the service the S raw watchers follow; its server is this process (etcd and the writer)", cfg.scaleWave)
	r.note("kill: SIGKILL of rn3, then one Register through rn1 at revision R; moved_and_converged: kill → the moment each subscriber whose Subscribe stream was on rn3 has a stream on another regnode (its gRPC OutHeader's remote address) and its view at R or past (polled every 1ms in its process); revision_regressions: callbacks whose revision was below one already seen, over every subscription of the run; streams_by_regnode_before: the regnode each client's Subscribe stream was on just before the kill (subscribers_by_regnode: the regnodes' registry_subscribers gauges right after subscribing)")
	return r, nil
}

// scaleRollBaseline: the rolling restarts of ours, as raw etcd Deletes and
// Puts of the same records in waves, followed by the S raw watchers of
// proc (the instances added to the service they watch).
func scaleRollBaseline(ctx context.Context, e *env, r *Result, cli *clientv3.Client, proc *subscriberProc) error {
	cfg := e.cfg
	dkeys := record.NewKeys(directPrefix)
	var (
		callMu sync.Mutex
		calls  []time.Duration
	)
	timed := func(f func() (int64, error)) (int64, error) {
		t := time.Now()
		rev, err := f()
		callMu.Lock()
		calls = append(calls, time.Since(t))
		callMu.Unlock()
		return rev, err
	}
	for _, M := range cfg.scaleRoll {
		rc := fmt.Sprintf("roll M=%d", M)
		e.progress.set("baseline %s: etcd Delete and Put in waves of %d", rc, cfg.scaleWave)
		key := func(k int) string { return dkeys.Instance(scaleWatched, fmt.Sprintf("r%d-%d", M, k)) }
		put := func(k int) (int64, error) {
			in := instanceN(scaleWatched, k)
			in.Id = fmt.Sprintf("r%d-%d", M, k)
			v, err := record.Encode(in)
			if err != nil {
				return 0, err
			}
			resp, err := cli.Put(ctx, key(k), string(v))
			if err != nil {
				return 0, err
			}
			return resp.Header.Revision, nil
		}
		if _, err := inWaves(M, cfg.scaleWave, put); err != nil {
			return err
		}
		child0, err := proc.cpu()
		if err != nil {
			return err
		}
		cpu0 := cpuTime()
		calls = calls[:0]
		t0 := time.Now()
		last, err := inWaves(M, cfg.scaleWave, func(k int) (int64, error) {
			if _, err := timed(func() (int64, error) {
				resp, err := cli.Delete(ctx, key(k))
				if err != nil {
					return 0, err
				}
				return resp.Header.Revision, nil
			}); err != nil {
				return 0, err
			}
			return timed(func() (int64, error) { return put(k) })
		})
		if err != nil {
			return err
		}
		rolled := time.Since(t0)
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = waitFor(wctx, 50*time.Millisecond, func() bool {
			o, err2 := proc.sightings()
			if err2 != nil {
				err = err2
				return true
			}
			return o.reached(last)
		})
		cancel()
		if err != nil {
			return fmt.Errorf("%s: not every etcd watcher reached revision %d: %w", rc, last, err)
		}
		delivered := time.Since(t0)
		cpu1 := cpuTime()
		child1, err := proc.cpu()
		if err != nil {
			return err
		}
		deliveries := float64(cfg.scaleS) * float64(2*M)
		r.base("etcd", rc, "roll_ms", ms(rolled))
		r.base("etcd", rc, "all_delivered_ms", ms(delivered))
		r.base("etcd", rc, "call_ms", summarize(calls))
		r.base("etcd", rc, "cpu_s_server", round3((cpu1 - cpu0).Seconds()))
		r.base("etcd", rc, "cpu_s_subscribers", round3((child1 - child0).Seconds()))
		r.base("etcd", rc, "server_cpu_us_per_delivery", round3(float64(cpu1-cpu0)/1e3/deliveries))
		r.base("etcd", rc, "subscriber_cpu_us_per_delivery", round3(float64(child1-child0)/1e3/deliveries))
	}
	return nil
}

// cpuOf is the CPU time so far of this process (etcd, the writer), of
// the regnodes still running and of the subscriber processes.
func cpuOf(nodes []*regnodeProc, procs []*scaleProc) map[string]time.Duration {
	out := map[string]time.Duration{"etcd": cpuTime()}
	for _, p := range nodes {
		select {
		case <-p.done:
		default:
			out["server"] += procCPU(p.cmd.Process.Pid)
		}
	}
	for _, p := range procs {
		out["subscribers"] += procCPU(p.cmd.Process.Pid)
	}
	return out
}

// scalePropagate writes cfg.scaleChanges changes with write(i), each
// once every observer obs() returns has seen the one before and at most
// cfg.scaleRate a second, and returns, per change, commit → the last
// observer's sighting, and the changes written per second.
//
// Closed loop, because an open one measures the writer: past what S
// subscribers can take, latency is the queue that builds, and the queue
// is set by how fast each side's writes come back (raw etcd's Puts, slowed
// by the watchers in its own process, wrote half the changes a second our
// Registers did in one run, so it queued half as much). One change at a
// time, each side is asked the same: bring this change to everyone.
func scalePropagate(ctx context.Context, e *env, side string, write func(i int) (commit, error), obs func() ([]*observer, error)) (Lat, float64, error) {
	cfg := e.cfg
	tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.scaleRate))
	defer tick.Stop()
	var (
		commits []commit
		seen    []*observer
		err     error
	)
	allSaw := func(key int64) error {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if werr := waitFor(wctx, 5*time.Millisecond, func() bool {
			seen, err = obs()
			if err != nil {
				return true
			}
			for _, o := range seen {
				if !o.reached(key) {
					return false
				}
			}
			return true
		}); werr != nil {
			return fmt.Errorf("%s: not every subscriber reached revision %d: %w", side, key, werr)
		}
		return err
	}
	t0 := time.Now()
	for i := range cfg.scaleChanges {
		select {
		case <-ctx.Done():
			return Lat{}, 0, ctx.Err()
		case <-tick.C:
		}
		var c commit
		labeled(sideWriter, func() { c, err = write(i) })
		if err != nil {
			return Lat{}, 0, err
		}
		commits = append(commits, c)
		if i%10 == 0 {
			e.progress.set("propagation, %s: %d/%d changes", side, i, cfg.scaleChanges)
		}
		if err := allSaw(c.key); err != nil {
			return Lat{}, 0, err
		}
	}
	rate := float64(len(commits)) / time.Since(t0).Seconds()
	ds := make([]time.Duration, len(commits))
	for _, o := range seen {
		per, _, missed := latencies(commits, []*observer{o})
		if missed > 0 {
			return Lat{}, 0, fmt.Errorf("%s: %d changes never seen", side, missed)
		}
		for i, d := range per {
			ds[i] = max(ds[i], d)
		}
	}
	return summarize(ds), round3(rate), nil
}

// retried runs call until it succeeds, fails for a reason other than
// a regnode too loaded to answer in time (DeadlineExceeded: its call
// timeout; Unavailable), or has failed five times; retries counts the
// attempts after the first, and call is told whether it is one. Attempts
// are 250ms, 500ms, 1s and 2s apart, as a restarting instance's SDK
// backs off: sent again at once, a retry finds the same overload.
func retried(ctx context.Context, retries *atomic.Int64, call func(retry bool) error) error {
	for attempt := 1; ; attempt++ {
		err := call(attempt > 1)
		if err == nil || attempt == 5 || ctx.Err() != nil {
			return err
		}
		if c := status.Code(err); c != codes.DeadlineExceeded && c != codes.Unavailable {
			return err
		}
		retries.Add(1)
		if sleep(ctx, 250*time.Millisecond<<(attempt-1)); ctx.Err() != nil {
			return err
		}
	}
}

// inWaves runs f(0..n-1), wave at a time, and returns the largest
// revision f returned.
func inWaves(n, wave int, f func(k int) (int64, error)) (int64, error) {
	var last atomic.Int64
	for from := 0; from < n; from += wave {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs error
		)
		for k := from; k < min(from+wave, n); k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rev, err := f(k)
				if err != nil {
					mu.Lock()
					errs = errors.Join(errs, err)
					mu.Unlock()
					return
				}
				for {
					cur := last.Load()
					if rev <= cur || last.CompareAndSwap(cur, rev) {
						break
					}
				}
			}()
		}
		wg.Wait()
		if errs != nil {
			return 0, errs
		}
	}
	return last.Load(), nil
}

// putInstance writes one instance record straight into etcd.
func putInstance(ctx context.Context, cli *clientv3.Client, keys record.Keys, service, id string) error {
	in := instanceN(service, 0)
	in.Id = id
	v, err := record.Encode(in)
	if err != nil {
		return err
	}
	_, err = cli.Put(ctx, keys.Instance(service, id), string(v))
	return err
}

// populateCatalog writes N instances straight into etcd, in services of
// catalogSize, 128 per transaction, from 4 writers.
func populateCatalog(ctx context.Context, e *env, cli *clientv3.Client, keys record.Keys, N int) error {
	const batch, writers = 128, 4
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		done  atomic.Int64
	)
	fail := func(err error) {
		mu.Lock()
		first = errors.Join(first, err)
		mu.Unlock()
	}
	for range writers {
		wg.Add(1)
		labeled(sideWriter, func() {
			go func() {
				defer wg.Done()
				for {
					from := int(next.Add(batch)) - batch
					if from >= N || ctx.Err() != nil {
						return
					}
					ops := make([]clientv3.Op, 0, batch)
					for k := from; k < min(from+batch, N); k++ {
						service := fmt.Sprintf("cat-%05d", k/catalogSize)
						in := instanceN(service, k)
						v, err := record.Encode(in)
						if err != nil {
							fail(err)
							return
						}
						ops = append(ops, clientv3.OpPut(keys.Instance(service, in.Id), string(v)))
					}
					if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
						fail(err)
						return
					}
					e.progress.set("writing %d instances into etcd: %d", N, done.Add(int64(len(ops))))
				}
			}()
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}
