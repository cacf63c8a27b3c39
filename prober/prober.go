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
// The prober follows the regnode's cache by difference: per revision it
// looks only at the services whose slice changed and, in them, the
// instances whose record changed, so one change among many instances costs
// one pointer comparison per service and a walk of one service, and leaves
// every other instance's probe loop alone. Transitions are written off the
// probe loop by a writer it owns (one write in flight per instance, a
// newer transition replacing an unwritten older one), each in one round
// trip when the record is as the cache holds it.
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/probe"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
// of New (see package configerr).
var ErrInvalidConfig = errors.New("prober: invalid config")

// Config configures a Prober. A zero field takes the default its comment
// states (DefaultConfig has them all); a negative count or duration is
// refused unless its comment gives it a meaning.
type Config struct {
	// Store is where transitions are written (required).
	Store *store.Store
	// View returns the current instances (required): the regnode's cache.
	View func() *cache.Snapshot
	// Probe runs the probes (required).
	Probe *probe.Checker
	// Thresholds are the global defaults; an instance's check overrides
	// them field by field (zero: health.DefaultThresholds(); otherwise
	// they must pass health.Thresholds.Validate).
	Thresholds health.Thresholds
	// Interval between probes of one instance when its check does not say
	// (0: 1s); at least Floor.
	Interval time.Duration
	// Floor: probes of one instance never start closer than this, whatever
	// the check says (0: 100ms, so a check asking for 1ms cannot make the
	// leader hammer an instance).
	Floor time.Duration
	// Concurrency bounds probes in flight (0: 64).
	Concurrency int
	// Writers bounds health writes in flight, each to another instance
	// (0: 8). Writes never hold up probes: a transition waits in its
	// instance's slot, and a newer one replaces it there.
	Writers int
	// WriteTimeout bounds one health write to etcd (0: 5s); one that
	// times out is tried again, unless a newer transition replaced it.
	WriteTimeout time.Duration
	// OrphanRetention is how long this leader must see a saved state
	// without its record, continuously, before deleting it (0: 1h;
	// negative: never). A lost lease is re-registered within seconds, so
	// the retention only bounds how long a dead instance's state lingers.
	OrphanRetention time.Duration
	// Node is this regnode's name, written as the observer ("" writes
	// none).
	Node string
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
	// Hooks for metrics; any may be nil.
	OnProbe      func(outcome health.Outcome, latency time.Duration)
	OnTransition func(tr health.Transition)
	OnFenced     func()
}

// DefaultConfig is a Config with every default but the required fields.
func DefaultConfig() Config {
	return Config{Thresholds: health.DefaultThresholds(), Interval: time.Second, Floor: 100 * time.Millisecond,
		Concurrency: 64, Writers: 8, WriteTimeout: 5 * time.Second, OrphanRetention: time.Hour}
}

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Thresholds == (health.Thresholds{}) {
		c.Thresholds = d.Thresholds
	}
	if c.Interval == 0 {
		c.Interval = d.Interval
	}
	if c.Floor == 0 {
		c.Floor = d.Floor
	}
	if c.Concurrency == 0 {
		c.Concurrency = d.Concurrency
	}
	if c.Writers == 0 {
		c.Writers = d.Writers
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = d.WriteTimeout
	}
	if c.OrphanRetention == 0 {
		c.OrphanRetention = d.OrphanRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as a *configerr.Error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	req := func(field string) error { return configerr.Required(ErrInvalidConfig, "prober", field) }
	bad := func(field string, v any) error {
		return configerr.New(ErrInvalidConfig, "prober", field, v, "must be >= 0 (0: the default)")
	}
	switch {
	case c.Store == nil:
		return req("Store")
	case c.View == nil:
		return req("View")
	case c.Probe == nil:
		return req("Probe")
	case c.Floor < 0:
		return bad("Floor", c.Floor)
	case c.Interval < c.Floor:
		return configerr.New(ErrInvalidConfig, "prober", "Interval", c.Interval,
			fmt.Sprintf("must be at least Floor %s (0: the default)", c.Floor))
	case c.Concurrency < 0:
		return bad("Concurrency", c.Concurrency)
	case c.Writers < 0:
		return bad("Writers", c.Writers)
	case c.WriteTimeout < 0:
		return bad("WriteTimeout", c.WriteTimeout)
	}
	if err := c.Thresholds.Validate(); err != nil {
		return configerr.Within(ErrInvalidConfig, "prober", "Thresholds", err)
	}
	return nil
}

// Prober is the health checker. Lead may run many times, never twice at
// once.
type Prober struct {
	cfg Config
	log *slog.Logger
}

// New returns a Prober; it fails only if cfg does not Validate.
func New(cfg Config) (*Prober, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
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

	// Transitions are written by the writer, never in this loop: a slow
	// etcd delays what lands, not the probes.
	w := newWriter(p.cfg.Store, []clientv3.Cmp{l.Fence()}, p.cfg.Writers, p.log, p.cfg.OnTransition)
	w.timeout = p.cfg.WriteTimeout
	wg.Go(func() { w.run(ctx) })

	now := time.Now()
	f := p.newFollower()
	f.gone = w.forget
	for _, in := range insts {
		// Spread the instances already probed over their interval, so a
		// takeover does not probe everything at once; one never probed
		// waits for its first probe to be routable: at once.
		f.track(in, now, in.GetHealth().GetState() == registryv1.HealthState_HEALTH_STATE_UNKNOWN)
	}
	if p.cfg.OrphanRetention > 0 {
		wg.Go(func() { p.sweep(ctx, l) })
	}
	p.log.Info("probing", "instances", len(f.all), "fence", l.Rev)
	results := make(chan result, p.cfg.Concurrency)
	inflight := 0
	due := f.due
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
		case <-w.Fenced():
			if p.cfg.OnFenced != nil {
				p.cfg.OnFenced()
			}
			p.log.Error("health write refused by the fence: no longer the leader; stopping", "fence", l.Rev)
			return fmt.Errorf("health write: %w", election.ErrFenced)
		case now := <-timer.C:
			launch(now)
		case now := <-views.C:
			if snap := p.cfg.View(); snap.Revision() != seen {
				seen = snap.Revision()
				f.sync(snap, now)
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
			w.submit(t.inst, tr, &registryv1.Health{State: tr.To, Since: timestamppb.New(tr.At), Reason: tr.Reason,
				LastLatency: durationpb.New(r.res.Latency), Observer: p.cfg.Node, Fence: l.Rev})
		}
	}
}

// jitter spreads probes of many instances: ±10% of the interval.
func jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// follower keeps the tracked instances in step with the view; owned by
// Lead's goroutine. After the first view it follows by difference: the
// cache builds each snapshot copy-on-write per service (an unchanged
// service keeps its slice, an unchanged instance its pointer), so comparing
// two snapshots costs a pointer comparison per service plus a walk of the
// services that changed, and only the instances that changed are visited.
type follower struct {
	p    *Prober
	all  map[cache.Key]*tracked
	due  *queue
	prev *cache.Snapshot // the view last followed; nil before the first
	// lists are prev's services and their slices, sorted by name, so the
	// next view is compared with one map read per service; spare is the
	// other buffer, reused.
	lists, spare []serviceList
	// starts counts the probe loops started (track calls): a loop is
	// started for a new instance, or again for one registered anew or
	// whose check changed, never for one that did not change.
	starts int
	// gone is called for an instance no longer followed (its key left the
	// view).
	gone func(cache.Key)
}

type serviceList struct {
	name string
	list []*registryv1.Instance
}

func (p *Prober) newFollower() *follower {
	return &follower{p: p, all: map[cache.Key]*tracked{}, due: &queue{}}
}

// track starts following inst if it has a check, from its stored health:
// its first probe at once, or somewhere in its first interval if not now.
func (f *follower) track(in *registryv1.Instance, now time.Time, immediate bool) *tracked {
	if in.GetCheck().GetKind() == registryv1.CheckKind_CHECK_KIND_NONE {
		return nil
	}
	p := f.p
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
	f.all[cache.Key{Service: in.Service, ID: in.Id}] = t
	heap.Push(f.due, t)
	f.starts++
	return t
}

// untrack stops following key; a probe in flight is discarded on return.
func (f *follower) untrack(key cache.Key) {
	if t := f.all[key]; t != nil {
		t.gone = true
		delete(f.all, key)
	}
}

// sync follows the instance set to snap: new instances are tracked, gone
// ones dropped, changed ones keep their machine unless registered anew.
func (f *follower) sync(snap *cache.Snapshot, now time.Time) {
	if snap == f.prev {
		return
	}
	first := f.prev == nil
	if first {
		f.full(snap, now)
	}
	// Both sides sorted by name: one walk finds the services changed,
	// added and gone.
	next, k := f.spare[:0], 0
	for _, svc := range snap.Services() {
		cur := snap.Instances(svc)
		for ; k < len(f.lists) && f.lists[k].name < svc; k++ {
			f.service(f.lists[k].list, nil, now) // gone
		}
		var old []*registryv1.Instance
		if k < len(f.lists) && f.lists[k].name == svc {
			old = f.lists[k].list
			k++
		}
		if !first && !sameSlice(cur, old) {
			f.service(old, cur, now)
		}
		next = append(next, serviceList{svc, cur})
	}
	for ; k < len(f.lists); k++ {
		f.service(f.lists[k].list, nil, now)
	}
	clear(f.lists) // let the old view's slices go
	f.lists, f.spare = next, f.lists
	f.prev = snap
}

// sameSlice reports whether a and b are the same slice: the cache gives a
// changed service a new slice, and an unchanged one keeps its own.
func sameSlice(a, b []*registryv1.Instance) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// service follows one service from old to cur (both sorted by id): an
// instance kept by pointer is unchanged and not looked at.
func (f *follower) service(old, cur []*registryv1.Instance, now time.Time) {
	i, j := 0, 0
	for i < len(old) || j < len(cur) {
		if i < len(old) && j < len(cur) && old[i] == cur[j] {
			i, j = i+1, j+1 // unchanged: the common case, no string compared
			continue
		}
		switch {
		case j == len(cur) || (i < len(old) && old[i].Id < cur[j].Id):
			f.drop(cache.Key{Service: old[i].Service, ID: old[i].Id})
			i++
		case i == len(old) || cur[j].Id < old[i].Id:
			f.seen(cur[j], now)
			j++
		default: // the same id, another record
			f.seen(cur[j], now)
			i++
			j++
		}
	}
}

// full follows snap by scanning all of it: the first view, against what
// Lead read from etcd.
func (f *follower) full(snap *cache.Snapshot, now time.Time) {
	live := make(map[cache.Key]bool, len(f.all))
	for _, in := range snap.All() {
		live[cache.Key{Service: in.Service, ID: in.Id}] = true
		f.seen(in, now)
	}
	for key := range f.all {
		if !live[key] {
			f.drop(key)
		}
	}
}

// seen follows in, an instance new or changed in the view.
func (f *follower) seen(in *registryv1.Instance, now time.Time) {
	key := cache.Key{Service: in.Service, ID: in.Id}
	t := f.all[key]
	switch {
	case t == nil:
		f.track(in, now, true)
	case in.CreateRevision != t.inst.CreateRevision ||
		(in.GetHealth() == nil && t.machine.State() != registryv1.HealthState_HEALTH_STATE_UNKNOWN) ||
		in.Address != t.inst.Address || !sameCheck(in.Check, t.inst.Check):
		// Registered anew (or moved, or its check changed): start
		// over from what is stored.
		f.untrack(key)
		f.track(in, now, true)
	default:
		t.inst = in
	}
}

// drop stops following key, which left the view.
func (f *follower) drop(key cache.Key) {
	t := f.all[key]
	if t == nil {
		return
	}
	f.untrack(key)
	f.p.cfg.Probe.Forget(t.inst.Address)
	if f.gone != nil {
		f.gone(key)
	}
}

// sameCheck reports whether two check specs are the same: any field
// (kind, target, interval, timeout, thresholds) changed means a new loop.
func sameCheck(a, b *registryv1.HealthCheck) bool { return proto.Equal(a, b) }

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
