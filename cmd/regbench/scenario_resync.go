package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/client"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// runResync: N instances written straight into etcd. Measured: a
// subscriber starting cold, and one whose regnode must relist after its
// etcd watch hit a compaction (a reset snapshot of everything), each until
// its cache is complete, against a raw paginated etcd Get of the prefix.
func runResync(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	N := cfg.resyncN
	r := newResult("resync", fmt.Sprintf("%d instances in etcd: time to a complete cache for a cold subscriber and for one reset after compaction, vs a raw paginated etcd Get of the prefix", N))
	r.param("instances", N)
	r.param("repeats", cfg.resyncRepeats)
	r.param("page_size", 1000)
	cs := fmt.Sprintf("N=%d", N)
	const (
		baseGet    = "etcd_get"
		baseDecode = "etcd_get_decode"
	)
	service := "big"
	keys := record.NewKeys("")
	prefix := keys.Service(service)

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
	if err := populate(ctx, e, cli, keys, service, N); err != nil {
		return r, err
	}

	// The regnode reaches etcd through a proxy, to be cut off later.
	px, err := newProxy(etcd.URL[len("http://"):])
	if err != nil {
		return r, err
	}
	e.onClose(px.Cut)
	e.progress.set("regnode cold start on %d instances", N)
	t0 := time.Now()
	n, err := startNode(ctx, e, []string{px.URL()}, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { n.Close() })
	if err := waitChan(ctx, n.Hub().Ready()); err != nil {
		return r, err
	}
	coldStart := time.Since(t0)
	c, err := regClient(e, n.Addr())
	if err != nil {
		return r, err
	}
	e.onClose(func() { c.Close() })

	var rawT, decT, coldT []time.Duration
	for rep := range cfg.resyncRepeats {
		steps := []func() error{
			func() error {
				d, got, err := rawList(ctx, cli, prefix, nil)
				if err == nil && got != N {
					err = fmt.Errorf("raw Get read %d instances, want %d", got, N)
				}
				rawT = append(rawT, d)
				return err
			},
			func() error {
				d, got, err := rawList(ctx, cli, prefix, &keys)
				if err == nil && got != N {
					err = fmt.Errorf("raw Get+decode read %d instances, want %d", got, N)
				}
				decT = append(decT, d)
				return err
			},
			func() error {
				t := time.Now()
				var s *client.Subscription
				var err error
				labeled(sideClient, func() { s, err = c.Subscribe(ctx, service, client.SubscribeOptions{}) })
				if err != nil {
					return err
				}
				defer s.Close()
				if err := s.WaitReady(ctx); err != nil {
					return err
				}
				d := time.Since(t)
				if got := len(s.Instances(service)); got != N {
					return fmt.Errorf("cold subscriber has %d instances, want %d", got, N)
				}
				coldT = append(coldT, d)
				return nil
			},
		}
		if rep%2 == 1 { // alternate the order
			steps[0], steps[2] = steps[2], steps[0]
		}
		for _, f := range steps {
			e.progress.set("repeat %d/%d: raw Get, Get+decode, cold subscriber", rep+1, cfg.resyncRepeats)
			if err := f(); err != nil {
				return r, err
			}
		}
	}

	// Reset after compaction: a subscriber is complete; the regnode's link
	// to etcd is cut, the registry churns and etcd compacts, the link
	// heals: the regnode's watch resumes at a compacted revision, it
	// relists, and every subscriber's view moves to the relist's revision
	// (by the differences, or by a reset snapshot). Done is the first
	// change at the revision the churn ended at, or later, that the
	// subscriber's view holds.
	var (
		target     atomic.Int64 // the revision the churn ended at (0: none yet)
		doneAt     atomic.Int64 // unix nanos of the first change at target or later
		snapshots  atomic.Int64 // reset snapshots the subscriber got
		resetCount atomic.Int64 // changes at target or later
	)
	var s *client.Subscription
	labeled(sideClient, func() {
		s, err = c.Subscribe(ctx, service, client.SubscribeOptions{OnChange: func(ch client.Change) {
			if ch.Snapshot && ch.Reset {
				snapshots.Add(1)
			}
			if t := target.Load(); t > 0 && !ch.Progress && ch.Revision >= t && doneAt.Load() == 0 {
				doneAt.Store(time.Now().UnixNano())
				resetCount.Add(1)
			}
		}})
	})
	if err != nil {
		return r, err
	}
	e.onClose(s.Close)
	if err := s.WaitReady(ctx); err != nil {
		return r, err
	}
	relists := n.Metrics().WatchRestarts.WithLabelValues("relist")
	var resetT, fromHeal, backoffT, listT, besideT []time.Duration
	for rep := range cfg.resyncRepeats {
		e.progress.set("reset %d/%d: cut, churn, compact, heal", rep+1, cfg.resyncRepeats)
		before, count0 := counterValue(relists), resetCount.Load()
		target.Store(0)
		doneAt.Store(0)
		px.Cut()
		for i := range 100 {
			in := instanceN(service, (rep*100+i)%N)
			in.Version = fmt.Sprintf("churn-%d", rep)
			v, err := record.Encode(in)
			if err != nil {
				return r, err
			}
			if _, err := cli.Put(ctx, keys.Instance(service, in.Id), string(v)); err != nil {
				return r, err
			}
		}
		resp, err := cli.Get(ctx, "compact-probe")
		if err != nil {
			return r, err
		}
		if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			return r, err
		}
		target.Store(resp.Header.Revision)
		if err := px.Heal(); err != nil {
			return r, err
		}
		healAt := time.Now()
		var relistAt, listAt time.Time
		var ranges float64
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = waitFor(wctx, time.Millisecond, func() bool {
			switch {
			case relistAt.IsZero():
				if counterValue(relists) > before {
					relistAt, ranges = time.Now(), etcdRanges()
				}
			case listAt.IsZero():
				// The first range etcd serves after that is the relist's
				// first page (nothing else reads during the wait).
				if etcdRanges() > ranges {
					listAt = time.Now()
				}
			}
			return resetCount.Load() > count0
		})
		cancel()
		if err != nil {
			return r, fmt.Errorf("reset %d: no reset snapshot within 30s: %w", rep+1, err)
		}
		done := time.Unix(0, doneAt.Load())
		if got := len(s.Instances(service)); got != N {
			return r, fmt.Errorf("reset subscriber has %d instances, want %d", got, N)
		}
		for i := range 100 {
			id := instanceN(service, (rep*100+i)%N).Id
			if in, ok := s.Snapshot().Get(service, id); !ok || in.Version != fmt.Sprintf("churn-%d", rep) {
				return r, fmt.Errorf("reset %d: subscriber's %s is %v, want version churn-%d", rep+1, id, in, rep)
			}
		}
		if relistAt.IsZero() || relistAt.After(done) {
			relistAt = done // polled too late to see it
		}
		resetT = append(resetT, done.Sub(relistAt))
		if !listAt.IsZero() && !listAt.After(done) {
			backoffT = append(backoffT, listAt.Sub(relistAt))
			listT = append(listT, done.Sub(listAt))
		}
		fromHeal = append(fromHeal, done.Sub(healAt))
		// The baseline again, right beside: a raw list of the same etcd now.
		d, got, err := rawList(ctx, cli, prefix, nil)
		if err == nil && got != N {
			err = fmt.Errorf("raw Get read %d instances, want %d", got, N)
		}
		if err != nil {
			return r, err
		}
		besideT = append(besideT, d)
	}

	raw := summarize(rawT)
	dec := summarize(decT)
	r.ours(cs, "cold_subscriber_ms", summarize(coldT))
	r.ours(cs, "reset_subscriber_ms", summarize(resetT))
	r.ours(cs, "reset_snapshots", snapshots.Load())
	r.ours(cs, "reset_after_backoff_ms", summarize(listT))
	r.ours(cs, "reset_backoff_ms", summarize(backoffT))
	r.ours(cs, "reset_from_heal_ms", summarize(fromHeal))
	r.ours(cs, "regnode_cold_start_ms", Lat{P50: ms(coldStart), P99: ms(coldStart), Max: ms(coldStart), N: 1})
	for _, b := range []struct {
		name string
		l    Lat
	}{{baseGet, raw}, {baseDecode, dec}} {
		r.base(b.name, cs, "cold_subscriber_ms", b.l)
		r.base(b.name, cs, "reset_subscriber_ms", b.l)
		r.base(b.name, cs, "reset_after_backoff_ms", b.l)
		r.base(b.name, cs, "regnode_cold_start_ms", b.l)
	}
	cold, reset := summarize(coldT), summarize(resetT)
	r.target("cold subscriber / raw paginated Get (medians)", "<= 2.0",
		fmt.Sprintf("%.2f (%.0fms vs %.0fms)", cold.P50/raw.P50, cold.P50, raw.P50), cold.P50 <= 2*raw.P50)
	beside := summarize(besideT)
	r.base("etcd_get_beside_reset", cs, "reset_subscriber_ms", beside)
	r.target("subscriber reset after compaction / raw paginated Get right after each reset (medians)", "<= 1.2",
		fmt.Sprintf("%.2f (%.0fms vs %.0fms)", reset.P50/beside.P50, reset.P50, beside.P50), reset.P50 <= 1.2*beside.P50)
	r.note("raw: clientv3 Get of the prefix in pages of 1000, every page at the first page's revision (what regnode's list does), without decoding (etcd_get) and decoding each record into a map (etcd_get_decode); the baseline rows repeat the same figures for each of ours; etcd_get_beside_reset is the same raw Get run right after each reset, on the etcd as the reset left it (compacted), which the reset target divides by")
	r.note("cold subscriber: Subscribe → WaitReady (the regnode already follows etcd; its snapshot goes out in chunks of 500) with the count checked; regnode cold start: node.Start → its cache filled (list of the prefix)")
	r.note("reset: from the moment the regnode's watch saw the compaction (its registry_etcd_watch_restarts_total{reason=relist} moved, polled every 1ms) to the subscriber's view holding the churn at the relist's revision: the relist (at once, no backoff), the hub's cache apply, what it sends every subscriber (the differences, since the relist is of the same etcd history) and the client's apply; reset_snapshots counts the full reset snapshots the subscriber got instead (0 unless the relist changed epoch). reset_backoff: compaction seen → etcd starts serving the relist's first page (grpc_server_started_total{grpc_method=Range} moved); reset_after_backoff: from there to the subscriber's view; reset_from_heal adds gRPC's reconnect backoff")
	return r, nil
}

func counterValue(c interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

func instanceN(service string, k int) *registryv1.Instance {
	return &registryv1.Instance{Service: service, Id: fmt.Sprintf("i%06d", k),
		Address:   fmt.Sprintf("10.%d.%d.%d:8080", k/65536%256, k/256%256, k%256),
		Zone:      fmt.Sprintf("z%d", k%3),
		Version:   "1.0.0",
		Weight:    100,
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
		Health:    &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY, Since: timestamppb.New(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))},
	}
}

// populate writes N instances straight into etcd, 128 per transaction,
// from 4 writers.
func populate(ctx context.Context, e *env, cli *clientv3.Client, keys record.Keys, service string, N int) error {
	const batch, writers = 128, 4
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		done  atomic.Int64
	)
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
						in := instanceN(service, k)
						v, err := record.Encode(in)
						if err != nil {
							mu.Lock()
							first = errors.Join(first, err)
							mu.Unlock()
							return
						}
						ops = append(ops, clientv3.OpPut(keys.Instance(service, in.Id), string(v)))
					}
					if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
						mu.Lock()
						first = errors.Join(first, err)
						mu.Unlock()
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

// rawList reads the prefix in pages of 1000 at one revision; with keys it
// also decodes every record into a map. It returns the time and count.
func rawList(ctx context.Context, cli *clientv3.Client, prefix string, keys *record.Keys) (time.Duration, int, error) {
	t := time.Now()
	var (
		rev   int64
		count int
		from  = prefix
		end   = clientv3.GetPrefixRangeEnd(prefix)
		view  map[string]*registryv1.Instance
	)
	if keys != nil {
		view = map[string]*registryv1.Instance{}
	}
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(1000)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, from, opts...)
		if err != nil {
			return 0, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if keys != nil {
				in, err := keys.Decode(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision)
				if err != nil {
					continue
				}
				view[in.Id] = in
			}
			count++
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return time.Since(t), count, nil
}
