package fanout

import (
	"sync"
	"weak"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// feed is the subscribers of one service ("" for all services): the hub
// pushes a transaction's unit to the feeds of the services it touches
// only, and every subscriber of a feed shares its units and snapshots.
//
// Lock order: Hub.mu, then feed.mu, then Sub.mu; snapMu is taken alone.
type feed struct {
	service string
	store   *store // the hub's elements, shared by every feed

	mu   sync.Mutex
	subs map[*Sub]struct{}

	// snapMu serializes building snapshots of this feed, so that
	// subscribers resetting together encode it once and share it.
	snapMu sync.Mutex
	// body is the last snapshot body built: the feed's instances, each
	// encoded once (elements shared with the hub's store).
	body *snapshotBody
	// snaps are the snapshot units still being sent, at one revision and
	// epoch, one per flags. Weak: a unit's chunks (a copy of the body)
	// live only while some subscriber holds the unit.
	snaps []weak.Pointer[Unit]
}

func newFeed(service string, st *store) *feed {
	return &feed{service: service, store: st, subs: map[*Sub]struct{}{}}
}

// snapshot returns the snapshot unit of the feed's service in snap, at
// epoch ep, with the given flags: the same *Unit for every caller asking
// for the same revision, epoch and flags, and instances encoded once per
// change of the instance (see snapshotBody). snap and ep must have been
// read together under Hub.mu.
func (f *feed) snapshot(snap *cache.Snapshot, ep string, reset, newEpoch bool) (*Unit, error) {
	f.snapMu.Lock()
	defer f.snapMu.Unlock()
	rev := snap.Revision()
	live := f.snaps[:0]
	var found *Unit
	for _, w := range f.snaps {
		u := w.Value()
		if u == nil || u.b.Revision != rev || u.b.Epoch != ep {
			continue // collected, or of another revision: never asked again
		}
		live = append(live, w)
		if u.b.Reset == reset && u.b.NewEpoch == newEpoch {
			found = u
		}
	}
	clear(f.snaps[len(live):])
	f.snaps = live
	if found != nil {
		return found, nil
	}
	var (
		services [][]*registryv1.Instance
		insts    []*registryv1.Instance
	)
	if f.service == "" {
		for _, name := range snap.Services() {
			services = append(services, snap.Instances(name))
		}
		insts = snap.All()
	} else {
		insts = snap.Instances(f.service)
		services = [][]*registryv1.Instance{insts}
	}
	body, err := newBody(services, f.body, f.store, ep, rev)
	if err != nil {
		return nil, err
	}
	f.body = body
	u := &Unit{b: cache.Batch{Revision: rev, Epoch: ep, Snapshot: true, Reset: reset, NewEpoch: newEpoch, Instances: insts}, body: body}
	f.snaps = append(f.snaps, weak.Make(u))
	return u, nil
}
