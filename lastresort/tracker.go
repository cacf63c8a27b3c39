package lastresort

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Tracker tracks the vanished instances of any number of services. It is
// safe for concurrent use; each service's changes must be fed in order.
type Tracker struct {
	cfg Config
	mu  struct {
		sync.Mutex
		services map[string]*track
		stats    Stats
	}
}

// Stats counts what a Tracker saw, for a caller's metrics.
type Stats struct {
	// Vanished counts the routable instances seen deleted while not
	// DRAINING.
	Vanished int64
	// Started counts the last resorts started.
	Started int64
	// Ended counts the last resorts ended, by reason.
	Ended map[EndReason]int64
	// Returned counts the kept instances dropped because their id
	// was registered again.
	Returned int64
}

// track is what a Tracker holds of one service.
type track struct {
	base   int        // routable instances just before the first of recent vanished
	recent []vanished // vanished within Window, in the order seen
	kept   []*registryv1.Instance
	until  time.Time // the grace's end while kept is not empty
}

type vanished struct {
	at   time.Time
	inst *registryv1.Instance
}

// event is a hook call due once the lock is released.
type event struct {
	service string
	start   bool
	kept    []*registryv1.Instance
	until   time.Time
	why     EndReason
}

// New returns a Tracker; it fails only if cfg does not Validate.
func New(cfg Config) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Tracker{cfg: cfg.withDefaults()}
	t.mu.services = map[string]*track{}
	t.mu.stats.Ended = map[EndReason]int64{}
	return t, nil
}

// Observe feeds one change of service's list, at now: prev is the list
// before it and cur the list after it, both sorted by id (as the cache and
// the SDK hold them) and not modified by the Tracker, which keeps
// references to their records. prev must hold, for every instance the
// change removed, the last record the caller saw of it: a caller that folds
// several changes into one (a batch of events) overlays the records the
// batch put before deleting them (see LastSeen), or the DRAINING mark of a
// deregistration is lost and it is taken for a vanishing.
func (t *Tracker) Observe(service string, prev, cur []*registryv1.Instance, now time.Time) {
	if t.cfg.Off {
		return
	}
	var due []event
	t.mu.Lock()
	sv := t.mu.services[service]
	if sv == nil {
		sv = &track{}
	}
	due = t.expire(service, sv, now, due)
	sv.prune(now, t.cfg.Window)
	var gone []*registryv1.Instance // routable, removed while not DRAINING
	deliberate := false
	walk(prev, cur, func(removed, added *registryv1.Instance) {
		switch {
		case added != nil:
			if sv.drop(added.Id) {
				t.mu.stats.Returned++
			}
		case removed.GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_DRAINING:
			deliberate = true
		case record.Routable(removed):
			gone = append(gone, removed)
		}
	})
	// A kept instance is dropped when a record with its id is back,
	// whether or not prev held it (a caller's first change after a reset).
	for _, in := range slices.Clone(sv.kept) {
		if _, ok := find(cur, in.Id); ok {
			sv.drop(in.Id)
			t.mu.stats.Returned++
		}
	}
	if len(sv.kept) == 0 && !sv.until.IsZero() {
		sv.until = time.Time{}
		due = t.ended(service, EndReturned, due)
	}
	switch {
	case deliberate:
		if len(sv.kept) > 0 {
			sv.kept, sv.until = nil, time.Time{}
			due = t.ended(service, EndDeliberate, due)
		}
		sv.recent = nil
	case len(gone) > 0:
		t.mu.stats.Vanished += int64(len(gone))
		if len(sv.recent) == 0 {
			sv.base = routable(prev)
		}
		for _, in := range gone {
			sv.recent = append(sv.recent, vanished{at: now, inst: in})
		}
		if len(sv.kept) > 0 {
			// An incident still going on: what vanishes too is kept
			// till the same end, never later.
			sv.kept = merge(sv.kept, gone)
		} else if float64(len(sv.recent)) >= math.Ceil(t.cfg.Fraction*float64(sv.base)) && sv.base > 0 {
			kept := make([]*registryv1.Instance, 0, len(sv.recent))
			for _, v := range sv.recent {
				kept = append(kept, v.inst)
			}
			sv.kept, sv.until = merge(nil, kept), now.Add(t.cfg.Grace)
			t.mu.stats.Started++
			due = append(due, event{service: service, start: true, kept: sv.kept, until: sv.until})
		}
	}
	t.store(service, sv)
	t.mu.Unlock()
	t.call(due)
}

// Offer returns the instances to offer as service's last resort at now,
// given its current list cur: the ones kept, as last seen (the Tracker's
// own records: not to be modified), while the grace lasts and only if cur
// has no routable instance; nil otherwise. The caller offers them as
// routable. It changes nothing (Expire does).
func (t *Tracker) Offer(service string, cur []*registryv1.Instance, now time.Time) []*registryv1.Instance {
	t.mu.Lock()
	defer t.mu.Unlock()
	sv := t.mu.services[service]
	if sv == nil || len(sv.kept) == 0 || !now.Before(sv.until) {
		return nil
	}
	for _, in := range cur {
		if record.Routable(in) {
			return nil
		}
	}
	return slices.Clone(sv.kept)
}

// Held says how many instances service keeps as a last resort and until
// when (0 and the zero time when none), as of the last Observe or Expire.
func (t *Tracker) Held(service string) (n int, until time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if sv := t.mu.services[service]; sv != nil && len(sv.kept) > 0 {
		return len(sv.kept), sv.until
	}
	return 0, time.Time{}
}

// Next is the earliest end of a grace still running (zero when none): the
// time to call Expire at.
func (t *Tracker) Next() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	var next time.Time
	for _, sv := range t.mu.services {
		if len(sv.kept) > 0 && (next.IsZero() || sv.until.Before(next)) {
			next = sv.until
		}
	}
	return next
}

// Expire ends every last resort whose grace is over at now, and returns
// the services whose last resort it ended.
func (t *Tracker) Expire(now time.Time) []string {
	var due []event
	var ended []string
	t.mu.Lock()
	for name, sv := range t.mu.services {
		n := len(due)
		due = t.expire(name, sv, now, due)
		if len(due) > n {
			ended = append(ended, name)
		}
		sv.prune(now, t.cfg.Window)
		t.store(name, sv)
	}
	t.mu.Unlock()
	t.call(due)
	slices.Sort(ended)
	return ended
}

// Forget drops all the Tracker holds of service: its last resort ends
// (EndForgotten) and earlier vanishings no longer count.
func (t *Tracker) Forget(service string) {
	var due []event
	t.mu.Lock()
	if sv := t.mu.services[service]; sv != nil {
		if len(sv.kept) > 0 {
			due = t.ended(service, EndForgotten, due)
		}
		delete(t.mu.services, service)
	}
	t.mu.Unlock()
	t.call(due)
}

// Stats returns the Tracker's counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.mu.stats
	s.Ended = make(map[EndReason]int64, len(t.mu.stats.Ended))
	for k, v := range t.mu.stats.Ended {
		s.Ended[k] = v
	}
	return s
}

// expire ends sv's last resort if its grace is over at now. The caller
// holds mu.
func (t *Tracker) expire(name string, sv *track, now time.Time, due []event) []event {
	if len(sv.kept) > 0 && !now.Before(sv.until) {
		sv.kept, sv.until = nil, time.Time{}
		due = t.ended(name, EndGrace, due)
	}
	return due
}

func (t *Tracker) ended(name string, why EndReason, due []event) []event {
	t.mu.stats.Ended[why]++
	return append(due, event{service: name, why: why})
}

// store keeps sv, or forgets a service with nothing left to remember, so
// a Tracker's size follows its incidents, not every service it saw.
func (t *Tracker) store(name string, sv *track) {
	if len(sv.kept) == 0 && len(sv.recent) == 0 {
		delete(t.mu.services, name)
		return
	}
	t.mu.services[name] = sv
}

func (t *Tracker) call(due []event) {
	for _, e := range due {
		if e.start {
			if t.cfg.OnStart != nil {
				t.cfg.OnStart(e.service, e.kept, e.until)
			}
		} else if t.cfg.OnEnd != nil {
			t.cfg.OnEnd(e.service, e.why)
		}
	}
}

// prune forgets the vanishings older than window.
func (sv *track) prune(now time.Time, window time.Duration) {
	i := 0
	for i < len(sv.recent) && now.Sub(sv.recent[i].at) >= window {
		i++
	}
	sv.recent = sv.recent[i:]
	if len(sv.recent) == 0 {
		sv.recent = nil
	}
}

// drop forgets id, kept or recently vanished; it reports whether it was
// kept.
func (sv *track) drop(id string) bool {
	sv.recent = slices.DeleteFunc(sv.recent, func(v vanished) bool { return v.inst.Id == id })
	n := len(sv.kept)
	sv.kept = slices.DeleteFunc(sv.kept, func(in *registryv1.Instance) bool { return in.Id == id })
	return len(sv.kept) < n
}

// walk calls fn with each instance of prev not in cur (removed) and each
// of cur not in prev (added), both lists sorted by id.
func walk(prev, cur []*registryv1.Instance, fn func(removed, added *registryv1.Instance)) {
	i, j := 0, 0
	for i < len(prev) || j < len(cur) {
		switch {
		case j == len(cur) || (i < len(prev) && prev[i].Id < cur[j].Id):
			fn(prev[i], nil)
			i++
		case i == len(prev) || cur[j].Id < prev[i].Id:
			fn(nil, cur[j])
			j++
		default:
			i++
			j++
		}
	}
}

// find is the index of id in list, sorted by id.
func find(list []*registryv1.Instance, id string) (int, bool) {
	return slices.BinarySearchFunc(list, id, func(in *registryv1.Instance, id string) int { return strings.Compare(in.Id, id) })
}

// merge adds add to kept (sorted by id), the later record winning for an
// id in both, and returns the result, sorted by id.
func merge(kept, add []*registryv1.Instance) []*registryv1.Instance {
	out := slices.Clone(kept)
	for _, in := range add {
		if i, ok := find(out, in.Id); ok {
			out[i] = in
		} else {
			out = slices.Insert(out, i, in)
		}
	}
	return out
}

func routable(list []*registryv1.Instance) int {
	n := 0
	for _, in := range list {
		if record.Routable(in) {
			n++
		}
	}
	return n
}

// LastSeen is prev with, for each id, the last record of seen that has
// it in its place (added at its place by id if prev has none), sorted by
// id: the prev a caller passes to Observe when it folded into one change
// the records in seen (in the order they came) and then removed some of
// them. prev is not modified; with nothing seen it is returned as is.
func LastSeen(prev, seen []*registryv1.Instance) []*registryv1.Instance {
	if len(seen) == 0 {
		return prev
	}
	return merge(prev, seen)
}
