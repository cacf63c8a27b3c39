package cache

import (
	"iter"
	"slices"
	"sync/atomic"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A service's instances are held as a persistent B+tree sorted by id, so
// that applying a batch copies only the nodes on the paths to the ids it
// changes (O(changes × log N)), not the whole service: a regnode applies
// one batch per group-committed Register transaction, and copying a
// 36,000-instance service on each one was a third of its CPU.
//
// Every node is immutable once the batch that made it is published. A
// batch (one writer) owns the nodes it created, stamped with its gen, and
// modifies only those in place; any other node it must change it copies
// first. Nodes with gen 0 (built in bulk, see build) are never modified.
const (
	maxLeaf = 64 // instances per leaf
	minLeaf = maxLeaf / 4
	maxKids = 64 // children per inner node
	minKids = maxKids / 4
	// fill is how full bulk-built nodes are: room for a few inserts
	// before the first split.
	fillLeaf = maxLeaf * 3 / 4
	fillKids = maxKids * 3 / 4
)

// node is a leaf (kids == nil: insts, sorted by id) or an inner node (kids,
// sorted by min; every id under kids[i] is below kids[i+1].min). All leaves
// are at the same depth. A node other than the root holds at least
// minLeaf instances or minKids children; the root leaf at least one
// instance, the root inner node at least two children.
type node struct {
	gen   uint64
	min   string // the smallest id under the node
	insts []*registryv1.Instance
	kids  []*node
}

func (n *node) leaf() bool { return n.kids == nil }

// size is the number of entries (instances or children) of n.
func (n *node) size() int {
	if n.leaf() {
		return len(n.insts)
	}
	return len(n.kids)
}

// underfull reports whether n, not the root, holds too few entries.
func (n *node) underfull() bool {
	if n.leaf() {
		return len(n.insts) < minLeaf
	}
	return len(n.kids) < minKids
}

func (n *node) overfull() bool {
	if n.leaf() {
		return len(n.insts) > maxLeaf
	}
	return len(n.kids) > maxKids
}

// fix sets n.min from its first entry; n is not empty.
func (n *node) fix() {
	if n.leaf() {
		n.min = n.insts[0].Id
	} else {
		n.min = n.kids[0].min
	}
}

// kid returns the index of the child of n (inner) whose range holds id:
// the last one whose min is at or below id, the first if id is below all.
func (n *node) kid(id string) int {
	i, _ := slices.BinarySearchFunc(n.kids, id, func(k *node, id string) int {
		if k.min <= id {
			return -1
		}
		return 1
	})
	return max(i-1, 0)
}

// list is one service's instances at one version: its tree, its count,
// and its flat form, built on first demand. A list is never empty (a
// service with no instance has no list) and never changes once published,
// except for flat, which goes once from nil to the one flat form.
type list struct {
	root *node
	n    int
	// flat is the instances in one slice, built by the first reader that
	// asks (see Snapshot.Instances). Readers race to build it without a
	// lock; the first to store wins and every later read returns its
	// slice.
	flat atomic.Pointer[[]*registryv1.Instance]
}

func (l *list) len() int {
	if l == nil {
		return 0
	}
	return l.n
}

// get returns the instance with id, if any. It allocates nothing.
func (l *list) get(id string) (*registryv1.Instance, bool) {
	if l == nil {
		return nil, false
	}
	n := l.root
	for !n.leaf() {
		n = n.kids[n.kid(id)]
	}
	i, ok := slices.BinarySearchFunc(n.insts, id, compareID)
	if !ok {
		return nil, false
	}
	return n.insts[i], true
}

// slice returns the instances sorted by id in one slice shared by every
// caller: built once per list, then read with one atomic load.
func (l *list) slice() []*registryv1.Instance {
	if l == nil {
		return nil
	}
	if l.root.leaf() {
		return slices.Clip(l.root.insts) // already flat
	}
	if p := l.flat.Load(); p != nil {
		return *p
	}
	flat := make([]*registryv1.Instance, 0, l.n)
	l.root.appendTo(&flat)
	if l.flat.CompareAndSwap(nil, &flat) {
		return flat
	}
	return *l.flat.Load() // another reader built it first: share that one
}

// appendTo appends every instance under n, in order, to out.
func (n *node) appendTo(out *[]*registryv1.Instance) {
	if n.leaf() {
		*out = append(*out, n.insts...)
		return
	}
	for _, k := range n.kids {
		k.appendTo(out)
	}
}

// all yields the instances in order, walking the tree: no allocation
// beyond the iterator itself, and no flat form built.
func (l *list) all() iter.Seq[*registryv1.Instance] {
	return func(yield func(*registryv1.Instance) bool) {
		if l != nil {
			l.root.each(yield)
		}
	}
}

func (n *node) each(yield func(*registryv1.Instance) bool) bool {
	if n.leaf() {
		for _, in := range n.insts {
			if !yield(in) {
				return false
			}
		}
		return true
	}
	for _, k := range n.kids {
		if !k.each(yield) {
			return false
		}
	}
	return true
}

// newList returns the list of flat (sorted by id, not empty), built
// bottom-up in O(len(flat)). Its leaves are windows onto flat itself, and
// flat is its flat form: the caller must never modify flat again.
func newList(flat []*registryv1.Instance) *list {
	level := make([]*node, 0, (len(flat)+fillLeaf-1)/fillLeaf)
	for _, part := range parts(len(flat), fillLeaf) {
		s := flat[part[0]:part[1]:part[1]]
		level = append(level, &node{min: s[0].Id, insts: s})
	}
	for len(level) > 1 {
		up := make([]*node, 0, (len(level)+fillKids-1)/fillKids)
		for _, part := range parts(len(level), fillKids) {
			kids := slices.Clip(level[part[0]:part[1]])
			up = append(up, &node{min: kids[0].min, kids: kids})
		}
		level = up
	}
	l := &list{root: level[0], n: len(flat)}
	l.flat.Store(&flat)
	return l
}

// parts cuts n entries into the fewest runs of at most fill (and so at
// least fill/2 when there are several), of sizes differing by at most one.
func parts(n, fill int) [][2]int {
	k := (n + fill - 1) / fill
	out := make([][2]int, k)
	lo := 0
	for i := range k {
		hi := lo + n/k
		if i < n%k {
			hi++
		}
		out[i] = [2]int{lo, hi}
		lo = hi
	}
	return out
}

// writer changes trees on behalf of one batch; see the comment on maxLeaf.
type writer struct{ gen uint64 }

// gens hands each writer a stamp no other writer of any cache has had.
var gens atomic.Uint64

func newWriter() writer { return writer{gen: gens.Add(1)} }

// own returns n if this writer made it, else a copy of n it may modify,
// with room for one more entry.
func (w writer) own(n *node) *node {
	if n.gen == w.gen {
		return n
	}
	c := &node{gen: w.gen, min: n.min}
	if n.leaf() {
		c.insts = append(make([]*registryv1.Instance, 0, len(n.insts)+1), n.insts...)
	} else {
		c.kids = append(make([]*node, 0, len(n.kids)+1), n.kids...)
	}
	return c
}

// put returns root (nil: empty) with in at its id, inserted or replacing
// the record there.
func (w writer) put(root *node, in *registryv1.Instance) *node {
	if root == nil {
		return &node{gen: w.gen, min: in.Id, insts: []*registryv1.Instance{in}}
	}
	n, right := w.set(root, in)
	if right == nil {
		return n
	}
	return &node{gen: w.gen, min: n.min, kids: []*node{n, right}}
}

// set puts in under n, returning n's owned replacement and, if that
// overflowed, the new node holding its upper half.
func (w writer) set(n *node, in *registryv1.Instance) (*node, *node) {
	n = w.own(n)
	if n.leaf() {
		i, found := slices.BinarySearchFunc(n.insts, in.Id, compareID)
		if found {
			n.insts[i] = in
			return n, nil
		}
		n.insts = slices.Insert(n.insts, i, in)
	} else {
		i := n.kid(in.Id)
		kid, right := w.set(n.kids[i], in)
		n.kids[i] = kid
		if right != nil {
			n.kids = slices.Insert(n.kids, i+1, right)
		}
	}
	n.fix()
	if !n.overfull() {
		return n, nil
	}
	return n, w.split(n)
}

// split moves the upper half of n (owned) into a new node it returns.
func (w writer) split(n *node) *node {
	r := &node{gen: w.gen}
	if n.leaf() {
		h := len(n.insts) / 2
		r.insts = append(make([]*registryv1.Instance, 0, len(n.insts)-h+1), n.insts[h:]...)
		clear(n.insts[h:]) // the copy's pointers only: n is owned
		n.insts = n.insts[:h]
	} else {
		h := len(n.kids) / 2
		r.kids = append(make([]*node, 0, len(n.kids)-h+1), n.kids[h:]...)
		clear(n.kids[h:])
		n.kids = n.kids[:h]
	}
	r.fix()
	return r
}

// remove returns root without id (which it holds), nil if that empties it.
func (w writer) remove(root *node, id string) *node {
	n := w.del(root, id)
	for !n.leaf() && len(n.kids) == 1 {
		n = n.kids[0] // the root's children merged into one: one level less
	}
	if n.leaf() && len(n.insts) == 0 {
		return nil
	}
	return n
}

// del removes id (present) from under n, returning n's owned replacement,
// which may be underfull, or an empty leaf: its parent rebalances it.
func (w writer) del(n *node, id string) *node {
	n = w.own(n)
	if n.leaf() {
		i, found := slices.BinarySearchFunc(n.insts, id, compareID)
		if !found {
			return n
		}
		n.insts = slices.Delete(n.insts, i, i+1)
		if len(n.insts) > 0 {
			n.fix()
		}
		return n
	}
	i := n.kid(id)
	kid := w.del(n.kids[i], id)
	n.kids[i] = kid
	if kid.underfull() && len(n.kids) > 1 {
		w.rebalance(n, i)
	}
	n.fix()
	return n
}

// rebalance mends n.kids[i] (underfull) with a neighbour: the two are
// joined, and if that is too many entries for one node, cut evenly in two
// again (each then at least half full).
func (w writer) rebalance(n *node, i int) {
	a := i
	if a == len(n.kids)-1 {
		a-- // the last child joins its left neighbour
	}
	l, r := w.own(n.kids[a]), n.kids[a+1]
	if l.leaf() {
		l.insts = append(l.insts, r.insts...)
	} else {
		l.kids = append(l.kids, r.kids...)
	}
	l.fix()
	n.kids[a] = l
	if l.overfull() {
		n.kids[a+1] = w.split(l)
		return
	}
	n.kids = slices.Delete(n.kids, a+1, a+2)
}
