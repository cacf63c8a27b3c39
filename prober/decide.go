package prober

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Verdict is another regnode's probe of an instance this prober would
// demote.
type Verdict struct {
	// Failing: the other regnode's probe failed too.
	Failing bool
	// Peer names the regnode that probed; Detail is its probe's result.
	Peer, Detail string
}

// confirmation is a Verdict come back to the probe loop.
type confirmation struct {
	t      *tracked
	create int64
	v      Verdict
	err    error
}

// Stats are a prober's counters since it was made.
type Stats struct {
	// Owned is how many instances with a check it follows now.
	Owned int64
	// Probes counts the probes it ran whose result it used.
	Probes uint64
	// Disagreements counts demotions another regnode did not confirm.
	Disagreements uint64
	// Held counts demotions held back: by a failing canary, or by the
	// mass-demotion limit.
	Held uint64
	// Canary is why this regnode's canaries fail ("" while they pass).
	Canary string
}

// Stats returns the prober's counters.
func (p *Prober) Stats() Stats {
	s := Stats{Owned: p.owned.Load(), Probes: p.probes.Load(), Disagreements: p.disagreements.Load(), Held: p.held.Load()}
	if p.cfg.Canary != nil {
		s.Canary = p.cfg.Canary()
	}
	return s
}

// demotion reports whether tr lowers what callers may send to.
func demotion(tr health.Transition) bool {
	rank := func(s registryv1.HealthState) int {
		switch s {
		case registryv1.HealthState_HEALTH_STATE_HEALTHY:
			return 3
		case registryv1.HealthState_HEALTH_STATE_DEGRADED:
			return 2
		case registryv1.HealthState_HEALTH_STATE_UNAVAILABLE:
			return 1
		}
		return 0 // UNKNOWN: not routable yet, nothing to lose
	}
	return rank(tr.From) > 0 && rank(tr.To) < rank(tr.From)
}

// eviction reports whether tr takes a routable instance out.
func eviction(tr health.Transition) bool {
	return demotion(tr) && tr.To == registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
}

// allowed says whether tr, which r moved t's machine to from before, is
// written now. A transition that is not is undone in the machine, so the
// next failing probe takes it again:
//   - any demotion while this regnode's canaries fail;
//   - an eviction while another regnode is live, until that regnode's
//     probe confirms it (asked here, answered on confirmed);
//   - an eviction past the mass-demotion limit.
func (p *Prober) allowed(ctx context.Context, wg *sync.WaitGroup, t *tracked, before health.Machine, tr health.Transition,
	r result, s *Share, confirmed chan<- confirmation) bool {
	if !demotion(tr) {
		return true
	}
	if p.cfg.Canary != nil {
		if why := p.cfg.Canary(); why != "" {
			p.hold(t, before, tr, "canary", "this regnode's canaries fail: "+why)
			return false
		}
	}
	if !eviction(tr) {
		return true
	}
	if !s.Alone && p.cfg.Confirm != nil {
		t.machine = before
		res := r.res
		t.held = &res
		if !t.confirming {
			t.confirming = true
			inst := t.inst
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
				v, err := p.cfg.Confirm(cctx, inst)
				cancel()
				select {
				case confirmed <- confirmation{t: t, create: inst.CreateRevision, v: v, err: err}:
				case <-ctx.Done():
				}
			})
		}
		return false
	}
	return p.massAllows(t, before, tr, r.res.At)
}

// confirmed takes another regnode's answer about t: the eviction it
// confirms is returned to be written (if still due, and within the
// mass-demotion limit); one it does not is a disagreement, logged and
// counted, and the instance stays as it is.
func (p *Prober) confirmed(c confirmation, now time.Time) (health.Transition, health.Result, bool) {
	t := c.t
	t.confirming = false
	held := t.held
	t.held = nil
	if t.gone || t.inst.CreateRevision != c.create || held == nil {
		return health.Transition{}, health.Result{}, false // gone, or a probe passed meanwhile
	}
	key := t.inst.Service + "/" + t.inst.Id
	switch {
	case c.err != nil:
		p.log.Warn("no other regnode could confirm an eviction; the instance stays as it is", "instance", key, "err", c.err)
		return health.Transition{}, health.Result{}, false
	case !c.v.Failing:
		p.disagreements.Add(1)
		if p.cfg.OnDisagreement != nil {
			p.cfg.OnDisagreement()
		}
		p.log.Warn("probe disagreement: another regnode's probe passes; the instance stays as it is",
			"instance", key, "address", t.inst.Address, "peer", c.v.Peer, "peer_probe", c.v.Detail, "own_probe", held.Detail)
		return health.Transition{}, health.Result{}, false
	}
	before := t.machine
	tr, changed := t.machine.Observe(*held)
	if !changed {
		return health.Transition{}, health.Result{}, false
	}
	if !eviction(tr) {
		return tr, *held, true
	}
	if p.cfg.Canary != nil {
		if why := p.cfg.Canary(); why != "" {
			p.hold(t, before, tr, "canary", "this regnode's canaries fail: "+why)
			return health.Transition{}, health.Result{}, false
		}
	}
	if !p.massAllows(t, before, tr, now) {
		return health.Transition{}, health.Result{}, false
	}
	tr.Reason += "; confirmed by " + c.v.Peer
	return tr, *held, true
}

// hold undoes tr in t's machine and counts (by kind: canary, mass) and
// logs why.
func (p *Prober) hold(t *tracked, before health.Machine, tr health.Transition, kind, why string) {
	t.machine = before
	p.held.Add(1)
	if p.cfg.OnHeld != nil {
		p.cfg.OnHeld(kind)
	}
	p.log.Warn("demotion held back", "instance", t.inst.Service+"/"+t.inst.Id, "to", tr.To.String(), "why", why)
}

// massAllows applies the mass-demotion limit to the eviction tr of t: at
// most MassShare of one service's (or one zone's) checked instances
// evicted within MassWindow (counting every regnode's evictions the view
// shows, at least MassMin), past which one more per MassTrickle.
func (p *Prober) massAllows(t *tracked, before health.Machine, tr health.Transition, now time.Time) bool {
	if p.cfg.MassShare < 0 {
		return true
	}
	snap := p.cfg.View()
	keys := []string{"service " + t.inst.Service}
	if t.inst.Zone != "" {
		keys = append(keys, "zone "+t.inst.Zone)
	}
	if why := p.mass.admit(snap, t.inst, keys, now, p.cfg); why != "" {
		p.hold(t, before, tr, "mass", why)
		return false
	}
	return true
}

// admit records an eviction of inst at now under every key and returns
// "", or, past the limit of one of them, records nothing and says why.
func (m *massState) admit(snap *cache.Snapshot, inst *registryv1.Instance, keys []string, now time.Time, cfg Config) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		total, recent := m.count(snap, inst, k, now, cfg.MassWindow)
		recent = max(recent, m.own(k, now, cfg.MassWindow))
		limit := max(cfg.MassMin, int(math.Ceil(cfg.MassShare*float64(total))))
		if recent >= limit && now.Sub(m.last[k]) < cfg.MassTrickle {
			return "mass demotion: " + k + " already lost " + strconv.Itoa(recent) + " of " + strconv.Itoa(total) +
				" checked instances within " + cfg.MassWindow.String()
		}
	}
	for _, k := range keys {
		m.evicted[k] = append(m.evicted[k], now)
		m.last[k] = now
	}
	return ""
}

// massState is what massAllows remembers.
type massState struct {
	mu      sync.Mutex
	evicted map[string][]time.Time // this prober's evictions, by key
	last    map[string]time.Time
	rev     int64
	zones   map[string][2]int // per zone key: checked instances, evicted within the window (of rev)
}

func newMassState() *massState {
	return &massState{evicted: map[string][]time.Time{}, last: map[string]time.Time{}}
}

// own counts this prober's evictions of key within window, dropping older.
func (m *massState) own(key string, now time.Time, window time.Duration) int {
	ts := m.evicted[key]
	k := 0
	for _, at := range ts {
		if now.Sub(at) < window {
			ts[k] = at
			k++
		}
	}
	if k == 0 {
		delete(m.evicted, key)
	} else {
		m.evicted[key] = ts[:k]
	}
	return k
}

// count is, for key (inst's service or zone), the checked instances and
// those the view shows evicted within window.
func (m *massState) count(snap *cache.Snapshot, inst *registryv1.Instance, key string, now time.Time, window time.Duration) (total, recent int) {
	add := func(in *registryv1.Instance, into *[2]int) {
		if in.GetCheck().GetKind() == registryv1.CheckKind_CHECK_KIND_NONE {
			return
		}
		into[0]++
		if h := in.GetHealth(); h.GetState() == registryv1.HealthState_HEALTH_STATE_UNAVAILABLE && now.Sub(h.GetSince().AsTime()) < window {
			into[1]++
		}
	}
	if key == "service "+inst.Service {
		var c [2]int
		for _, in := range snap.Instances(inst.Service) {
			add(in, &c)
		}
		return c[0], c[1]
	}
	if m.zones == nil || m.rev != snap.Revision() {
		// Every zone at once, once per view: a mass event asks for many.
		m.rev, m.zones = snap.Revision(), map[string][2]int{}
		for _, in := range snap.All() {
			if in.Zone != "" {
				c := m.zones["zone "+in.Zone]
				add(in, &c)
				m.zones["zone "+in.Zone] = c
			}
		}
	}
	c := m.zones[key]
	return c[0], c[1]
}
