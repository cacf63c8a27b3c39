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
// only those whose content changes get a new list; the top-level map is
// copied only if some service changed. trustModRev says that two records
// with the same non-zero mod revision are the same record (true within one
// etcd epoch); otherwise records are compared with proto.Equal.
func build(prev *Snapshot, rev int64, net netChanges, reset, trustModRev bool) (*Snapshot, Diff) {
	d := Diff{Revision: rev, Reset: reset}
	var (
		services   map[string]*list // copied on first change
		setChanged bool             // a service appeared or disappeared
		ch         []change
	)
	for _, svc := range slices.Sorted(maps.Keys(net)) {
		ch = ch[:0]
		for id, inst := range net[svc] {
			ch = append(ch, change{id, inst})
		}
		slices.SortFunc(ch, func(a, b change) int { return strings.Compare(a.id, b.id) })
		old := prev.services[svc]
		l, changed := apply(svc, old, ch, trustModRev, &d)
		if !changed {
			continue
		}
		if services == nil {
			services = maps.Clone(prev.services)
			if services == nil {
				services = make(map[string]*list)
			}
		}
		switch {
		case l == nil:
			delete(services, svc)
			setChanged = true
		case old == nil:
			services[svc] = l
			setChanged = true
		default:
			services[svc] = l
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

// apply applies ch (sorted by id) to old (one service's list, nil if it
// has none), appending what changed to d. It returns old itself, and false,
// when nothing changed; otherwise the new list, nil if it is empty.
//
// A batch that changes a small part of the service is applied to the tree
// in place of the old one, copying only the paths to the ids it changes; a
// batch that changes much of it (a snapshot, or a small service) is merged
// with the flat form and the tree rebuilt from the result, in O(N).
func apply(svc string, old *list, ch []change, trustModRev bool, d *Diff) (*list, bool) {
	if bulk(len(ch), old.len()) {
		return rebuild(svc, old, ch, trustModRev, d)
	}
	return edit(svc, old, ch, trustModRev, d)
}

// rebuild is apply by merging ch into old's flat form: O(N + changes).
func rebuild(svc string, old *list, ch []change, trustModRev bool, d *Diff) (*list, bool) {
	out, changed := merge(svc, old.slice(), ch, trustModRev, d)
	switch {
	case !changed:
		return old, false
	case len(out) == 0:
		return nil, true
	}
	return newList(slices.Clip(out)), true
}

// edit is apply by changing old's tree copy-on-write, one change after
// the other: O(changes × log N), the nodes a change copies being modified
// in place by the later changes of the same batch.
func edit(svc string, old *list, ch []change, trustModRev bool, d *Diff) (*list, bool) {
	w := newWriter()
	var root *node
	n := old.len()
	if old != nil {
		root = old.root
	}
	dirty := false
	for _, c := range ch {
		cur, _ := old.get(c.id) // ids in ch are distinct: old is the record before the batch
		keep := classify(svc, c.id, cur, c.inst, trustModRev, d)
		switch {
		case keep == cur:
			continue
		case keep == nil:
			root = w.remove(root, c.id)
			n--
		default:
			root = w.put(root, keep)
			if cur == nil {
				n++
			}
		}
		dirty = true
	}
	switch {
	case !dirty:
		return old, false
	case root == nil:
		return nil, true
	}
	return &list{root: root, n: n}, true
}

// bulk reports whether changes to a service of n instances are better
// merged into its flat form, and the tree rebuilt, than applied to the tree
// one by one: when they are many for its size, or the service is small.
func bulk(changes, n int) bool {
	return n <= maxLeaf || changes*8 >= n
}

// classify appends the change of one key, from cur to next (each nil when
// the key is absent), to d, and returns the record the key holds after the
// change: cur itself when next is the same record, so that an unchanged
// record keeps its pointer.
func classify(svc, id string, cur, next *registryv1.Instance, trustModRev bool, d *Diff) *registryv1.Instance {
	switch {
	case cur == nil && next == nil:
	case cur == nil:
		d.Added = append(d.Added, next)
	case next == nil:
		d.Removed = append(d.Removed, Key{svc, id})
	case same(cur, next, trustModRev):
		return cur
	default:
		d.Updated = append(d.Updated, next)
	}
	return next
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
		keep := classify(svc, c.id, cur, c.inst, trustModRev, d) // the key's record in the new list, nil if absent
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
