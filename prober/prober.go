// Package prober health-checks every instance that has a check, while its
// regnode leads the prober election, and writes health transitions (only
// transitions) through the leader's fence. Probes are spread over the
// interval with jitter, run with bounded concurrency, and never run closer
// than a floor interval for one instance. On taking over, the prober starts
// from the health stored in etcd, not from HEALTHY. An instance registered
// (or registered anew) is probed at once, so it becomes routable as soon as
// it answers; on taking over, instances already probed are spread over
// their interval.
//
// The leader also deletes the saved states (store.StateKey) of instances
// that have had no record for a retention period: what a crashed instance
// that never came back leaves behind.
package prober

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/probe"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// Config configures a Prober. Zero fields take the defaults on each.
type Config struct {
	// Store is where transitions are written (required).
	Store *store.Store
	// View returns the current instances (required): the regnode's cache.
	View func() *cache.Snapshot
	// Probe runs the probes (required).
	Probe *probe.Prober
	// Thresholds are the global defaults; an instance's check overrides
	// them field by field (default health.DefaultThresholds()).
	Thresholds health.Thresholds
	// Interval between probes of one instance when its check does not say
	// (default 1s).
	Interval time.Duration
	// Floor: probes of one instance never start closer than this (default
	// 100ms), whatever the check says.
	Floor time.Duration
	// Concurrency bounds probes in flight (default 64).
	Concurrency int
	// OrphanRetention is how long this leader must see a saved state
	// without its record, continuously, before deleting it (default 1h;
	// negative: never). A lost lease is re-registered within seconds, so
	// the retention only bounds how long a dead instance's state lingers.
	OrphanRetention time.Duration
	// Node is this regnode's name, written as the observer.
	Node string
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Hooks for metrics; any may be nil.
	OnProbe      func(outcome health.Outcome, latency time.Duration)
	OnTransition func(tr health.Transition)
	OnFenced     func()
}

// Prober is the health checker. Lead may run many times, never twice at
// once.
type Prober struct {
	cfg Config
	log *slog.Logger
}

// New returns a Prober; it fails on a missing dependency or bad settings.
func New(cfg Config) (*Prober, error) {
	if cfg.Store == nil || cfg.View == nil || cfg.Probe == nil {
		return nil, errors.New("prober: Config.Store, View and Probe are required")
	}
	if cfg.Thresholds == (health.Thresholds{}) {
		cfg.Thresholds = health.DefaultThresholds()
	}
	if err := cfg.Thresholds.Validate(); err != nil {
		return nil, fmt.Errorf("prober thresholds: %w", err)
	}
	if cfg.Floor <= 0 {
		cfg.Floor = 100 * time.Millisecond
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Interval < cfg.Floor {
		return nil, fmt.Errorf("prober: interval %s is below the floor %s", cfg.Interval, cfg.Floor)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.OrphanRetention == 0 {
		cfg.OrphanRetention = time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Prober{cfg: cfg, log: cfg.Logger.With("component", "prober")}, nil
}

// tracked is one instance being probed; owned by Lead's goroutine.
type tracked struct {
	inst      *registryv1.Instance
	machine   health.Machine
	slow      time.Duration
	interval  time.Duration
	nextAt    time.Time
	lastStart time.Time
	inflight  bool
	gone      bool // no longer followed; dropped from the queue lazily
}

type result struct {
	t    *tracked
	inst *registryv1.Instance // the record probed (its create revision)
	res  health.Result
}

// queue orders tracked instances by when their next probe is due.
type queue []*tracked

func (q queue) Len() int           { return len(q) }
func (q queue) Less(i, j int) bool { return q[i].nextAt.Before(q[j].nextAt) }
func (q queue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)        { *q = append(*q, x.(*tracked)) }
func (q *queue) Pop() any {
	old := *q
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return t
}

// Lead probes until ctx ends or a fenced write fails (ErrFenced).
func (p *Prober) Lead(ctx context.Context, l *election.Leadership) error {
	// Start from what etcd holds now (a linearizable read), not from the
	// cache, which may lag behind the previous leader's last writes.
	insts, _, _, err := p.cfg.Store.List(ctx, "")
	if err != nil {
		return fmt.Errorf("read stored health: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	now := time.Now()
	all := map[cache.Key]*tracked{}
	due := &queue{}
	for _, in := range insts {
		// Spread the instances already probed over their interval, so a
		// takeover does not probe everything at once; one never probed
		// waits for its first probe to be routable: at once.
		p.track(all, due, in, now, in.GetHealth().GetState() == registryv1.HealthState_HEALTH_STATE_UNKNOWN)
	}
	if p.cfg.OrphanRetention > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.sweep(ctx, l)
		}()
	}
	p.log.Info("probing", "instances", len(all), "fence", l.Rev)
	results := make(chan result, p.cfg.Concurrency)
	inflight := 0
	// Probes start when due (a timer on the earliest) or as soon as a slot
	// frees: no tick quantizes the interval or caps the rate.
	timer := time.NewTimer(0)
	defer timer.Stop()
	views := time.NewTicker(50 * time.Millisecond)
	defer views.Stop()
	var seen int64 = -1
	launch := func(now time.Time) {
		for due.Len() > 0 && inflight < p.cfg.Concurrency {
			t := (*due)[0]
			if t.nextAt.After(now) {
				break
			}
			heap.Pop(due)
			if t.gone {
				continue
			}
			inflight++
			t.inflight, t.lastStart = true, now
			wg.Add(1)
			go func(t *tracked, inst *registryv1.Instance) {
				defer wg.Done()
				res := p.cfg.Probe.Probe(ctx, inst.Address, inst.Check, t.slow)
				select {
				case results <- result{t: t, inst: inst, res: res}:
				case <-ctx.Done():
				}
			}(t, t.inst)
		}
		if due.Len() > 0 && inflight < p.cfg.Concurrency {
			timer.Reset(max(0, time.Until((*due)[0].nextAt)))
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-timer.C:
			launch(now)
		case now := <-views.C:
			if snap := p.cfg.View(); snap.Revision() != seen {
				seen = snap.Revision()
				p.sync(all, due, snap, now)
				launch(now)
			}
		case r := <-results:
			inflight--
			t := r.t
			if !t.gone {
				t.inflight = false
				// The next probe: one interval after this one started,
				// jittered, never closer than the floor.
				t.nextAt = t.lastStart.Add(max(jitter(t.interval), p.cfg.Floor))
				heap.Push(due, t)
			}
			launch(time.Now())
			if t.gone || t.inst.CreateRevision != r.inst.CreateRevision {
				continue // gone, or registered anew while probed
			}
			if p.cfg.OnProbe != nil {
				p.cfg.OnProbe(r.res.Outcome, r.res.Latency)
			}
			tr, changed := t.machine.Observe(r.res)
			if !changed {
				continue
			}
			key := cache.Key{Service: t.inst.Service, ID: t.inst.Id}
			if err := p.write(ctx, l, key, t, tr, r.res); err != nil {
				if errors.Is(err, store.ErrGuard) {
					if p.cfg.OnFenced != nil {
						p.cfg.OnFenced()
					}
					p.log.Error("health write refused by the fence: no longer the leader; stopping", "fence", l.Rev, "instance", key)
					return fmt.Errorf("write %s/%s: %w", key.Service, key.ID, election.ErrFenced)
				}
				if errors.Is(err, record.ErrNotFound) {
					p.untrack(all, key)
					continue
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				// etcd trouble: keep the machine's state and write it again
				// on the next transition; log it loudly.
				p.log.Error("health transition not written", "instance", key, "to", tr.To, "err", err)
			}
		}
	}
}

// jitter spreads probes of many instances: ±10% of the interval.
func jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// track starts following inst if it has a check, from its stored health:
// its first probe at once, or somewhere in its first interval if not now.
func (p *Prober) track(all map[cache.Key]*tracked, due *queue, in *registryv1.Instance, now time.Time, immediate bool) *tracked {
	if in.GetCheck().GetKind() == registryv1.CheckKind_CHECK_KIND_NONE {
		return nil
	}
	th := p.cfg.Thresholds.With(in.Check)
	interval := p.cfg.Interval
	if d := in.GetCheck().GetInterval().AsDuration(); d > 0 {
		interval = d
	}
	interval = max(interval, p.cfg.Floor)
	state, since := in.GetHealth().GetState(), in.GetHealth().GetSince().AsTime()
	if in.GetHealth() == nil {
		since = now
	}
	t := &tracked{
		inst: in, machine: health.NewMachine(th, state, since), slow: th.Slow, interval: interval,
		nextAt: now,
	}
	if !immediate {
		t.nextAt = now.Add(rand.N(interval))
	}
	all[cache.Key{Service: in.Service, ID: in.Id}] = t
	heap.Push(due, t)
	return t
}

// untrack stops following key; a probe in flight is discarded on return.
func (p *Prober) untrack(all map[cache.Key]*tracked, key cache.Key) {
	if t := all[key]; t != nil {
		t.gone = true
		delete(all, key)
	}
}

// sync follows the instance set: new instances are tracked, gone ones
// dropped, changed ones keep their machine unless registered anew.
func (p *Prober) sync(all map[cache.Key]*tracked, due *queue, snap *cache.Snapshot, now time.Time) {
	live := make(map[cache.Key]bool, len(all))
	for _, in := range snap.All() {
		key := cache.Key{Service: in.Service, ID: in.Id}
		live[key] = true
		t := all[key]
		switch {
		case t == nil:
			p.track(all, due, in, now, true)
		case in.CreateRevision != t.inst.CreateRevision ||
			(in.GetHealth() == nil && t.machine.State() != registryv1.HealthState_HEALTH_STATE_UNKNOWN) ||
			in.Address != t.inst.Address || !sameCheck(in.Check, t.inst.Check):
			// Registered anew (or moved, or its check changed): start
			// over from what is stored.
			p.untrack(all, key)
			p.track(all, due, in, now, true)
		default:
			t.inst = in
		}
	}
	for key, t := range all {
		if !live[key] {
			p.untrack(all, key)
			p.cfg.Probe.Forget(t.inst.Address)
		}
	}
}

func sameCheck(a, b *registryv1.HealthCheck) bool {
	return a.GetKind() == b.GetKind() && a.GetTarget() == b.GetTarget() &&
		a.GetInterval().AsDuration() == b.GetInterval().AsDuration() &&
		a.GetTimeout().AsDuration() == b.GetTimeout().AsDuration()
}

// write records one transition, through the fence, keeping the lease.
func (p *Prober) write(ctx context.Context, l *election.Leadership, key cache.Key, t *tracked, tr health.Transition, res health.Result) error {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h := &registryv1.Health{State: tr.To, Since: timestamppb.New(tr.At), Reason: tr.Reason,
		LastLatency: durationpb.New(res.Latency), Observer: p.cfg.Node, Fence: l.Rev}
	inst, _, err := p.cfg.Store.UpdateIf(wctx, key.Service, key.ID, []clientv3.Cmp{l.Fence()}, func(in *registryv1.Instance) error {
		if in.CreateRevision != t.inst.CreateRevision {
			return fmt.Errorf("%s/%s was registered anew: %w", key.Service, key.ID, record.ErrNotFound)
		}
		in.Health = h
		return nil
	})
	if err != nil {
		return err
	}
	t.inst = inst
	if p.cfg.OnTransition != nil {
		p.cfg.OnTransition(tr)
	}
	p.log.Info("health transition", "instance", key.Service+"/"+key.ID, "from", tr.From.String(), "to", tr.To.String(), "reason", tr.Reason)
	return nil
}

// sweep deletes, through the fence, the saved states this leader has seen
// without a record for OrphanRetention, until ctx ends or the fence refuses
// a delete (this regnode no longer leads). What it has seen is kept in
// memory only: a new leader starts counting afresh, so a state is never
// deleted early, only late.
func (p *Prober) sweep(ctx context.Context, l *election.Leadership) {
	every := min(max(p.cfg.OrphanRetention/4, 10*time.Millisecond), time.Minute)
	tick := time.NewTicker(every)
	defer tick.Stop()
	seen := newOrphanClock(p.cfg.OrphanRetention)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		list, _, err := p.cfg.Store.Orphans(lctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("list orphaned saved states", "err", err)
			}
			continue
		}
		for _, o := range seen.due(list, time.Now()) {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			deleted, err := p.cfg.Store.DeleteOrphan(dctx, o, []clientv3.Cmp{l.Fence()})
			var held bool
			if err == nil && !deleted {
				// Changed, registered again, or the fence: which one?
				held, err = l.Held(dctx, p.cfg.Store.Client())
			}
			cancel()
			switch {
			case err != nil:
				// Still listed next time, so still due: tried again.
				if ctx.Err() == nil {
					p.log.Warn("delete orphaned saved state", "instance", o.Service+"/"+o.ID, "err", err)
				}
			case deleted:
				p.log.Info("deleted the saved state of an instance gone for good", "instance", o.Service+"/"+o.ID)
			case !held:
				p.log.Warn("orphaned saved state sweep refused by the fence: no longer the leader; sweeping stops", "fence", l.Rev)
				return
			}
		}
	}
}

// orphanClock tells when saved states without a record are due for
// deletion: once seen orphaned, unchanged, for the retention, across
// consecutive listings. It reads no clock (the time is an input).
type orphanClock struct {
	retention time.Duration
	since     map[store.Orphan]time.Time // keyed with the mod revision: a change restarts the count
}

func newOrphanClock(retention time.Duration) *orphanClock {
	return &orphanClock{retention: retention, since: map[store.Orphan]time.Time{}}
}

// due takes one listing of the orphans, made at now, and returns those
// orphaned for the whole retention. One missing from a listing (registered
// again, or deleted) is forgotten; one that comes back starts afresh. One
// due stays due until a listing no longer has it.
func (c *orphanClock) due(list []store.Orphan, now time.Time) []store.Orphan {
	next := make(map[store.Orphan]time.Time, len(list))
	var out []store.Orphan
	for _, o := range list {
		since, ok := c.since[o]
		if !ok {
			since = now
		}
		if now.Sub(since) >= c.retention {
			out = append(out, o)
		}
		next[o] = since
	}
	c.since = next
	return out
}
