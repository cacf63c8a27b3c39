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
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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
	// Confirm asks another regnode to probe an instance this prober
	// would evict (HEALTHY or DEGRADED to UNAVAILABLE) while its share is
	// not Alone; the eviction is written only if that probe fails too
	// (nil: every verdict is this prober's alone).
	Confirm func(ctx context.Context, inst *registryv1.Instance) (Verdict, error)
	// ConfirmTimeout bounds one Confirm (0: 5s).
	ConfirmTimeout time.Duration
	// Canary says why this regnode's own canaries fail ("" while they
	// pass); while they fail it demotes nothing (nil: no canaries).
	Canary func() string
	// MassShare is the share of one service's (or zone's) checked
	// instances that may be evicted within MassWindow, counting every
	// regnode's evictions (0: 0.5; negative: no limit). Past it, one more
	// per MassTrickle; at least MassMin are always allowed (0: 2).
	MassShare   float64
	MassMin     int
	MassWindow  time.Duration // 0: 1m
	MassTrickle time.Duration // 0: 10s
	// Reported says how many distinct callers report service/id failing
	// while their calls to its peers succeed (nil: reports are not
	// followed); at ReportQuorum (0: 3) an instance whose probes pass is
	// DEGRADED with that reason. Nudge probes one at once.
	Reported     func(service, id string) int
	ReportQuorum int
	// Hooks for metrics; any may be nil.
	OnProbe        func(outcome health.Outcome, latency time.Duration)
	OnTransition   func(tr health.Transition)
	OnFenced       func()
	OnOwned        func(n int)
	OnDisagreement func()
	OnHeld         func(kind string) // "canary" or "mass"
}

// DefaultConfig is a Config with every default but the required fields.
func DefaultConfig() Config {
	return Config{Thresholds: health.DefaultThresholds(), Interval: time.Second, Floor: 100 * time.Millisecond,
		Concurrency: 64, Writers: 8, WriteTimeout: 5 * time.Second, OrphanRetention: time.Hour,
		ConfirmTimeout: 5 * time.Second, ReportQuorum: 3, MassShare: 0.5, MassMin: 2, MassWindow: time.Minute, MassTrickle: 10 * time.Second}
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
	if c.ConfirmTimeout == 0 {
		c.ConfirmTimeout = d.ConfirmTimeout
	}
	if c.ReportQuorum == 0 {
		c.ReportQuorum = d.ReportQuorum
	}
	if c.MassShare == 0 {
		c.MassShare = d.MassShare
	}
	if c.MassMin == 0 {
		c.MassMin = d.MassMin
	}
	if c.MassWindow == 0 {
		c.MassWindow = d.MassWindow
	}
	if c.MassTrickle == 0 {
		c.MassTrickle = d.MassTrickle
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
	case c.ConfirmTimeout < 0:
		return bad("ConfirmTimeout", c.ConfirmTimeout)
	case c.ReportQuorum < 0:
		return bad("ReportQuorum", c.ReportQuorum)
	case c.MassShare > 1:
		return configerr.New(ErrInvalidConfig, "prober", "MassShare", c.MassShare, "must be at most 1 (0: the default; negative: no limit)")
	case c.MassMin < 0:
		return bad("MassMin", c.MassMin)
	case c.MassWindow < 0:
		return bad("MassWindow", c.MassWindow)
	case c.MassTrickle < 0:
		return bad("MassTrickle", c.MassTrickle)
	}
	if err := c.Thresholds.Validate(); err != nil {
		return configerr.Within(ErrInvalidConfig, "prober", "Thresholds", err)
	}
	return nil
}

// Prober is the health checker. Lead may run many times, never twice at
// once.
type Prober struct {
	cfg    Config
	log    *slog.Logger
	mass   *massState
	nudges chan cache.Key

	owned                       atomic.Int64
	probes, disagreements, held atomic.Uint64
}

// New returns a Prober; it fails only if cfg does not Validate.
func New(cfg Config) (*Prober, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Prober{cfg: cfg, log: cfg.Logger.With("component", "prober"), mass: newMassState(), nudges: make(chan cache.Key, 1024)}, nil
}

// Lead probes every instance with a check until ctx ends or a fenced
// write fails (ErrFenced): the prober of a regnode that leads the
// election, and one that is alone. Its writes carry the leader's fence,
// and it sweeps orphaned saved states.
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
	if p.cfg.OrphanRetention > 0 {
		wg.Go(func() { p.sweep(ctx, l) })
	}
	whole := &Share{Owns: func(string, string) bool { return true }, Guard: []clientv3.Cmp{l.Fence()}, Alone: true, Fence: l.Rev}
	return p.run(ctx, fixed{whole}, insts, true)
}

// Probe probes this regnode's share of the instances, as shares says it
// moves, until ctx ends. A write the share's guard refuses (the share
// moved) is tried again under the next share, or dropped once the
// instance is no longer this regnode's.
func (p *Prober) Probe(ctx context.Context, shares Shares) error {
	return p.run(ctx, shares, nil, false)
}

// run is the probe loop of Lead (initial: what etcd holds; fencedEnds:
// a refused write ends it) and of Probe.
func (p *Prober) run(ctx context.Context, shares Shares, initial []*registryv1.Instance, fencedEnds bool) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	// The share this loop follows: once the view has reached its
	// revision (so it holds every write of the share's previous owner).
	var (
		applied          *Share
		current, changed = shares.Share()
	)
	var cur atomic.Pointer[Share]
	// Transitions are written by the writer, never in this loop: a slow
	// etcd delays what lands, not the probes.
	w := newWriter(p.cfg.Store, nil, p.cfg.Writers, p.log, p.cfg.OnTransition)
	w.timeout = p.cfg.WriteTimeout
	w.share = func(key cache.Key) ([]clientv3.Cmp, int64, bool) {
		s := cur.Load()
		if s == nil || !s.Owns(key.Service, key.ID) {
			return nil, 0, false
		}
		return s.Guard, s.Fence, true
	}
	w.retryFenced = !fencedEnds
	w.onFenced = p.cfg.OnFenced
	wg.Go(func() { w.run(ctx) })

	now := time.Now()
	f := p.newFollower()
	f.gone = w.forget
	f.owns = func(string, string) bool { return false }
	apply := func(s *Share, snap *cache.Snapshot, now time.Time) {
		applied = s
		cur.Store(s)
		f.owns = s.Owns
		if initial != nil {
			for _, in := range initial {
				// Spread the instances already probed over their
				// interval, so a takeover does not probe everything at
				// once; one never probed waits for its first probe to be
				// routable: at once.
				if s.Owns(in.Service, in.Id) {
					f.track(in, now, in.GetHealth().GetState() == registryv1.HealthState_HEALTH_STATE_UNKNOWN)
				}
			}
			initial = nil
		}
		f.reshare(snap, now)
		p.owned.Store(int64(len(f.all)))
		if p.cfg.OnOwned != nil {
			p.cfg.OnOwned(len(f.all))
		}
		p.log.Info("probing", "instances", len(f.all), "fence", s.Fence, "alone", s.Alone)
	}
	results := make(chan result, p.cfg.Concurrency)
	confirmed := make(chan confirmation, p.cfg.Concurrency)
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
	step := func(now time.Time) {
		select {
		case <-changed:
			current, changed = shares.Share()
		default:
		}
		snap := p.cfg.View()
		if current != nil && current != applied && snap.Revision() >= current.Rev {
			apply(current, snap, now)
			seen = snap.Revision()
			launch(now)
			return
		}
		if applied != nil && snap.Revision() != seen {
			seen = snap.Revision()
			f.sync(snap, now)
			if n := int64(len(f.all)); n != p.owned.Swap(n) && p.cfg.OnOwned != nil {
				p.cfg.OnOwned(int(n))
			}
			launch(now)
		}
	}
	step(now)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.Fenced():
			p.log.Error("health write refused by the fence: no longer the leader; stopping", "fence", applied.Fence)
			return fmt.Errorf("health write: %w", election.ErrFenced)
		case now := <-timer.C:
			launch(now)
		case k := <-p.nudges:
			if f.nudge(k, time.Now()) {
				launch(time.Now())
			}
		case now := <-views.C:
			step(now)
		case c := <-confirmed:
			if tr, res, ok := p.confirmed(c, time.Now()); ok {
				p.submit(w, c.t, tr, res, applied)
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
			p.probes.Add(1)
			if p.cfg.OnProbe != nil {
				p.cfg.OnProbe(r.res.Outcome, r.res.Latency)
			}
			before := t.machine
			tr, changed := t.machine.Observe(r.res)
			if !changed {
				if !r.res.Outcome.Failure() {
					t.held = nil // a verdict waiting for its confirmation no longer stands
				}
				p.byReports(w, t, r.res, applied)
				continue
			}
			t.byReports = false // the probes speak
			if !p.allowed(ctx, &wg, t, before, tr, r, applied, confirmed) {
				continue
			}
			p.submit(w, t, tr, r.res, applied)
		}
	}
}

// submit hands the transition tr of t, observed with res, to the writer.
func (p *Prober) submit(w *writer, t *tracked, tr health.Transition, res health.Result, s *Share) {
	t.held = nil
	w.submit(t.inst, tr, &registryv1.Health{State: tr.To, Since: timestamppb.New(tr.At), Reason: tr.Reason,
		LastLatency: durationpb.New(res.Latency), Observer: p.cfg.Node, Fence: s.Fence})
}

// jitter spreads probes of many instances: ±10% of the interval.
func jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}
