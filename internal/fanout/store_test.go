package fanout

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/chunk"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

var testKeys = record.NewKeys("")

// fromEtcd is what the watcher makes of a record etcd holds: the decoded
// instance and its element (record.Element). The stored value carries a
// mod_revision of its own (which etcd's overrides), so forwarded bytes
// are told from a fresh encoding by bytes.Contains.
func fromEtcd(t testing.TB, in *registryv1.Instance, createRev, modRev int64) (*registryv1.Instance, []byte) {
	t.Helper()
	v, err := record.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	v = protowire.AppendTag(v, 15, protowire.VarintType)
	v = protowire.AppendVarint(v, 987654321)
	got, err := testKeys.Decode(testKeys.Instance(in.Service, in.Id), v, createRev, modRev)
	if err != nil {
		t.Fatal(err)
	}
	return got, record.Element(fieldSnapInstances, v, createRev, modRev)
}

// listed is a snapshot batch as the watcher delivers it: insts in key
// order, each with its element.
func listed(t testing.TB, rev int64, reset bool, insts ...*registryv1.Instance) cache.Batch {
	t.Helper()
	b := cache.Batch{Revision: rev, Snapshot: true, Reset: reset, Epoch: "e1"}
	for _, in := range insts {
		got, e := fromEtcd(t, in, in.CreateRevision, in.ModRevision)
		b.Instances, b.Encoded = append(b.Instances, got), append(b.Encoded, e)
	}
	return b
}

func rec(service, id string, v int, createRev, modRev int64) *registryv1.Instance {
	in := inst(service, id, v)
	in.CreateRevision, in.ModRevision = createRev, modRev
	return in
}

// decodeUnit joins u's chunks back into one WatchResponse.
func decodeUnit(t testing.TB, u *Unit) (*registryv1.WatchResponse, [][]byte) {
	t.Helper()
	chunks, err := u.Chunks()
	if err != nil {
		t.Fatal(err)
	}
	var j chunk.Joiner
	for i, c := range chunks {
		var r registryv1.WatchResponse
		if err := proto.Unmarshal(c, &r); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		w, err := j.Add(&r)
		if err != nil {
			t.Fatal(err)
		}
		if (w != nil) != (i == len(chunks)-1) {
			t.Fatalf("chunk %d of %d completes the unit: %v", i, len(chunks), w != nil)
		}
		if w != nil {
			return w, chunks
		}
	}
	t.Fatal("no chunk")
	return nil, nil
}

// contains reports whether any chunk holds e's Instance bytes verbatim.
func contains(chunks [][]byte, e []byte) bool {
	p := record.ElementPayload(e)
	for _, c := range chunks {
		if bytes.Contains(c, p) {
			return true
		}
	}
	return false
}

func sameInsts(t testing.TB, what string, got, want []*registryv1.Instance) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d instances, want %d", what, len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s: instance %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// A snapshot, a relist and a put all go out as the stored bytes the
// watcher forwarded, not encoded again: the snapshot's elements are the
// batch's very slices (shared by every feed), the relist's changes carry
// its bytes, a reset snapshot after it takes the relist's bytes even for
// the records the cache kept (same mod revision), a put's unit and the
// next snapshot carry the put's bytes;
// and all of it decodes to the instances. What came without bytes is
// encoded, and decodes the same.
func TestRelistAndPutsForwardStoredBytes(t *testing.T) {
	h := newHub(Config{RingSize: 100, QueueSize: 16, CatchUpTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	newer := rec("orders", "o-3", 1, 4, 4)
	newer.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "newer schema"))
	big := rec("orders", "o-4", 1, 5, 5)
	big.Metadata = map[string]string{"blob": strings.Repeat("b", record.MaxMetaValueLen)}
	first := listed(t, 10, false, rec("orders", "o-1", 1, 2, 2), rec("orders", "o-2", 1, 3, 3), newer, big,
		rec("users", "u-1", 1, 6, 6), rec("users", "u-2", 1, 7, 7))
	mustApply(t, h, first)

	s := subscribe(t, h, "orders", 0)
	u := next(t, s)
	w, chunks := decodeUnit(t, u)
	sameInsts(t, "orders snapshot", w.GetSnapshot().GetInstances(), first.Instances[:4])
	for i, e := range u.body.parts[0].elems {
		if &e[0] != &first.Encoded[i][0] || !contains(chunks, e) {
			t.Fatalf("orders instance %d: not the watcher's bytes", i)
		}
	}
	all := next(t, subscribe(t, h, "", 0))
	sameInsts(t, "all-services snapshot", all.Batch().Instances, first.Instances)
	if all.body.parts[0] != u.body.parts[0] {
		t.Fatal("the all-services feed holds a second copy of orders' elements")
	}

	// The relist: every record decoded again (new pointers), o-2 changed.
	relist := listed(t, 20, true, rec("orders", "o-1", 1, 2, 2), rec("orders", "o-2", 2, 3, 15), newer, big,
		rec("users", "u-1", 1, 6, 6), rec("users", "u-2", 1, 7, 7))
	mustApply(t, h, relist)
	// The subscriber gets what changed (o-2), as the relist's bytes.
	u1 := next(t, s)
	w1, chunks1 := decodeUnit(t, u1)
	if got := w1.GetEvents().GetEvents(); w1.Revision != 20 || len(got) != 1 || got[0].GetId() != "o-2" ||
		!proto.Equal(got[0].GetInstance(), relist.Instances[1]) {
		t.Fatalf("after the relist: %v, want the put of o-2 at 20", w1)
	}
	if !contains(chunks1, relist.Encoded[1]) {
		t.Fatal("the relist's put of o-2 went out encoded again, not as its stored bytes")
	}
	// A reset snapshot after the relist takes the relist's bytes, even for
	// the records the cache kept (same mod revision).
	u2 := next(t, subscribe(t, h, "orders", 1))
	w2, chunks2 := decodeUnit(t, u2)
	if !w2.GetSnapshot().GetReset_() || w2.Revision != 20 {
		t.Fatalf("a resume from before the relist: %v, want a reset snapshot at 20", w2)
	}
	sameInsts(t, "reset snapshot", w2.GetSnapshot().GetInstances(), relist.Instances[:4])
	for i, e := range u2.body.parts[0].elems {
		if &e[0] != &relist.Encoded[i][0] || !contains(chunks2, e) {
			t.Fatalf("reset: orders instance %d is not the relist's bytes", i)
		}
	}

	// A put: its unit carries its bytes; so does the next snapshot.
	p, pe := fromEtcd(t, rec("orders", "o-5", 1, 21, 21), 21, 21)
	mustApply(t, h, cache.Batch{Revision: 21, Events: []cache.Event{
		{Type: cache.Put, Service: "orders", ID: "o-5", Instance: p, Encoded: pe},
		{Type: cache.Put, Service: "orders", ID: "o-6", Instance: rec("orders", "o-6", 1, 21, 21)}, // no bytes: encoded
		{Type: cache.Delete, Service: "orders", ID: "o-1"},
	}})
	ev := next(t, s)
	w3, chunks3 := decodeUnit(t, ev)
	want := []*registryv1.Event{
		{Type: registryv1.Event_TYPE_PUT, Instance: p, Service: "orders", Id: "o-5"},
		{Type: registryv1.Event_TYPE_PUT, Instance: rec("orders", "o-6", 1, 21, 21), Service: "orders", Id: "o-6"},
		{Type: registryv1.Event_TYPE_DELETE, Service: "orders", Id: "o-1"},
	}
	if got := w3.GetEvents().GetEvents(); w3.Revision != 21 || len(got) != len(want) {
		t.Fatalf("events unit %v", w3)
	}
	for i, e := range w3.GetEvents().GetEvents() {
		if !proto.Equal(e, want[i]) {
			t.Fatalf("event %d is %v, want %v", i, e, want[i])
		}
	}
	if !contains(chunks3, pe) {
		t.Fatal("the put went out encoded again, not as its stored bytes")
	}
	u4 := next(t, subscribe(t, h, "orders", 0))
	w4, _ := decodeUnit(t, u4)
	wantSnap := []*registryv1.Instance{relist.Instances[1], newer, big, p, want[1].Instance}
	sameInsts(t, "snapshot after the put", w4.GetSnapshot().GetInstances(), wantSnap)
	if e := u4.body.parts[0].elems[3]; &e[0] != &pe[0] {
		t.Fatal("the snapshot after the put encoded the put's instance again")
	}
	// That part is the hub's now: the all-services feed shares it.
	all2 := next(t, subscribe(t, h, "", 0))
	if all2.body.parts[0] != u4.body.parts[0] {
		t.Fatal("the all-services feed built orders again instead of sharing its part")
	}
}

// The store gives the cache's instance the element of the snapshot's
// record for its id only when it is that record: the same pointer, or
// (the cache keeps its own pointer for a record brought again) the same
// mod and create revision within an epoch; across epochs, the pointer.
func TestStoreMatchesOnlyTheSameRecord(t *testing.T) {
	e := func(s string) []byte { return []byte(s) }
	a := rec("orders", "a", 1, 2, 5)
	for _, c := range []struct {
		name     string
		cached   *registryv1.Instance
		got      *registryv1.Instance
		newEpoch bool
		match    bool
	}{
		{"same pointer", a, a, false, true},
		{"same revisions", a, rec("orders", "a", 1, 2, 5), false, true},
		{"another mod revision", a, rec("orders", "a", 1, 2, 6), false, false},
		{"another create revision", a, rec("orders", "a", 1, 3, 5), false, false},
		{"no revision", rec("orders", "a", 1, 0, 0), rec("orders", "a", 1, 0, 0), false, false},
		{"new epoch, same revisions, other content", a, rec("orders", "a", 2, 2, 5), true, false},
		{"new epoch, equal content", a, rec("orders", "a", 1, 2, 5), true, false},
		{"another id", a, rec("orders", "b", 1, 2, 5), false, false},
		{"new epoch, same pointer", a, a, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := matchPart([]*registryv1.Instance{c.cached}, run{[]*registryv1.Instance{c.got}, [][]byte{e("x")}}, c.newEpoch)
			if got := p != nil; got != c.match {
				t.Fatalf("matched %v, want %v", got, c.match)
			}
		})
	}
	// A partial match keeps only what matched, on the cache's pointers; an
	// entry without an element matches nothing.
	b, c, d := rec("orders", "b", 1, 3, 6), rec("orders", "c", 1, 4, 7), rec("orders", "d", 1, 5, 8)
	p := matchPart([]*registryv1.Instance{a, b, c, d}, run{
		[]*registryv1.Instance{rec("orders", "a", 1, 2, 5), rec("orders", "b", 2, 3, 9), c, d},
		[][]byte{e("a"), e("b"), e("c"), nil}}, false)
	if p == nil || len(p.insts) != 2 || p.insts[0] != a || p.insts[1] != c || string(p.elems[0]) != "a" || string(p.elems[1]) != "c" {
		t.Fatalf("partial match: %+v", p)
	}
	if p := matchPart([]*registryv1.Instance{a}, run{[]*registryv1.Instance{a}, [][]byte{nil}}, false); p != nil {
		t.Fatalf("an entry without an element matched: %+v", p)
	}
	// Key order (what etcd lists): each service's run is b itself.
	u := rec("users", "u", 1, 9, 9)
	inOrder := cache.Batch{Instances: []*registryv1.Instance{a, b, c, u}, Encoded: [][]byte{e("a"), e("b"), e("c"), e("u")}}
	r := runsOf(inOrder)
	if len(r) != 2 || len(r["orders"].insts) != 3 || &r["orders"].insts[0] != &inOrder.Instances[0] ||
		&r["users"].elems[0] != &inOrder.Encoded[3] {
		t.Fatalf("runs of a batch in key order: %+v", r)
	}
	// Anything else is sorted, and of an id named twice the last wins.
	a2 := rec("orders", "a", 2, 2, 8)
	for name, bt := range map[string]cache.Batch{
		"repeated id":           {Instances: []*registryv1.Instance{a, a2, b, c}, Encoded: [][]byte{e("a"), e("a2"), e("b"), e("c")}},
		"out of order":          {Instances: []*registryv1.Instance{b, a2, c}, Encoded: [][]byte{e("b"), e("a2"), e("c")}},
		"a service in two runs": {Instances: []*registryv1.Instance{a2, u, b, c}, Encoded: [][]byte{e("a2"), e("u"), e("b"), e("c")}},
		"a nil entry":           {Instances: []*registryv1.Instance{a, nil, a2, b, c}, Encoded: [][]byte{e("a"), e("nil"), e("a2"), e("b"), e("c")}},
	} {
		o := runsOf(bt)["orders"]
		if len(o.insts) != 3 || o.insts[0] != a2 || string(o.elems[0]) != "a2" || o.insts[1] != b || string(o.elems[1]) != "b" || o.insts[2] != c {
			t.Fatalf("%s: orders' run is %+v", name, o)
		}
	}
	// A batch without its elements (or with them misaligned) stores none.
	st := newStore()
	snap := cache.New()
	bt := cache.Batch{Revision: 1, Snapshot: true, Instances: []*registryv1.Instance{a, b}, Encoded: [][]byte{e("a")}}
	if _, err := snap.Apply(bt); err != nil {
		t.Fatal(err)
	}
	st.reset(snap.Snapshot(), bt)
	if len(st.parts) != 0 {
		t.Fatalf("misaligned elements stored: %v", st.parts)
	}
}

// The puts remembered between two builds are bounded.
func TestStorePendingBounded(t *testing.T) {
	st := newStore()
	var b cache.Batch
	for i := range maxPending + 10 {
		in := rec("orders", fmt.Sprint("o-", i), 1, 2, 2)
		b.Events = append(b.Events, cache.Event{Type: cache.Put, Instance: in, Encoded: []byte("x")})
	}
	st.put(b)
	n := 0
	for _, l := range st.pending {
		n += len(l)
	}
	if n > maxPending || n != st.npend {
		t.Fatalf("%d pending puts (counted %d), at most %d", n, st.npend, maxPending)
	}
}

// Events units framed by hand: decode to the events (a put's instance
// from its stored bytes or encoded), each chunk within the bound unless
// one event alone exceeds it, more set on all but the last.
func TestEventsChunksFromStoredBytes(t *testing.T) {
	const maxBytes = 4000
	var (
		evs  []cache.Event
		want []*registryv1.Event
	)
	for i := range 40 {
		in := bulky(i, (i*397)%1500)
		switch i % 3 {
		case 0:
			got, e := fromEtcd(t, in, in.CreateRevision, in.ModRevision)
			evs = append(evs, cache.Event{Type: cache.Put, Service: "orders", ID: in.Id, Instance: got, Encoded: e})
			want = append(want, &registryv1.Event{Type: registryv1.Event_TYPE_PUT, Instance: got, Service: "orders", Id: in.Id})
		case 1:
			evs = append(evs, cache.Event{Type: cache.Put, Instance: in})
			want = append(want, &registryv1.Event{Type: registryv1.Event_TYPE_PUT, Instance: in})
		default:
			evs = append(evs, cache.Event{Type: cache.Delete, Service: "orders", ID: in.Id})
			want = append(want, &registryv1.Event{Type: registryv1.Event_TYPE_DELETE, Service: "orders", Id: in.Id})
		}
	}
	huge, he := fromEtcd(t, bulky(99, 5000), 1, 2)
	evs = append(evs, cache.Event{Type: cache.Put, Instance: huge, Encoded: he})
	want = append(want, &registryv1.Event{Type: registryv1.Event_TYPE_PUT, Instance: huge})
	for _, ep := range []string{"", "e-1234"} {
		u := &Unit{b: cache.Batch{Revision: 1 << 40, Epoch: ep, Events: evs}}
		chunks, err := u.encode(maxBytes)
		if err != nil {
			t.Fatal(err)
		}
		var got []*registryv1.Event
		for i, c := range chunks {
			var r registryv1.WatchResponse
			if err := proto.Unmarshal(c, &r); err != nil {
				t.Fatalf("chunk %d: %v", i, err)
			}
			last := i == len(chunks)-1
			if r.GetEvents() == nil || r.Revision != 1<<40 || r.Epoch != ep || r.GetEvents().More == last {
				t.Fatalf("chunk %d of %d: revision %d epoch %q more %v", i, len(chunks), r.Revision, r.Epoch, r.GetEvents().GetMore())
			}
			// (Not proto.Size: a stored value may carry a field that
			// etcd's revision overrides, as fromEtcd's do.)
			if len(c) > maxBytes && len(r.GetEvents().Events) > 1 {
				t.Fatalf("chunk %d is %d bytes with %d events, over %d", i, len(c), len(r.GetEvents().Events), maxBytes)
			}
			got = append(got, r.GetEvents().Events...)
		}
		if len(chunks) < 5 || len(got) != len(want) {
			t.Fatalf("%d events in %d chunks, want %d in several", len(got), len(chunks), len(want))
		}
		for i := range want {
			if !proto.Equal(got[i], want[i]) {
				t.Fatalf("event %d decodes to %v, want %v", i, got[i], want[i])
			}
		}
	}
}

// bulky is a valid record of about n bytes of metadata.
func bulky(i, n int) *registryv1.Instance {
	in := sized(i, 0)
	for k := 0; n > 0; k++ {
		in.Metadata[fmt.Sprint("blob", k)] = strings.Repeat("x", min(n, record.MaxMetaValueLen))
		n -= record.MaxMetaValueLen
	}
	return in
}

// A part built from an older snapshot, or one of another epoch, does not
// replace the one stored (a feed that took its snapshot before a relist
// and builds after it), and a kept part forgets the puts it covers only.
func TestStoreKeepsTheNewest(t *testing.T) {
	st := newStore()
	st.epoch = "e1"
	newer, older, other := &bodyPart{}, &bodyPart{}, &bodyPart{}
	st.keep("orders", newer, "e1", 5)
	st.keep("orders", older, "e1", 4)
	st.keep("orders", other, "e0", 9)
	if st.parts["orders"].p != newer {
		t.Fatal("an older part, or one of another epoch, replaced the newest")
	}
	st.put(cache.Batch{Revision: 6, Events: []cache.Event{{Type: cache.Put, Instance: rec("orders", "a", 1, 6, 6), Encoded: []byte("a")}}})
	st.put(cache.Batch{Revision: 7, Events: []cache.Event{{Type: cache.Put, Instance: rec("orders", "b", 1, 7, 7), Encoded: []byte("b")}}})
	st.keep("orders", older, "e1", 6)
	if l := st.pending["orders"]; len(l) != 1 || l[0].rev != 7 || st.npend != 1 {
		t.Fatalf("pending after a part at 6: %+v (%d)", l, st.npend)
	}
}
