package cache

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// lid is the id of the i-th instance of the list tests: sorted as i is.
func lid(i int) string { return fmt.Sprintf("k%06d", i) }

// linst is the record of id i written at revision rev.
func linst(i int, rev int64) *registryv1.Instance { return in("s", lid(i), "10.0.0.1:80", rev) }

// fataler is what checkTree and editModel need of a *testing.T or a
// *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkTree fails t unless l is a well-formed tree holding exactly want
// (sorted by id; nil l for none): every leaf at one depth, each node within
// its size bounds (the root's looser), entries sorted, each min exact, and
// every read (slice, all, get, len) agreeing. It returns l's height.
func checkTree(t fataler, l *list, want []*registryv1.Instance) int {
	t.Helper()
	if l == nil {
		if len(want) != 0 {
			t.Fatalf("list is nil, want %d instances", len(want))
		}
		return 0
	}
	if l.root == nil {
		t.Fatalf("list with a nil root")
	}
	height := -1
	var walk func(n *node, depth int, root bool) int
	walk = func(n *node, depth int, root bool) int {
		switch {
		case n.leaf() && root && len(n.insts) == 0:
			t.Fatalf("empty root leaf")
		case !n.leaf() && root && len(n.kids) < 2:
			t.Fatalf("root inner node with %d children", len(n.kids))
		case !root && n.leaf() && len(n.insts) < minLeaf, !root && !n.leaf() && len(n.kids) < minKids:
			t.Fatalf("depth %d: node with %d entries, under the minimum", depth, n.size())
		case n.leaf() && len(n.insts) > maxLeaf, !n.leaf() && len(n.kids) > maxKids:
			t.Fatalf("depth %d: node with %d entries, over the maximum", depth, n.size())
		}
		if n.leaf() {
			if height == -1 {
				height = depth
			} else if depth != height {
				t.Fatalf("leaves at depths %d and %d", height, depth)
			}
			for i := 1; i < len(n.insts); i++ {
				if n.insts[i-1].Id >= n.insts[i].Id {
					t.Fatalf("leaf out of order: %s before %s", n.insts[i-1].Id, n.insts[i].Id)
				}
			}
			if n.min != n.insts[0].Id {
				t.Fatalf("leaf min %q, first id %q", n.min, n.insts[0].Id)
			}
			return len(n.insts)
		}
		if n.min != n.kids[0].min {
			t.Fatalf("inner min %q, first child's %q", n.min, n.kids[0].min)
		}
		count := 0
		for _, k := range n.kids {
			count += walk(k, depth+1, false)
		}
		return count
	}
	if got := walk(l.root, 0, true); got != l.n || got != len(want) {
		t.Fatalf("tree holds %d instances, n says %d, want %d", got, l.n, len(want))
	}
	var seq []*registryv1.Instance
	for in := range l.all() {
		seq = append(seq, in)
	}
	flat := l.slice()
	for i, w := range want {
		if seq[i] != w || flat[i] != w {
			t.Fatalf("instance %d: all %s, slice %s, want %s", i, seq[i].Id, flat[i].Id, w.Id)
		}
		if got, ok := l.get(w.Id); !ok || got != w {
			t.Fatalf("get(%s) = %v, %v", w.Id, got, ok)
		}
	}
	if len(flat) != len(want) || l.len() != len(want) {
		t.Fatalf("slice holds %d, len %d, want %d", len(flat), l.len(), len(want))
	}
	return height + 1
}

// fromModel returns m's instances sorted by id.
func fromModel(m map[string]*registryv1.Instance) []*registryv1.Instance {
	out := make([]*registryv1.Instance, 0, len(m))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[id])
	}
	return out
}

// build0 returns a list of ids 0..n-1, written at revision 1, built in
// bulk (as a snapshot builds it), and its model.
func build0(n int) (*list, map[string]*registryv1.Instance) {
	m := map[string]*registryv1.Instance{}
	flat := make([]*registryv1.Instance, n)
	for i := range flat {
		flat[i] = linst(i, 1)
		m[flat[i].Id] = flat[i]
	}
	if n == 0 {
		return nil, m
	}
	return newList(flat), m
}

// editModel applies ch to l through the tree path and to m, checking the
// diff against the model, and returns the new list.
func editModel(t fataler, l *list, m map[string]*registryv1.Instance, ch []change) *list {
	t.Helper()
	slices.SortFunc(ch, func(a, b change) int { return strings.Compare(a.id, b.id) })
	var d Diff
	next, changed := edit("s", l, ch, true, &d)
	var added, updated, removed int
	for _, c := range ch {
		cur, had := m[c.id]
		switch {
		case c.inst == nil && had:
			removed++
			delete(m, c.id)
		case c.inst != nil && !had:
			added++
			m[c.id] = c.inst
		case c.inst != nil && cur.ModRevision != c.inst.ModRevision:
			updated++
			m[c.id] = c.inst
		}
	}
	if len(d.Added) != added || len(d.Updated) != updated || len(d.Removed) != removed {
		t.Fatalf("diff +%d ~%d -%d, want +%d ~%d -%d", len(d.Added), len(d.Updated), len(d.Removed), added, updated, removed)
	}
	if changed != (added+updated+removed > 0) {
		t.Fatalf("changed = %v with +%d ~%d -%d", changed, added, updated, removed)
	}
	if !changed && next != l {
		t.Fatalf("an edit that changed nothing returned a new list")
	}
	return next
}

// TestListProperties drives the tree through random batches (puts and
// deletes anywhere, runs of inserts and deletes that fill and empty whole
// leaves) and checks after each one that it is well formed and holds the
// model, and that every earlier version still holds what it held.
func TestListProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const space = 20_000
		l, m := build0(rapid.IntRange(0, 10_000).Draw(t, "n"))
		checkTree(t, l, fromModel(m))
		type version struct {
			l    *list
			want []*registryv1.Instance
		}
		var old []version
		rev := int64(1)
		for range rapid.IntRange(1, 12).Draw(t, "batches") {
			rev++
			seen := map[string]bool{}
			var ch []change
			add := func(i int, putIt bool) {
				if seen[lid(i)] {
					return
				}
				seen[lid(i)] = true
				c := change{id: lid(i)}
				if putIt {
					c.inst = linst(i, rev)
				}
				ch = append(ch, c)
			}
			switch rapid.IntRange(0, 2).Draw(t, "kind") {
			case 0: // scattered puts and deletes
				for range rapid.IntRange(1, 300).Draw(t, "changes") {
					add(rapid.IntRange(0, space-1).Draw(t, "id"), rapid.Bool().Draw(t, "put"))
				}
			case 1: // a run of deletes: whole leaves and their parents emptied
				lo := rapid.IntRange(0, space-1).Draw(t, "from")
				for i := lo; i < min(space, lo+rapid.IntRange(1, 5_000).Draw(t, "run")); i++ {
					add(i, false)
				}
			case 2: // a run of inserts: leaves split, and their parents
				lo := rapid.IntRange(0, space-1).Draw(t, "from")
				for i := lo; i < min(space, lo+rapid.IntRange(1, 5_000).Draw(t, "run")); i++ {
					add(i, true)
				}
			}
			old = append(old, version{l, fromModel(m)})
			l = editModel(t, l, m, ch)
			checkTree(t, l, fromModel(m))
		}
		for i, v := range old {
			if v.l != nil {
				t.Logf("version %d", i)
				checkTree(t, v.l, v.want)
			}
		}
	})
}

// TestListLeafSplit fills one leaf to exactly maxLeaf, then puts one more
// id into it: it splits in two, the root gains a level, and the version
// before the split is untouched.
func TestListLeafSplit(t *testing.T) {
	var l *list
	m := map[string]*registryv1.Instance{}
	for i := range maxLeaf {
		l = editModel(t, l, m, []change{{lid(2 * i), linst(2*i, 2)}})
	}
	if h := checkTree(t, l, fromModel(m)); h != 1 {
		t.Fatalf("%d instances in a tree of height %d, want one leaf", maxLeaf, h)
	}
	full, fullWant := l, fromModel(m)
	l = editModel(t, l, m, []change{{lid(1), linst(1, 3)}})
	if h := checkTree(t, l, fromModel(m)); h != 2 {
		t.Fatalf("%d instances in a tree of height %d, want a root over two leaves", maxLeaf+1, h)
	}
	if len(l.root.kids) != 2 || l.root.kids[0].size()+l.root.kids[1].size() != maxLeaf+1 {
		t.Fatalf("root has %d children", len(l.root.kids))
	}
	checkTree(t, full, fullWant)
}

// twoLeaves returns a tree of a root over two leaves of a and b
// instances (ids 0..a+b-1), as a batch of another writer left it, and its
// model.
func twoLeaves(a, b int) (*list, map[string]*registryv1.Instance) {
	flat := make([]*registryv1.Instance, a+b)
	m := map[string]*registryv1.Instance{}
	for i := range flat {
		flat[i] = linst(i, 1)
		m[flat[i].Id] = flat[i]
	}
	l, r := &node{insts: flat[:a:a]}, &node{insts: flat[a:]}
	l.fix()
	r.fix()
	return &list{root: &node{min: l.min, kids: []*node{l, r}}, n: a + b}, m
}

// TestListMergeBoundaries deletes from a leaf at exactly minLeaf: it is
// joined with its neighbour, into one leaf when the two fit (and the root
// gives up its level), cut evenly in two again when they do not; a leaf at
// minLeaf+1 loses one and is left alone.
func TestListMergeBoundaries(t *testing.T) {
	for _, tc := range []struct {
		name        string
		left, right int
		del         int // the id deleted
		height      int
		leftAfter   int
		rightAfter  int
	}{
		{"left at min, joined into one", minLeaf, maxLeaf - minLeaf + 1, 0, 1, maxLeaf, 0},
		{"right at min, joined into one", maxLeaf - minLeaf + 1, minLeaf, maxLeaf, 1, maxLeaf, 0},
		{"left at min, joined then cut in two", minLeaf, maxLeaf, 3, 2, (minLeaf + maxLeaf - 1) / 2, (minLeaf + maxLeaf) / 2},
		{"left above min, alone", minLeaf + 1, maxLeaf, 0, 2, minLeaf, maxLeaf},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, m := twoLeaves(tc.left, tc.right)
			want := fromModel(m)
			checkTree(t, l, want)
			next := editModel(t, l, m, []change{{lid(tc.del), nil}})
			if h := checkTree(t, next, fromModel(m)); h != tc.height {
				t.Fatalf("height %d after the delete, want %d", h, tc.height)
			}
			if tc.height == 1 {
				if next.root.size() != tc.leftAfter {
					t.Fatalf("joined leaf holds %d, want %d", next.root.size(), tc.leftAfter)
				}
			} else if a, b := next.root.kids[0].size(), next.root.kids[1].size(); a != tc.leftAfter || b != tc.rightAfter {
				t.Fatalf("leaves hold %d and %d, want %d and %d", a, b, tc.leftAfter, tc.rightAfter)
			}
			checkTree(t, l, want) // the version before is untouched
		})
	}
}

// TestListDeleteRuns deletes a three-level tree away in runs: leaves and
// whole inner nodes emptied in one batch, the tree losing levels, then
// nothing left at all (a nil list: the service is gone).
func TestListDeleteRuns(t *testing.T) {
	const n = 20_000
	l, m := build0(n)
	if h := checkTree(t, l, fromModel(m)); h != 3 {
		t.Fatalf("%d instances in bulk: height %d, want 3", n, h)
	}
	heights := map[int]bool{}
	var ch []change
	for lo := 0; lo < n; {
		hi := min(lo+1_500, n-10) // the last ten go alone, from a root leaf
		if lo == n-10 {
			hi = n
		}
		ch = ch[:0]
		for i := lo; i < hi; i++ {
			ch = append(ch, change{lid(i), nil})
		}
		l = editModel(t, l, m, ch)
		heights[checkTree(t, l, fromModel(m))] = true
		lo = hi
	}
	if l != nil {
		t.Fatalf("deleting everything left a list of %d", l.len())
	}
	if !heights[2] || !heights[1] {
		t.Errorf("heights seen on the way down: %v, want 2 and 1 among them", heights)
	}
}

// TestListSharedAcrossVersions checks that a version stays as it was after
// later batches change its service, and that the new version copies only
// the paths to what changed: the other leaves are shared by pointer.
func TestListSharedAcrossVersions(t *testing.T) {
	l0, m := build0(36_000)
	want0 := fromModel(m)
	flat0 := l0.slice()
	l1 := editModel(t, l0, m, []change{{lid(17_000), linst(17_000, 2)}, {lid(17_001), nil}, {lid(40_000), linst(40_000, 2)}})
	want1 := fromModel(m)
	l2 := editModel(t, l1, m, []change{{lid(5), nil}, {lid(17_000), linst(17_000, 3)}})
	checkTree(t, l0, want0)
	checkTree(t, l1, want1)
	checkTree(t, l2, fromModel(m))
	if got := l0.slice(); &got[0] != &flat0[0] {
		t.Errorf("version 0's flat slice was rebuilt")
	}
	a, b := leaves(l0), leaves(l1)
	fresh := 0
	for n := range b {
		if !a[n] {
			fresh++
		}
	}
	// Three changes in at most three leaves (one may split).
	if fresh == 0 || fresh > 4 {
		t.Errorf("version 1 has %d leaves of its own out of %d, want 1 to 4", fresh, len(b))
	}
}

// TestListNoChange: puts of the records already there change nothing, and
// return the list itself.
func TestListNoChange(t *testing.T) {
	l, m := build0(1_000)
	var ch []change
	for i := 0; i < 1_000; i += 10 {
		ch = append(ch, change{lid(i), m[lid(i)]}, change{lid(i + 1_000_000), nil})
	}
	if got := editModel(t, l, m, ch); got != l {
		t.Fatalf("a batch of no-ops made a new list")
	}
}

// TestApplyPathsAgree applies the same batch to a large service by merge
// (rebuild) and by the tree (edit): the same diff, the same content.
func TestApplyPathsAgree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l, _ := build0(rapid.IntRange(1, 3_000).Draw(t, "n"))
		seen := map[string]bool{}
		var ch []change
		for range rapid.IntRange(1, 200).Draw(t, "changes") {
			i := rapid.IntRange(0, 4_000).Draw(t, "id")
			if seen[lid(i)] {
				continue
			}
			seen[lid(i)] = true
			c := change{id: lid(i)}
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				c.inst = linst(i, 2)
			case 1:
				if cur, ok := l.get(lid(i)); ok {
					c.inst = cur // the same record: no change
				}
			}
			ch = append(ch, c)
		}
		slices.SortFunc(ch, func(a, b change) int { return strings.Compare(a.id, b.id) })
		var d1, d2 Diff
		l1, c1 := rebuild("s", l, ch, true, &d1)
		l2, c2 := edit("s", l, ch, true, &d2)
		if c1 != c2 || diffString(d1) != diffString(d2) {
			t.Fatalf("rebuild: %v %s; edit: %v %s", c1, diffString(d1), c2, diffString(d2))
		}
		want := l1.slice()
		checkTree(t, l1, want)
		checkTree(t, l2, want)
	})
}

// leaves returns the set of l's leaves.
func leaves(l *list) map[*node]bool {
	out := map[*node]bool{}
	var walk func(n *node)
	walk = func(n *node) {
		if n.leaf() {
			out[n] = true
			return
		}
		for _, k := range n.kids {
			walk(k)
		}
	}
	walk(l.root)
	return out
}
