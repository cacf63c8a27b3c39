package cache

import (
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func TestApply(t *testing.T) {
	a1 := in("a", "1", "x:1", 5)
	a2 := in("a", "2", "x:2", 5)
	b1 := in("b", "1", "y:1", 5)
	base := Batch{Revision: 5, Snapshot: true, Instances: []*registryv1.Instance{a1, a2, b1}}
	const baseView = "rev=5 a/1@x:1 a/2@x:2 b/1@y:1"

	tests := []struct {
		name      string
		setup     []Batch // applied first; each must succeed
		batch     Batch
		wantErr   error
		wantDiff  string
		wantView  string
		wantStats Stats
	}{
		{
			name:      "put new is added",
			batch:     Batch{Revision: 3, Events: []Event{put(in("a", "1", "x:1", 3))}},
			wantDiff:  "rev=3 +a/1@x:1",
			wantView:  "rev=3 a/1@x:1",
			wantStats: Stats{Applied: 1},
		},
		{
			name:      "put existing is updated",
			setup:     []Batch{base},
			batch:     Batch{Revision: 6, Events: []Event{put(in("a", "2", "x:9", 6))}},
			wantDiff:  "rev=6 ~a/2@x:9",
			wantView:  "rev=6 a/1@x:1 a/2@x:9 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "new mod revision with the same content is an update",
			setup:     []Batch{base},
			batch:     Batch{Revision: 6, Events: []Event{put(in("a", "2", "x:2", 6))}},
			wantDiff:  "rev=6 ~a/2@x:2",
			wantView:  "rev=6 a/1@x:1 a/2@x:2 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "delete present is removed and an empty service disappears",
			setup:     []Batch{base},
			batch:     Batch{Revision: 6, Events: []Event{del("b", "1")}},
			wantDiff:  "rev=6 -b/1",
			wantView:  "rev=6 a/1@x:1 a/2@x:2",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "delete absent reports nothing but moves the revision",
			setup:     []Batch{base},
			batch:     Batch{Revision: 6, Events: []Event{del("b", "7"), del("c", "1")}},
			wantDiff:  "rev=6",
			wantView:  "rev=6 a/1@x:1 a/2@x:2 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "identical put by mod revision is no change",
			setup:     []Batch{base},
			batch:     Batch{Revision: 6, Events: []Event{put(proto.CloneOf(a1))}},
			wantDiff:  "rev=6",
			wantView:  "rev=6 a/1@x:1 a/2@x:2 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "identical put by proto.Equal is no change",
			setup:     []Batch{{Revision: 5, Events: []Event{put(in("a", "1", "x:1", 0))}}},
			batch:     Batch{Revision: 6, Events: []Event{put(in("a", "1", "x:1", 0))}},
			wantDiff:  "rev=6",
			wantView:  "rev=6 a/1@x:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "add then delete in one batch is nothing",
			setup:     []Batch{base},
			batch:     Batch{Revision: 7, Events: []Event{put(in("c", "1", "z:1", 6)), del("c", "1")}},
			wantDiff:  "rev=7",
			wantView:  "rev=7 a/1@x:1 a/2@x:2 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "delete then put of an existing key is an update",
			setup:     []Batch{base},
			batch:     Batch{Revision: 7, Events: []Event{del("a", "1"), put(in("a", "1", "x:7", 7))}},
			wantDiff:  "rev=7 ~a/1@x:7",
			wantView:  "rev=7 a/1@x:7 a/2@x:2 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "delete then put of a new key is an add",
			setup:     []Batch{base},
			batch:     Batch{Revision: 7, Events: []Event{del("a", "3"), put(in("a", "3", "x:3", 7))}},
			wantDiff:  "rev=7 +a/3@x:3",
			wantView:  "rev=7 a/1@x:1 a/2@x:2 a/3@x:3 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:  "delete then put back the same record is nothing",
			setup: []Batch{base},
			batch: Batch{Revision: 7, Events: []Event{
				put(in("a", "1", "x:6", 6)), del("a", "1"), put(proto.CloneOf(a1)),
			}},
			wantDiff:  "rev=7",
			wantView:  "rev=7 a/1@x:1 a/2@x:2 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "two puts of a new key report the last",
			batch:     Batch{Revision: 7, Events: []Event{put(in("a", "1", "x:6", 6)), put(in("a", "1", "x:7", 7))}},
			wantDiff:  "rev=7 +a/1@x:7",
			wantView:  "rev=7 a/1@x:7",
			wantStats: Stats{Applied: 1},
		},
		{
			name:  "diff lists are sorted by service then id",
			setup: []Batch{base},
			batch: Batch{Revision: 9, Events: []Event{
				put(in("c", "2", "z:2", 6)), put(in("b", "0", "y:0", 6)), del("b", "1"),
				put(in("a", "0", "x:0", 7)), del("a", "2"), put(in("c", "1", "z:1", 8)),
				put(in("a", "1", "x:9", 9)),
			}},
			wantDiff:  "rev=9 +a/0@x:0 +b/0@y:0 +c/1@z:1 +c/2@z:2 ~a/1@x:9 -a/2 -b/1",
			wantView:  "rev=9 a/0@x:0 a/1@x:9 b/0@y:0 c/1@z:1 c/2@z:2",
			wantStats: Stats{Applied: 2},
		},
		{
			name:  "invalid events are skipped and counted",
			setup: []Batch{base},
			batch: Batch{Revision: 6, Events: []Event{
				{Type: Put, Service: "a", ID: "1"},                                // no instance
				{Type: Put, Service: "b", ID: "1", Instance: in("a", "1", "", 6)}, // key mismatch
				{Type: EventType(7), Service: "a", ID: "1"},                       // unknown type
				{Type: Delete},             // no key
				put(in("c", "", "z:0", 6)), // no id
				put(in("c", "1", "z:1", 6)),
			}},
			wantDiff:  "rev=6 +c/1@z:1",
			wantView:  "rev=6 a/1@x:1 a/2@x:2 b/1@y:1 c/1@z:1",
			wantStats: Stats{Applied: 2, Invalid: 5},
		},
		{
			name:      "delete keyed by its instance",
			setup:     []Batch{base},
			batch:     Batch{Revision: 6, Events: []Event{{Type: Delete, Instance: a2}}},
			wantDiff:  "rev=6 -a/2",
			wantView:  "rev=6 a/1@x:1 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:      "older incremental batch is stale",
			setup:     []Batch{base},
			batch:     Batch{Revision: 4, Events: []Event{put(in("c", "1", "z:1", 4))}},
			wantErr:   ErrStale,
			wantDiff:  "rev=0",
			wantView:  baseView,
			wantStats: Stats{Applied: 1, Stale: 1},
		},
		{
			name:      "incremental batch at the cache's revision is stale",
			setup:     []Batch{base},
			batch:     Batch{Revision: 5, Events: []Event{del("a", "1")}},
			wantErr:   ErrStale,
			wantDiff:  "rev=0",
			wantView:  baseView,
			wantStats: Stats{Applied: 1, Stale: 1},
		},
		{
			name:      "older progress is a no-op",
			setup:     []Batch{base},
			batch:     Batch{Revision: 3},
			wantDiff:  "rev=5",
			wantView:  baseView,
			wantStats: Stats{Applied: 1},
		},
		{
			name:      "progress at the cache's revision is a no-op",
			setup:     []Batch{base},
			batch:     Batch{Revision: 5},
			wantDiff:  "rev=5",
			wantView:  baseView,
			wantStats: Stats{Applied: 1},
		},
		{
			name:      "newer progress advances the revision",
			setup:     []Batch{base},
			batch:     Batch{Revision: 12},
			wantDiff:  "rev=12",
			wantView:  "rev=12 a/1@x:1 a/2@x:2 b/1@y:1",
			wantStats: Stats{Applied: 2},
		},
		{
			name:  "reset removes absent ones, updates changed ones, adds new ones",
			setup: []Batch{base},
			batch: Batch{Revision: 20, Snapshot: true, Reset: true, Instances: []*registryv1.Instance{
				in("c", "1", "z:1", 15), in("a", "2", "x:8", 18), proto.CloneOf(a1),
			}},
			wantDiff:  "rev=20 reset +c/1@z:1 ~a/2@x:8 -b/1",
			wantView:  "rev=20 a/1@x:1 a/2@x:8 c/1@z:1",
			wantStats: Stats{Applied: 2, Resets: 1},
		},
		{
			name:      "empty reset removes everything",
			setup:     []Batch{base},
			batch:     Batch{Revision: 20, Snapshot: true, Reset: true},
			wantDiff:  "rev=20 reset -a/1 -a/2 -b/1",
			wantView:  "rev=20",
			wantStats: Stats{Applied: 2, Resets: 1},
		},
		{
			name:      "snapshot at the cache's revision is accepted",
			setup:     []Batch{base},
			batch:     Batch{Revision: 5, Snapshot: true, Instances: []*registryv1.Instance{a1, a2}},
			wantDiff:  "rev=5 reset -b/1",
			wantView:  "rev=5 a/1@x:1 a/2@x:2",
			wantStats: Stats{Applied: 2},
		},
		{
			name: "snapshot: duplicate key, last wins; invalid entries skipped",
			batch: Batch{Revision: 5, Snapshot: true, Instances: []*registryv1.Instance{
				in("a", "1", "x:1", 4), nil, in("", "1", "", 4), in("a", "1", "x:5", 5),
			}},
			wantDiff:  "rev=5 reset +a/1@x:5",
			wantView:  "rev=5 a/1@x:5",
			wantStats: Stats{Applied: 1, Invalid: 2},
		},
		{
			name:      "older snapshot is stale",
			setup:     []Batch{base},
			batch:     Batch{Revision: 4, Snapshot: true, Reset: true, Instances: []*registryv1.Instance{a1}},
			wantErr:   ErrStale,
			wantDiff:  "rev=0",
			wantView:  baseView,
			wantStats: Stats{Applied: 1, Stale: 1},
		},
		{
			name:  "new epoch allows a lower revision and ignores colliding mod revisions",
			setup: []Batch{base, {Revision: 9, Events: []Event{put(in("a", "1", "x:9", 9))}}},
			batch: Batch{Revision: 3, Snapshot: true, NewEpoch: true, Instances: []*registryv1.Instance{
				in("a", "1", "x:3", 9), in("a", "2", "x:2", 5), in("b", "1", "y:1", 2),
			}},
			wantDiff:  "rev=3 reset ~a/1@x:3 ~b/1@y:1",
			wantView:  "rev=3 a/1@x:3 a/2@x:2 b/1@y:1",
			wantStats: Stats{Applied: 3, Resets: 1, NewEpochs: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New()
			for i, b := range tt.setup {
				if _, err := c.Apply(b); err != nil {
					t.Fatalf("setup batch %d: %v", i, err)
				}
			}
			before := c.Snapshot()
			d, err := c.Apply(tt.batch)
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Errorf("Apply error = %v, want %v", err, tt.wantErr)
			}
			if got := diffString(d); got != tt.wantDiff {
				t.Errorf("diff = %q, want %q", got, tt.wantDiff)
			}
			if got := viewString(t, c.Snapshot()); got != tt.wantView {
				t.Errorf("view = %q, want %q", got, tt.wantView)
			}
			if got := c.Stats(); got != tt.wantStats {
				t.Errorf("stats = %+v, want %+v", got, tt.wantStats)
			}
			if c.Revision() != c.Snapshot().Revision() || c.Len() != c.Snapshot().Len() {
				t.Errorf("Revision/Len %d/%d disagree with Snapshot", c.Revision(), c.Len())
			}
			if err != nil && c.Snapshot() != before {
				t.Errorf("a refused batch published a new snapshot")
			}
		})
	}
}

func TestZeroCache(t *testing.T) {
	var c Cache
	if c.Revision() != 0 || c.Len() != 0 || len(c.Services()) != 0 || c.Instances("a") != nil {
		t.Fatalf("zero cache is not empty at revision 0")
	}
	if _, err := c.Apply(Batch{Revision: 1, Events: []Event{put(in("a", "1", "x:1", 1))}}); err != nil {
		t.Fatal(err)
	}
	if got := viewString(t, c.Snapshot()); got != "rev=1 a/1@x:1" {
		t.Fatalf("view = %q", got)
	}
}

// sameArray reports whether a and b share their backing array.
func sameArray(a, b []*registryv1.Instance) bool {
	return len(a) > 0 && len(b) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

func TestCopyOnWritePerService(t *testing.T) {
	c := New()
	if _, err := c.Apply(Batch{Revision: 5, Snapshot: true, Instances: []*registryv1.Instance{
		in("a", "1", "x:1", 5), in("a", "2", "x:2", 5), in("b", "1", "y:1", 5), in("b", "2", "y:2", 5),
	}}); err != nil {
		t.Fatal(err)
	}
	s1 := c.Snapshot()
	oldA, oldB := s1.Instances("a"), s1.Instances("b")
	oldView := viewString(t, s1)

	if _, err := c.Apply(Batch{Revision: 6, Events: []Event{put(in("a", "3", "x:3", 6)), del("a", "1")}}); err != nil {
		t.Fatal(err)
	}
	if !sameArray(c.Instances("b"), oldB) {
		t.Errorf("untouched service b was copied")
	}
	if sameArray(c.Instances("a"), oldA) {
		t.Errorf("changed service a shares its array with the old snapshot")
	}
	if got := viewString(t, s1); got != oldView {
		t.Errorf("old snapshot changed: %q, was %q", got, oldView)
	}

	// A put identical to the current record changes nothing: no copy.
	s2 := c.Snapshot()
	cur, ok := c.Get("a", "2")
	if !ok {
		t.Fatal("a/2 not cached")
	}
	if _, err := c.Apply(Batch{Revision: 7, Events: []Event{put(proto.CloneOf(cur))}}); err != nil {
		t.Fatal(err)
	}
	if !sameArray(c.Instances("a"), s2.Instances("a")) || !sameArray(c.Instances("b"), oldB) {
		t.Errorf("an identical put copied a service")
	}
	if got, ok := c.Get("a", "2"); !ok || got != cur {
		t.Errorf("an identical put replaced the cached record")
	}

	// A reset that leaves b as it was keeps b's array too.
	if _, err := c.Apply(Batch{Revision: 9, Snapshot: true, Reset: true, Instances: []*registryv1.Instance{
		in("b", "1", "y:1", 5), in("b", "2", "y:2", 5), in("c", "1", "z:1", 8),
	}}); err != nil {
		t.Fatal(err)
	}
	if !sameArray(c.Instances("b"), oldB) {
		t.Errorf("a reset that left service b unchanged copied it")
	}
	if got := viewString(t, c.Snapshot()); got != "rev=9 b/1@y:1 b/2@y:2 c/1@z:1" {
		t.Errorf("view after reset = %q", got)
	}
}

// bigCache returns a cache of services s000..s099 with 50 instances each.
func bigCache(tb testing.TB) *Cache {
	tb.Helper()
	var all []*registryv1.Instance
	for s := range 100 {
		for i := range 50 {
			all = append(all, in(svcName(s), svcName(i), "10.0.0.1:80", 1))
		}
	}
	c := New()
	if _, err := c.Apply(Batch{Revision: 1, Snapshot: true, Instances: all}); err != nil {
		tb.Fatal(err)
	}
	return c
}

func svcName(i int) string {
	return string([]byte{'s', byte('0' + i/100), byte('0' + i/10%10), byte('0' + i%10)})
}

func TestReadsDoNotAllocate(t *testing.T) {
	c := bigCache(t)
	var sink []*registryv1.Instance
	if n := testing.AllocsPerRun(1000, func() { sink = c.Instances("s042") }); n != 0 {
		t.Errorf("Instances allocates %v times per call", n)
	}
	if len(sink) != 50 {
		t.Fatalf("Instances(s042) has %d instances, want 50", len(sink))
	}
	if n := testing.AllocsPerRun(1000, func() { sink = c.Instances("missing") }); n != 0 || sink != nil {
		t.Errorf("Instances of a missing service allocates %v times, returns %v", n, sink)
	}
	var ok bool
	if n := testing.AllocsPerRun(1000, func() { _, ok = c.Get("s042", "s017") }); n != 0 || !ok {
		t.Errorf("Get allocates %v times per call (found %v)", n, ok)
	}
}

func BenchmarkInstances(b *testing.B) {
	c := bigCache(b)
	b.ReportAllocs()
	var sink []*registryv1.Instance
	for b.Loop() {
		sink = c.Instances("s042")
	}
	if len(sink) != 50 {
		b.Fatal("wrong result")
	}
}

func BenchmarkInstancesParallel(b *testing.B) {
	c := bigCache(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if len(c.Instances("s042")) != 50 {
				b.Error("wrong result")
				return
			}
		}
	})
}

// BenchmarkApplyPut measures one put into a cache of 100 services × 50
// instances: the cost of copy-on-write per service.
func BenchmarkApplyPut(b *testing.B) {
	c := bigCache(b)
	b.ReportAllocs()
	rev := c.Revision()
	for b.Loop() {
		rev++
		if _, err := c.Apply(Batch{Revision: rev, Events: []Event{put(in("s042", "s017", "10.0.0.2:80", rev))}}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLargeServiceCopyOnWrite applies small batches to a service of
// 36,000 instances (where a batch edits the service's tree rather than
// rebuilding it): the snapshot before is unchanged, its flat slice is the
// one it had, the new one's is built once and then shared, and another
// service keeps its slice.
func TestLargeServiceCopyOnWrite(t *testing.T) {
	const n = 36_000
	all := []*registryv1.Instance{in("other", "1", "y:1", 1)}
	for i := range n {
		all = append(all, in("big", lid(i), "x:1", 1))
	}
	c := New()
	if _, err := c.Apply(Batch{Revision: 1, Snapshot: true, Instances: all}); err != nil {
		t.Fatal(err)
	}
	s1 := c.Snapshot()
	flat1, other1 := s1.Instances("big"), s1.Instances("other")
	view1 := viewString(t, s1)

	d, err := c.Apply(Batch{Revision: 2, Events: []Event{
		put(in("big", lid(n), "x:2", 2)), put(in("big", lid(7), "x:2", 2)), del("big", lid(20_000)),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := diffString(d); got != "rev=2 +big/"+lid(n)+"@x:2 ~big/"+lid(7)+"@x:2 -big/"+lid(20_000) {
		t.Errorf("diff = %q", got)
	}
	s2 := c.Snapshot()
	if got := viewString(t, s1); got != view1 {
		t.Errorf("the snapshot before the batch changed")
	}
	if got := s1.Instances("big"); !sameArray(got, flat1) {
		t.Errorf("the snapshot before the batch has a new flat slice")
	}
	shared := 0
	before := leaves(s1.services["big"])
	for n := range leaves(s2.services["big"]) {
		if before[n] {
			shared++
		}
	}
	if want := len(before) - 3; shared < want {
		t.Errorf("the batch's version shares %d leaves with the one before, want at least %d of %d", shared, want, len(before))
	}
	if !sameArray(s2.Instances("other"), other1) {
		t.Errorf("untouched service other was copied")
	}
	if s2.Count("big") != n || len(s2.Instances("big")) != n || s2.Len() != n+1 {
		t.Errorf("Count %d, Instances %d, Len %d; want %d, %d, %d", s2.Count("big"), len(s2.Instances("big")), s2.Len(), n, n, n+1)
	}
	if got, ok := s2.Get("big", lid(7)); !ok || got.Address != "x:2" {
		t.Errorf("Get(big, %s) = %v, %v", lid(7), got, ok)
	}
	if _, ok := s2.Get("big", lid(20_000)); ok {
		t.Errorf("deleted big/%s still there", lid(20_000))
	}
	// Built once: the next reads share it and allocate nothing.
	if a, b := s2.Instances("big"), s2.Instances("big"); !sameArray(a, b) {
		t.Errorf("two reads of one version got two slices")
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = s2.Instances("big") }); allocs != 0 {
		t.Errorf("Instances of a built version allocates %v times", allocs)
	}
	// Each stops when asked.
	seen := 0
	for inst := range s2.Each("big") {
		if seen++; seen == 3 {
			if inst.Id != lid(2) {
				t.Errorf("Each's third instance is %s", inst.Id)
			}
			break
		}
	}
	if seen != 3 {
		t.Errorf("Each yielded %d before the break", seen)
	}
	if s2.Count("missing") != 0 || s2.Instances("missing") != nil {
		t.Errorf("a missing service has instances")
	}
	for range s2.Each("missing") {
		t.Errorf("Each of a missing service yielded")
	}
}

// A cache whose view is the one another cache stepped from takes the same
// step by Replay: the very snapshot, the same diff and the same counts as
// Apply would give; one whose view is not refuses, changing nothing. Seed
// starts a new cache on another's view.
func TestReplayAndSeed(t *testing.T) {
	src, follower, applied := New(), New(), New()
	batches := []Batch{
		{Revision: 5, Snapshot: true, Instances: []*registryv1.Instance{in("a", "1", "x:1", 5), in("a", "2", "x:2", 5), nil}},
		{Revision: 6, Events: []Event{put(in("a", "3", "x:3", 6)), del("a", "1"), {Type: Put}}},
		{Revision: 6}, // progress at the same revision: a no-op step
		{Revision: 7}, // progress that moves the revision
		{Revision: 4, Events: []Event{put(in("a", "9", "x:9", 4))}}, // stale: no step
		{Revision: 9, Snapshot: true, Reset: true, Instances: []*registryv1.Instance{in("b", "1", "y:1", 9), in("b", "2", "y:2", 9)}},
	}
	for i, b := range batches {
		st, err := src.ApplyStep(b)
		want, werr := applied.Apply(b)
		if (err == nil) != (werr == nil) {
			t.Fatalf("batch %d: ApplyStep %v, Apply %v", i, err, werr)
		}
		if err != nil {
			if follower.Replay(st) {
				t.Fatalf("batch %d: a refused batch's step replayed", i)
			}
			continue
		}
		if !follower.Replay(st) {
			t.Fatalf("batch %d: the follower, on the source's view, refused its step", i)
		}
		if follower.Snapshot() != src.Snapshot() {
			t.Fatalf("batch %d: the follower does not share the source's snapshot", i)
		}
		if fmt.Sprint(st.Diff) != fmt.Sprint(want) || viewString(t, follower.Snapshot()) != viewString(t, applied.Snapshot()) {
			t.Fatalf("batch %d: step %v / view %s; Apply gave %v / %s", i, st.Diff, viewString(t, follower.Snapshot()), want, viewString(t, applied.Snapshot()))
		}
	}
	if fs, as := follower.Stats(), applied.Stats(); fs.Applied != as.Applied || fs.Resets != as.Resets || fs.Invalid != as.Invalid || fs.NewEpochs != as.NewEpochs {
		t.Fatalf("follower's stats %+v, Apply's %+v", fs, as)
	}

	// A view that went its own way refuses the source's next step.
	if _, err := applied.Apply(Batch{Revision: 10, Events: []Event{put(in("b", "3", "y:3", 10))}}); err != nil {
		t.Fatal(err)
	}
	st, err := src.ApplyStep(Batch{Revision: 10, Events: []Event{put(in("b", "4", "y:4", 10))}})
	if err != nil {
		t.Fatal(err)
	}
	before := applied.Snapshot()
	if applied.Replay(st) || applied.Snapshot() != before {
		t.Fatal("a cache not on the step's view took it")
	}

	// Seed: a new cache takes the source's view; later steps replay on it.
	fresh := New()
	seed := src.Seed()
	if !fresh.Replay(seed) || fresh.Snapshot() != src.Snapshot() || len(seed.Diff.Added) != 3 || !seed.Diff.Reset {
		t.Fatalf("seed: replayed view %s, diff %v", viewString(t, fresh.Snapshot()), seed.Diff)
	}
	if applied.Replay(src.Seed()) {
		t.Fatal("a cache with a view took a seed")
	}
	st, err = src.ApplyStep(Batch{Revision: 11, Events: []Event{del("b", "1")}})
	if err != nil || !fresh.Replay(st) || fresh.Len() != 2 {
		t.Fatalf("after the seed: %v, replayed view %s", err, viewString(t, fresh.Snapshot()))
	}
}
