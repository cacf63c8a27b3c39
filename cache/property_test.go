package cache

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

var (
	propServices = []string{"a", "b", "c"}
	propIDs      = []string{"1", "2", "3", "4", "5"}
)

// propState is the model the cache is checked against: a plain map and a
// revision, folding only what the cache must accept.
type propState struct {
	c         *Cache
	rev       int64
	m         map[Key]*registryv1.Instance
	useModRev bool // records carry mod revisions (as from etcd), else 0
	stats     Stats
}

func (s *propState) drawKey(t *rapid.T) Key {
	return Key{rapid.SampledFrom(propServices).Draw(t, "service"), rapid.SampledFrom(propIDs).Draw(t, "id")}
}

// drawRecord draws a record for k written at revision rev. Without mod
// revisions its content comes from a small set, so that identical puts
// happen by chance too.
func (s *propState) drawRecord(t *rapid.T, k Key, rev int64) *registryv1.Instance {
	inst := &registryv1.Instance{
		Service: k.Service,
		Id:      k.ID,
		Address: rapid.SampledFrom([]string{"10.0.0.1:80", "10.0.0.2:80"}).Draw(t, "address"),
		Weight:  rapid.Uint32Range(1, 2).Draw(t, "weight"),
	}
	if rapid.Bool().Draw(t, "metadata") {
		inst.Metadata = map[string]string{"zone": rapid.SampledFrom([]string{"z1", "z2"}).Draw(t, "zone")}
	}
	if s.useModRev {
		inst.ModRevision = rev
	}
	return inst
}

// drawEvents draws n events starting after revision from, folding them into
// m, and returns them with the revision of the last one.
func (s *propState) drawEvents(t *rapid.T, from int64, m map[Key]*registryv1.Instance) ([]Event, int64) {
	n := rapid.IntRange(1, 8).Draw(t, "events")
	rev := from
	evs := make([]Event, 0, n)
	for range n {
		rev += rapid.Int64Range(1, 3).Draw(t, "step")
		k := s.drawKey(t)
		switch op := rapid.IntRange(0, 2).Draw(t, "op"); {
		case op == 0:
			inst := s.drawRecord(t, k, rev)
			evs = append(evs, Event{Type: Put, Service: k.Service, ID: k.ID, Instance: inst})
			m[k] = inst
		case op == 1 && m[k] != nil: // re-put an identical record
			evs = append(evs, Event{Type: Put, Instance: proto.CloneOf(m[k])})
		default:
			evs = append(evs, Event{Type: Delete, Service: k.Service, ID: k.ID})
			delete(m, k)
		}
	}
	return evs, rev
}

// drawState draws a complete state at revision rev. Each key is absent,
// kept as it is in the model (if its mod revision is at most rev), or given a new record with a mod revision in
// [minRev, rev]. The order of the result is drawn too: it must not matter.
func (s *propState) drawState(t *rapid.T, minRev, rev int64) []*registryv1.Instance {
	var out []*registryv1.Instance
	for _, svc := range propServices {
		for _, id := range propIDs {
			k := Key{svc, id}
			fate := rapid.IntRange(0, 2).Draw(t, "fate")
			if fate == 2 && minRev > rev {
				fate = 1 // no revision left for a new record: etcd's state is the model's
			}
			if fate == 1 && s.m[k] != nil && s.m[k].ModRevision > rev {
				fate = 2 // a new epoch below this record's revision cannot hold it
			}
			switch fate {
			case 0:
			case 1:
				if cur := s.m[k]; cur != nil {
					out = append(out, proto.CloneOf(cur))
				}
			case 2:
				out = append(out, s.drawRecord(t, k, rapid.Int64Range(minRev, rev).Draw(t, "modrev")))
			}
		}
	}
	return rapid.Permutation(out).Draw(t, "order")
}

func (s *propState) incremental(t *rapid.T) {
	next := maps.Clone(s.m)
	evs, rev := s.drawEvents(t, s.rev, next)
	rev += rapid.Int64Range(0, 3).Draw(t, "gap")
	s.accept(t, Batch{Revision: rev, Events: evs}, next)
}

func (s *propState) progress(t *rapid.T) {
	rev := rapid.Int64Range(max(0, s.rev-3), s.rev+3).Draw(t, "revision")
	prev := s.c.Snapshot()
	d, err := s.c.Apply(Batch{Revision: rev})
	if err != nil {
		t.Fatalf("progress at %d (cache at %d): %v", rev, s.rev, err)
	}
	if !d.Empty() || d.Reset {
		t.Fatalf("progress gave diff %s", diffString(d))
	}
	if rev <= s.rev {
		if s.c.Snapshot() != prev || d.Revision != s.rev {
			t.Fatalf("progress at %d <= %d changed the cache (diff %s)", rev, s.rev, diffString(d))
		}
		return
	}
	s.stats.Applied++
	s.rev = rev
	s.check(t, prev, d, Batch{Revision: rev})
}

func (s *propState) reset(t *rapid.T) {
	rev := s.rev + rapid.Int64Range(0, 10).Draw(t, "advance")
	b := Batch{Revision: rev, Snapshot: true, Reset: rapid.Bool().Draw(t, "reset")}
	b.Instances = s.drawState(t, s.rev+1, rev)
	if b.Reset {
		s.stats.Resets++
	}
	s.accept(t, b, stateMap(b.Instances))
}

func (s *propState) newEpoch(t *rapid.T) {
	rev := rapid.Int64Range(1, s.rev+5).Draw(t, "revision")
	b := Batch{Revision: rev, Snapshot: true, Reset: true, NewEpoch: true}
	b.Instances = s.drawState(t, 1, rev) // mod revisions may collide with the old epoch's
	s.stats.Resets++
	s.stats.NewEpochs++
	s.accept(t, b, stateMap(b.Instances))
}

func (s *propState) stale(t *rapid.T) {
	var b Batch
	if s.rev > 0 && rapid.Bool().Draw(t, "snapshot") {
		b = Batch{Revision: rapid.Int64Range(max(0, s.rev-5), s.rev-1).Draw(t, "revision"), Snapshot: true}
		b.Reset = rapid.Bool().Draw(t, "reset")
		b.Instances = s.drawState(t, 1, max(1, b.Revision))
	} else {
		from := rapid.Int64Range(max(0, s.rev-8), s.rev).Draw(t, "from")
		b.Events, b.Revision = s.drawEvents(t, from, maps.Clone(s.m))
		b.Revision = min(b.Revision, s.rev)
	}
	prev := s.c.Snapshot()
	d, err := s.c.Apply(b)
	if !errors.Is(err, ErrStale) {
		t.Fatalf("batch at %d (snapshot %v) with cache at %d: error %v, want ErrStale", b.Revision, b.Snapshot, s.rev, err)
	}
	s.stats.Stale++
	if s.c.Snapshot() != prev || !d.Empty() {
		t.Fatalf("a stale batch changed the cache (diff %s)", diffString(d))
	}
	s.checkModel(t)
}

// accept applies b, which the cache must accept, and checks that the cache
// now holds want.
func (s *propState) accept(t *rapid.T, b Batch, want map[Key]*registryv1.Instance) {
	prev := s.c.Snapshot()
	prevAll := prev.All()
	d, err := s.c.Apply(b)
	if err != nil {
		t.Fatalf("batch at %d with cache at %d: %v", b.Revision, s.rev, err)
	}
	if got := s.c.Revision(); got < s.rev && !b.NewEpoch {
		t.Fatalf("revision went down from %d to %d", s.rev, got)
	}
	s.stats.Applied++
	s.rev, s.m = b.Revision, want
	if !slices.Equal(prev.All(), prevAll) {
		t.Fatalf("the previous snapshot changed")
	}
	s.check(t, prev, d, b)
}

// check asserts that the cache equals the model and that d, applied to
// prev, yields the cache's new view, touching only the services it names.
func (s *propState) check(t *rapid.T, prev *Snapshot, d Diff, b Batch) {
	s.checkModel(t)
	cur := s.c.Snapshot()
	if d.Revision != cur.Revision() || d.Reset != b.Snapshot {
		t.Fatalf("diff revision %d reset %v; cache at %d, batch snapshot %v", d.Revision, d.Reset, cur.Revision(), b.Snapshot)
	}
	view := make(map[Key]*registryv1.Instance)
	for _, inst := range prev.All() {
		view[Key{inst.Service, inst.Id}] = inst
	}
	touched := make(map[string]bool)
	var keys []Key
	for _, k := range d.Removed {
		if view[k] == nil {
			t.Fatalf("diff removes %v, absent before", k)
		}
		delete(view, k)
		keys = append(keys, k)
	}
	for _, inst := range d.Added {
		k := Key{inst.Service, inst.Id}
		if view[k] != nil {
			t.Fatalf("diff adds %v, present before", k)
		}
		view[k] = inst
		keys = append(keys, k)
	}
	for _, inst := range d.Updated {
		k := Key{inst.Service, inst.Id}
		if view[k] == nil || proto.Equal(view[k], inst) {
			t.Fatalf("diff updates %v from %v to %v", k, view[k], inst)
		}
		view[k] = inst
		keys = append(keys, k)
	}
	for _, k := range keys {
		touched[k.Service] = true
	}
	for _, list := range [][]Key{d.Removed, keysOf(d.Added), keysOf(d.Updated)} {
		if !slices.IsSortedFunc(list, compareKeys) {
			t.Fatalf("diff list not sorted: %v", list)
		}
	}
	if slices.SortFunc(keys, compareKeys); len(slices.CompactFunc(keys, func(a, b Key) bool { return a == b })) != len(d.Removed)+len(d.Added)+len(d.Updated) {
		t.Fatalf("a key appears twice in diff %s", diffString(d))
	}
	all := cur.All()
	if len(all) != len(view) {
		t.Fatalf("previous view + diff has %d instances, cache %d", len(view), len(all))
	}
	for _, inst := range all {
		if view[Key{inst.Service, inst.Id}] != inst {
			t.Fatalf("previous view + diff has %v for %s/%s, cache %v", view[Key{inst.Service, inst.Id}], inst.Service, inst.Id, inst)
		}
	}
	for _, svc := range propServices {
		if !touched[svc] && len(prev.Instances(svc)) > 0 && !sameArray(prev.Instances(svc), cur.Instances(svc)) {
			t.Fatalf("service %s is untouched by the diff but was copied", svc)
		}
	}
}

// checkModel asserts that the cache holds exactly the model.
func (s *propState) checkModel(t *rapid.T) {
	cur := s.c.Snapshot()
	if cur.Revision() != s.rev || s.c.Revision() != s.rev {
		t.Fatalf("cache at revision %d, model at %d", cur.Revision(), s.rev)
	}
	if got := s.c.Stats(); got != s.stats {
		t.Fatalf("stats %+v, want %+v", got, s.stats)
	}
	all := cur.All()
	if len(all) != len(s.m) || cur.Len() != len(s.m) {
		t.Fatalf("cache holds %d instances (Len %d), model %d", len(all), cur.Len(), len(s.m))
	}
	want := slices.SortedFunc(maps.Keys(s.m), compareKeys)
	services := make([]string, 0, len(propServices))
	for i, k := range want {
		inst := all[i]
		if (Key{inst.Service, inst.Id}) != k || !proto.Equal(inst, s.m[k]) {
			t.Fatalf("cache[%d] = %v, model %v = %v", i, inst, k, s.m[k])
		}
		if got, ok := cur.Get(k.Service, k.ID); !ok || got != inst {
			t.Fatalf("Get(%v) = %v, %v", k, got, ok)
		}
		if len(services) == 0 || services[len(services)-1] != k.Service {
			services = append(services, k.Service)
		}
	}
	if got := cur.Services(); !slices.Equal(got, services) {
		t.Fatalf("Services() = %v, want %v", got, services)
	}
	for _, svc := range propServices {
		list := cur.Instances(svc)
		if !slices.IsSortedFunc(list, func(a, b *registryv1.Instance) int { return compareID(a, b.Id) }) {
			t.Fatalf("Instances(%s) not sorted by id", svc)
		}
		for _, inst := range list {
			if inst.Service != svc {
				t.Fatalf("Instances(%s) holds %s/%s", svc, inst.Service, inst.Id)
			}
		}
	}
}

func TestApplyProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := &propState{c: New(), m: map[Key]*registryv1.Instance{}, useModRev: rapid.Bool().Draw(t, "modrev")}
		t.Repeat(map[string]func(*rapid.T){
			"incremental": s.incremental,
			"progress":    s.progress,
			"reset":       s.reset,
			"newEpoch":    s.newEpoch,
			"stale":       s.stale,
		})
	})
}

func stateMap(insts []*registryv1.Instance) map[Key]*registryv1.Instance {
	m := make(map[Key]*registryv1.Instance, len(insts))
	for _, inst := range insts {
		m[Key{inst.Service, inst.Id}] = inst
	}
	return m
}

func keysOf(insts []*registryv1.Instance) []Key {
	keys := make([]Key, len(insts))
	for i, inst := range insts {
		keys[i] = Key{inst.Service, inst.Id}
	}
	return keys
}

func compareKeys(a, b Key) int {
	if a.Service != b.Service {
		return compareStrings(a.Service, b.Service)
	}
	return compareStrings(a.ID, b.ID)
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
