package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// runRegister: registrations per second through the SDK's connection and
// regnode's Register (which validates, takes a lease from its pool and
// puts the record with a compare-and-swap, group-committed) against raw etcd lease grant + put of the same
// record from a client of the same etcd, at the same concurrency. etcd
// fsyncs (the one scenario where it matters: every registration is a
// write). The two sides alternate in rounds so noise hits both.
func runRegister(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	r := newResult("register", "registrations/s, API Register (SDK conn → regnode → etcd) vs raw etcd Grant+Put, same concurrency, same etcd with fsync on, alternating rounds")
	r.param("concurrency", cfg.regConc)
	r.param("ops_c1", cfg.regOps1)
	r.param("ops_cN", cfg.regOpsN)
	r.param("rounds", cfg.regRounds)
	r.param("fsync", true)
	// Leases outlive the run: with a TTL shorter than the run, etcd revokes
	// one side's expired leases during the other side's later rounds (a
	// raft proposal each), and the slower side's rounds take more of them.
	const ttl = 3600
	r.param("lease_ttl_s", ttl)
	const base, grantOnly = "etcd_grant_put", "etcd_grant_only"

	e.progress.set("starting etcd (fsync on) and a regnode")
	etcd, err := startEtcd(ctx, e, true)
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
	raw, err := etcdClient(sideWriter, etcd.URL, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { raw.Close() })

	api := c.API()
	keys := record.NewKeys("")
	var seq atomic.Int64
	ours := func(ctx context.Context) error {
		id := fmt.Sprint("o-", seq.Add(1))
		_, err := api.Register(ctx, &registryv1.RegisterRequest{
			Instance: &registryv1.Instance{Service: "bench", Id: id, Address: "10.0.0.1:80"},
			Ttl:      durationpb.New(ttl * time.Second)})
		return err
	}
	direct := func(ctx context.Context) error {
		in := &registryv1.Instance{Service: "bench", Id: fmt.Sprint("r-", seq.Add(1)), Address: "10.0.0.1:80",
			Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING}
		g, err := raw.Grant(ctx, ttl)
		if err != nil {
			return err
		}
		in.LeaseId = int64(g.ID)
		val, err := record.Encode(in)
		if err != nil {
			return err
		}
		_, err = raw.Put(ctx, keys.Instance(in.Service, in.Id), string(val), clientv3.WithLease(g.ID))
		return err
	}

	const batched, txnOf = "etcd_put_in_txn_of_64", 64
	var bseq atomic.Int64
	batchedPut := func(ctx context.Context) error {
		ops := make([]clientv3.Op, 0, txnOf)
		for range txnOf {
			in := &registryv1.Instance{Service: "bench", Id: fmt.Sprint("b-", bseq.Add(1)), Address: "10.0.0.1:80",
				Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING}
			val, err := record.Encode(in)
			if err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(keys.Instance(in.Service, in.Id), string(val)))
		}
		_, err := raw.Txn(ctx).Then(ops...).Commit()
		return err
	}
	grant := func(ctx context.Context) error {
		_, err := raw.Grant(ctx, ttl)
		return err
	}

	for _, conc := range cfg.regConc {
		cs := fmt.Sprintf("c=%d", conc)
		ops := cfg.regOpsN
		if conc == 1 {
			ops = cfg.regOps1
		}
		rounds := max(1, cfg.regRounds)
		per := max(ops/rounds, conc)
		// Warm both paths (connections, leases, etcd's backend).
		e.progress.set("%s warming up", cs)
		if _, _, err := runN(ctx, min(64, per), conc, ours, nil); err != nil {
			return r, fmt.Errorf("ours: %w", err)
		}
		if _, _, err := runN(ctx, min(64, per), conc, direct, nil); err != nil {
			return r, fmt.Errorf("raw: %w", err)
		}
		// Three sides take turns each round, in a rotating order so noise
		// hits all: ours, raw Grant+Put, and Grant alone. The last is half
		// the floor of any registration that gives each instance its own
		// lease (the batched put below is the other half).
		type side struct {
			name string
			f    func(context.Context) error
			t    time.Duration
			cpu  time.Duration
			lats []time.Duration
			perS []float64
		}
		sides := []*side{{name: "ours", f: ours}, {name: base, f: direct}, {name: grantOnly, f: grant}}
		var done atomic.Int64
		total := int64(per * rounds * len(sides))
		for round := range rounds {
			for i := range sides {
				sd := sides[(round+i)%len(sides)]
				cpu0 := cpuTime()
				d, lats, err := runN(ctx, per, conc, sd.f, func() {
					if done.Add(1)%50 == 0 {
						e.progress.set("%s %d/%d registrations", cs, done.Load(), total)
					}
				})
				if err != nil {
					return r, fmt.Errorf("%s: %w", sd.name, err)
				}
				sd.cpu += cpuTime() - cpu0
				sd.t += d
				sd.lats = append(sd.lats, lats...)
				sd.perS = append(sd.perS, float64(per)/d.Seconds())
			}
		}
		tot := float64(per * rounds)
		for _, sd := range sides {
			put := func(metric string, v any) {
				if sd.name == "ours" {
					r.ours(cs, metric, v)
				} else {
					r.base(sd.name, cs, metric, v)
				}
			}
			put("per_sec", round3(tot/sd.t.Seconds()))
			put("latency_ms", summarize(sd.lats))
			put("ops", int(tot))
			// The whole process's CPU (etcd, regnode, the clients) per
			// operation while that side ran: on a CPU-bound machine, each
			// side's rate is about the cores it gets / this.
			put("process_cpu_us_per_op", round3(float64(sd.cpu.Microseconds())/tot))
			put("round_min_per_sec", round3(minOf(sd.perS)))
		}
		o, b := tot/sides[0].t.Seconds(), tot/sides[1].t.Seconds()
		// The other half of the floor: the record's put, group-committed
		// as well as etcd can take it (Txns of 64 puts, no regnode work
		// but its watch of the prefix). Grant alone plus this is the
		// least CPU any registration under its own lease costs here.
		e.progress.set("%s: etcd puts in Txns of %d", cs, txnOf)
		txns := max(1, int(tot)/txnOf)
		cpu0 := cpuTime()
		d, _, err := runN(ctx, txns, max(1, conc/txnOf), batchedPut, nil)
		if err != nil {
			return r, fmt.Errorf("%s: %w", batched, err)
		}
		puts := float64(txns * txnOf)
		putCPU := float64((cpuTime() - cpu0).Microseconds()) / puts
		r.base(batched, cs, "per_sec", round3(puts/d.Seconds()))
		r.base(batched, cs, "process_cpu_us_per_op", round3(putCPU))
		grantCPU := float64(sides[2].cpu.Microseconds()) / tot
		floor := grantCPU + putCPU
		rawCPU := float64(sides[1].cpu.Microseconds()) / tot
		r.note("%s: CPU floor of a registration under its own lease: Grant alone %.0f µs + a put in a Txn of %d %.0f µs = %.0f µs, against raw Grant+Put's %.0f µs: on this CPU-bound machine such a registration can be at most %.2f× raw (the goal is 2)",
			cs, grantCPU, txnOf, putCPU, floor, rawCPU, rawCPU/floor)
		r.ours(cs, "ceiling_vs_raw", round3(rawCPU/floor))
		r.target(fmt.Sprintf("%s ours/raw registrations per second", cs), ">= 2 (goal)",
			fmt.Sprintf("%.3f (%.0f/s vs %.0f/s)", o/b, o, b), o/b >= 2)
		r.target(fmt.Sprintf("%s ours/raw, no regression", cs), ">= 0.80",
			fmt.Sprintf("%.3f", o/b), o/b >= 0.8)
	}
	r.skipRatio("ops")
	r.note("ours = registry.v1 Register over the SDK client's gRPC connection (client.New → API()); client.Register adds a lease keeper on top of exactly this call")
	r.note("raw makes two etcd calls per registration (Grant, then a blind Put); ours takes a lease granted ahead from regnode's pool (renewed at handover on one LeaseKeepAlive stream) and puts the record and its saved state with their compares as one member of a group-committed Txn; ours adds the gRPC hop SDK → regnode and regnode's validation")
	return r, nil
}

func minOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	m := xs[0]
	for _, x := range xs[1:] {
		m = min(m, x)
	}
	return m
}

// runN performs n calls of f on conc goroutines and returns the elapsed
// time and every call's latency; tick, if set, is called after each call.
func runN(ctx context.Context, n, conc int, f func(context.Context) error, tick func()) (time.Duration, []time.Duration, error) {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first atomic.Value
		mu    sync.Mutex
		lats  = make([]time.Duration, 0, n)
	)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, n/conc+1)
			defer func() {
				mu.Lock()
				lats = append(lats, local...)
				mu.Unlock()
			}()
			for next.Add(1) <= int64(n) {
				if ctx.Err() != nil {
					first.CompareAndSwap(nil, ctx.Err())
					return
				}
				t := time.Now()
				if err := f(ctx); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
				local = append(local, time.Since(t))
				if tick != nil {
					tick()
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if err, ok := first.Load().(error); ok {
		return d, nil, err
	}
	return d, lats, nil
}
