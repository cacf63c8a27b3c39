package prober

import (
	"container/heap"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

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
	// held is the failing result whose eviction waits for another
	// regnode's confirmation (nil: none); confirming, that one was asked.
	held       *health.Result
	confirming bool
	// idx is its place in the due queue (-1: not queued: in flight).
	idx int
	// byReports: its record says DEGRADED because of callers' reports
	// while its probes pass (its machine is HEALTHY).
	byReports bool
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
func (q queue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx, q[j].idx = i, j
}
func (q *queue) Push(x any) {
	t := x.(*tracked)
	t.idx = len(*q)
	*q = append(*q, t)
}
func (q *queue) Pop() any {
	old := *q
	t := old[len(old)-1]
	t.idx = -1
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return t
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
	// view, or the share).
	gone func(cache.Key)
	// owns says which instances are this prober's share.
	owns func(service, id string) bool
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
	// DEGRADED by callers' reports is HEALTHY to the probes.
	byReports := state == registryv1.HealthState_HEALTH_STATE_DEGRADED && strings.HasPrefix(in.GetHealth().GetReason(), reportsReason)
	if byReports {
		state = registryv1.HealthState_HEALTH_STATE_HEALTHY
	}
	t := &tracked{
		inst: in, machine: health.NewMachine(th, state, since), slow: th.Slow, interval: interval,
		nextAt: now, byReports: byReports,
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

// reshare follows snap under a new share: instances no longer owned are
// dropped, and those newly owned tracked, spread over their interval like
// a takeover's (one never probed at once). A new owner starts from the
// stored health with fresh counters, so it probes before it writes.
func (f *follower) reshare(snap *cache.Snapshot, now time.Time) {
	for key := range f.all {
		if !f.owns(key.Service, key.ID) {
			f.drop(key)
		}
	}
	for _, in := range snap.All() {
		if f.all[cache.Key{Service: in.Service, ID: in.Id}] == nil && f.owns(in.Service, in.Id) {
			f.track(in, now, in.GetHealth().GetState() == registryv1.HealthState_HEALTH_STATE_UNKNOWN)
		}
	}
	clear(f.lists)
	f.lists, f.prev = f.lists[:0], nil
	f.sync(snap, now)
}

// seen follows in, an instance new or changed in the view.
func (f *follower) seen(in *registryv1.Instance, now time.Time) {
	key := cache.Key{Service: in.Service, ID: in.Id}
	if f.owns != nil && !f.owns(in.Service, in.Id) {
		return
	}
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
