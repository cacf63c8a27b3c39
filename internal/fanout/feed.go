package fanout

import (
	"sync"

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

	mu   sync.Mutex
	subs map[*Sub]struct{}

	// snapMu serializes building snapshots of this feed, so that
	// subscribers resetting together encode it once and share it.
	snapMu sync.Mutex
	body   *snapshotBody // the last snapshot body built
	snaps  []*Unit       // snapshot units at one revision and epoch, by flags
}

func newFeed(service string) *feed {
	return &feed{service: service, subs: map[*Sub]struct{}{}}
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
	for _, u := range f.snaps {
		if u.b.Revision == rev && u.b.Epoch == ep && u.b.Reset == reset && u.b.NewEpoch == newEpoch {
			return u, nil
		}
	}
	var insts []*registryv1.Instance
	if f.service == "" {
		insts = snap.All()
	} else {
		insts = snap.Instances(f.service)
	}
	body := f.body
	if body == nil || !sameInstances(body.insts, insts) {
		var err error
		if body, err = newBody(insts, f.body); err != nil {
			return nil, err
		}
		f.body = body
	}
	u := &Unit{b: cache.Batch{Revision: rev, Epoch: ep, Snapshot: true, Reset: reset, NewEpoch: newEpoch, Instances: insts}, body: body}
	if len(f.snaps) > 0 && (f.snaps[0].b.Revision != rev || f.snaps[0].b.Epoch != ep) {
		clear(f.snaps)
		f.snaps = f.snaps[:0]
	}
	f.snaps = append(f.snaps, u)
	return u, nil
}

// sameInstances reports whether a and b hold the same instances in the
// same order. The cache shares a service's slice between snapshots until
// a batch touches the service, so that case costs nothing.
func sameInstances(a, b []*registryv1.Instance) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
