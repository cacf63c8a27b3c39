package cache

import (
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// netChanges is the net effect of a batch: service -> id -> the key's
// record after the batch, nil if it is absent after the batch.
type netChanges map[string]map[string]*registryv1.Instance

func (n netChanges) set(k Key, inst *registryv1.Instance) {
	m := n[k.Service]
	if m == nil {
		m = make(map[string]*registryv1.Instance)
		n[k.Service] = m
	}
	m[k.ID] = inst
}

// change is one entry of netChanges, for sorting.
type change struct {
	id   string
	inst *registryv1.Instance
}

// build returns the snapshot at rev that results from applying net to prev,
// and the diff between the two. Only the services in net are rebuilt, and
// only those whose content changes get a new slice; the top-level map is
// copied only if some service changed. trustModRev says that two records
// with the same non-zero mod revision are the same record (true within one
// etcd epoch); otherwise records are compared with proto.Equal.
func build(prev *Snapshot, rev int64, net netChanges, reset, trustModRev bool) (*Snapshot, Diff) {
	d := Diff{Revision: rev, Reset: reset}
	var (
		services   map[string][]*registryv1.Instance // copied on first change
		setChanged bool                              // a service appeared or disappeared
		ch         []change
	)
	for _, svc := range slices.Sorted(maps.Keys(net)) {
		ch = ch[:0]
		for id, inst := range net[svc] {
			ch = append(ch, change{id, inst})
		}
		slices.SortFunc(ch, func(a, b change) int { return strings.Compare(a.id, b.id) })
		old := prev.services[svc]
		list, changed := merge(svc, old, ch, trustModRev, &d)
		if !changed {
			continue
		}
		if services == nil {
			services = maps.Clone(prev.services)
			if services == nil {
				services = make(map[string][]*registryv1.Instance)
			}
		}
		switch {
		case len(list) == 0:
			delete(services, svc)
			setChanged = true
		case len(old) == 0:
			services[svc] = list
			setChanged = true
		default:
			services[svc] = list
		}
	}
	s := &Snapshot{
		revision: rev,
		services: prev.services,
		names:    prev.names,
		n:        prev.n + len(d.Added) - len(d.Removed),
	}
	if services != nil {
		s.services = services
	}
	if setChanged {
		s.names = slices.Sorted(maps.Keys(services))
	}
	return s, d
}

// merge applies ch (sorted by id) to old (one service's instances, sorted by
// id), appending what changed to d. It returns old itself, and false, when
// nothing changed; otherwise a new slice.
func merge(svc string, old []*registryv1.Instance, ch []change, trustModRev bool, d *Diff) ([]*registryv1.Instance, bool) {
	var out []*registryv1.Instance
	dirty := false
	i := 0 // old[:i] is consumed
	for _, c := range ch {
		pos, found := slices.BinarySearchFunc(old[i:], c.id, compareID)
		pos += i
		var cur *registryv1.Instance
		if found {
			cur = old[pos]
		}
		keep := c.inst // the key's record in the new list, nil if absent
		switch {
		case cur == nil && keep == nil:
		case cur == nil:
			d.Added = append(d.Added, keep)
		case keep == nil:
			d.Removed = append(d.Removed, Key{svc, c.id})
		case same(cur, keep, trustModRev):
			keep = cur
		default:
			d.Updated = append(d.Updated, keep)
		}
		switch {
		case dirty:
			out = append(out, old[i:pos]...)
		case keep != cur:
			dirty = true
			out = make([]*registryv1.Instance, 0, len(old)+puts(ch))
			out = append(out, old[:pos]...)
		}
		if dirty && keep != nil {
			out = append(out, keep)
		}
		i = pos
		if found {
			i++
		}
	}
	if !dirty {
		return old, false
	}
	return append(out, old[i:]...), true
}

// same reports whether a and b are the same record.
func same(a, b *registryv1.Instance, trustModRev bool) bool {
	if a == b {
		return true
	}
	if trustModRev && a.ModRevision != 0 && b.ModRevision != 0 {
		return a.ModRevision == b.ModRevision
	}
	return proto.Equal(a, b)
}

func puts(ch []change) int {
	n := 0
	for _, c := range ch {
		if c.inst != nil {
			n++
		}
	}
	return n
}
