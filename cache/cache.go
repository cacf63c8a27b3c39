package cache

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// ErrStale is wrapped by Apply's error when it refuses a batch older than
// the cache (or an incremental batch at the cache's own revision: already
// applied). A refused batch changes nothing and is counted in Stats.Stale.
var ErrStale = errors.New("stale batch")

// Stats are the cache's counters since New. Each only grows.
type Stats struct {
	// Applied counts accepted batches that moved the cache: incremental
	// batches, progress batches that advanced the revision, and snapshots.
	Applied uint64
	// Stale counts batches refused with ErrStale.
	Stale uint64
	// Resets counts accepted snapshots marked Reset or NewEpoch.
	Resets uint64
	// NewEpochs counts accepted snapshots marked NewEpoch.
	NewEpochs uint64
	// Invalid counts events and snapshot entries skipped as malformed (see
	// Event and Batch.Instances).
	Invalid uint64
}

// Cache is the local view of the registry. The zero value is an empty cache
// at revision 0, ready to use; New returns one too.
//
// Apply is meant to be called by one goroutine at a time (the watcher that
// feeds the cache); concurrent calls are serialized by a mutex, so they are
// safe but their order is arbitrary. Every read method may be called from
// any goroutine at any time: reads take no lock and see the last published
// Snapshot in full.
type Cache struct {
	mu  sync.Mutex // serializes Apply
	cur atomic.Pointer[Snapshot]

	applied, stale, resets, newEpochs, invalid atomic.Uint64
}

// New returns an empty cache at revision 0.
func New() *Cache { return &Cache{} }

// Apply applies b and returns what it changed.
//
//   - Incremental (events, !Snapshot): refused with ErrStale unless
//     b.Revision is above the cache's revision; the events are applied in
//     order and the Diff holds their net effect.
//   - Progress (no events, !Snapshot): a revision at or below the cache's is
//     a no-op with a nil error and an empty Diff at the current revision; a
//     higher one advances the revision with an empty Diff.
//   - Snapshot: refused with ErrStale if b.Revision is below the cache's
//     revision, unless b.NewEpoch; otherwise b.Instances replaces
//     everything, and instances absent from it are reported Removed.
//
// A refused batch changes nothing. An accepted one is published atomically:
// readers see all of it or none of it. Apply never modifies b or the
// instances in it, and keeps them: the caller must not modify them either.
func (c *Cache) Apply(b Batch) (Diff, error) {
	st, err := c.ApplyStep(b)
	return st.Diff, err
}

// Step is what one accepted Apply did: the view it started from (Prev)
// and the one it published (Next, Prev itself for a no-op), what changed
// (Diff), and what it counted. Apply is a function of the view and the
// batch alone, so another cache whose view is Prev would make the same
// step: Replay takes it there without computing it again.
type Step struct {
	Prev, Next *Snapshot
	Diff       Diff
	counts     stepCounts
}

// stepCounts is what a Step adds to a cache's Stats.
type stepCounts struct {
	applied, resets, newEpochs, invalid uint64
}

// ApplyStep is Apply, returning the whole Step (a zero Step, with a nil
// Prev, for a refused batch).
func (c *Cache) ApplyStep(b Batch) (Step, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.load()
	var (
		next *Snapshot
		d    Diff
		n    stepCounts
	)
	switch {
	case b.Snapshot:
		if b.Revision < prev.revision && !b.NewEpoch {
			return c.refuse(b, prev)
		}
		net := make(netChanges, len(prev.services))
		for svc, l := range prev.services {
			for in := range l.all() {
				if !brokenKeepOnReset {
					net.set(Key{svc, in.Id}, nil)
				}
			}
		}
		for _, in := range b.Instances {
			if in == nil || in.Service == "" || in.Id == "" {
				n.invalid++
				continue
			}
			net.set(Key{in.Service, in.Id}, in)
		}
		next, d = build(prev, b.Revision, net, true, !b.NewEpoch)
		if b.Reset || b.NewEpoch {
			n.resets++
		}
		if b.NewEpoch {
			n.newEpochs++
		}
	case len(b.Events) == 0:
		if b.Revision <= prev.revision {
			return Step{Prev: prev, Next: prev, Diff: Diff{Revision: prev.revision}}, nil
		}
		next = &Snapshot{revision: b.Revision, services: prev.services, names: prev.names, n: prev.n}
		d = Diff{Revision: b.Revision}
	default:
		if b.Revision <= prev.revision {
			return c.refuse(b, prev)
		}
		net := make(netChanges)
		for _, ev := range b.Events {
			k, in, ok := keyOf(ev)
			if !ok {
				n.invalid++
				continue
			}
			net.set(k, in)
		}
		next, d = build(prev, b.Revision, net, false, true)
	}
	n.applied = 1
	c.cur.Store(next)
	c.count(n)
	return Step{Prev: prev, Next: next, Diff: d, counts: n}, nil
}

// Replay takes st, a Step another cache made, if this cache's view is
// st.Prev: it publishes st.Next and counts what Apply would have, in
// O(1), and reports true. Otherwise it changes nothing and reports false
// (apply the batch instead). Caches that follow one source this way
// share its snapshots.
func (c *Cache) Replay(st Step) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.Prev == nil || c.load() != st.Prev {
		return false
	}
	if st.Next != st.Prev {
		c.cur.Store(st.Next)
	}
	c.count(st.counts)
	return true
}

// Seed is the Step from the view of a new cache to c's current view, as
// Apply of that view as a snapshot would make it (every instance Added):
// a new cache Replays it to hold c's view, sharing its snapshot, so
// that c's later Steps replay on it too.
func (c *Cache) Seed() Step {
	snap := c.load()
	d := Diff{Revision: snap.revision, Reset: true}
	if snap.n > 0 {
		d.Added = snap.All()
	}
	return Step{Prev: emptySnapshot, Next: snap, Diff: d, counts: stepCounts{applied: 1}}
}

func (c *Cache) count(n stepCounts) {
	if n.applied != 0 {
		c.applied.Add(n.applied)
	}
	if n.resets != 0 {
		c.resets.Add(n.resets)
	}
	if n.newEpochs != 0 {
		c.newEpochs.Add(n.newEpochs)
	}
	if n.invalid != 0 {
		c.invalid.Add(n.invalid)
	}
}

func (c *Cache) refuse(b Batch, prev *Snapshot) (Step, error) {
	c.stale.Add(1)
	return Step{}, fmt.Errorf("%w: batch at revision %d, cache at revision %d", ErrStale, b.Revision, prev.revision)
}

// load returns the current snapshot, never nil.
func (c *Cache) load() *Snapshot {
	if s := c.cur.Load(); s != nil {
		return s
	}
	return emptySnapshot
}

// Snapshot returns the current view. It never changes: hold it to make
// several reads at one revision.
func (c *Cache) Snapshot() *Snapshot { return c.load() }

// Revision returns the revision of the current view.
func (c *Cache) Revision() int64 { return c.load().revision }

// Instances returns service's instances in the current view, sorted by id,
// nil if it has none. It takes no lock; the slice is shared with every
// reader, and callers must not modify it or its instances. See
// Snapshot.Instances for when it allocates (once per version of a large
// service) and Snapshot.Count, Get and Each for reads that never do.
func (c *Cache) Instances(service string) []*registryv1.Instance {
	return c.load().Instances(service)
}

// Get returns the instance service/id in the current view, and whether it
// exists. The instance is shared and must not be modified.
func (c *Cache) Get(service, id string) (*registryv1.Instance, bool) {
	return c.load().Get(service, id)
}

// Services returns the names of the services with at least one instance in
// the current view, sorted, in a fresh slice.
func (c *Cache) Services() []string { return c.load().Services() }

// Len returns the number of instances in the current view.
func (c *Cache) Len() int { return c.load().n }

// Stats returns the counters. Each is read atomically; the set is not one
// consistent cut while an Apply runs.
func (c *Cache) Stats() Stats {
	return Stats{
		Applied:   c.applied.Load(),
		Stale:     c.stale.Load(),
		Resets:    c.resets.Load(),
		NewEpochs: c.newEpochs.Load(),
		Invalid:   c.invalid.Load(),
	}
}
