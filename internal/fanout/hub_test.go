package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testHub is a hub fed by the test (no etcd, no watcher), at revision 1
// of epoch e1 with insts.
func testHub(t testing.TB, queue int, insts ...*registryv1.Instance) (*Hub, *resets) {
	t.Helper()
	r := &resets{n: map[string]int{}}
	h := newHub(Config{RingSize: 100, QueueSize: queue, CatchUpTimeout: time.Second,
		Logger: slog.New(slog.DiscardHandler), OnReset: r.add})
	mustApply(t, h, cache.Batch{Revision: 1, Snapshot: true, Epoch: "e1", Instances: insts})
	return h, r
}

type resets struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *resets) add(reason string) { r.mu.Lock(); r.n[reason]++; r.mu.Unlock() }
func (r *resets) get(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

func mustApply(t testing.TB, h *Hub, b cache.Batch) {
	t.Helper()
	if err := h.apply(b); err != nil {
		t.Fatal(err)
	}
}

func inst(service, id string, v int) *registryv1.Instance {
	return &registryv1.Instance{Service: service, Id: id, Address: "10.0.0.1:80", Weight: 100, Version: fmt.Sprint(v)}
}

func put(service, id string, v int) cache.Event {
	return cache.Event{Type: cache.Put, Service: service, ID: id, Instance: inst(service, id, v)}
}

func subscribe(t testing.TB, h *Hub, service string, from int64) *Sub {
	t.Helper()
	s, err := h.Subscribe(context.Background(), service, from, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func next(t testing.TB, s *Sub) *Unit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func queued(s *Sub) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.mu.queue) - s.mu.head
}

// A transaction is one unit per service, shared by every subscriber of
// that service, encoded once; subscribers of a service it does not touch
// get nothing queued, only the shared progress.
func TestUnitEncodedOncePerService(t *testing.T) {
	h, _ := testHub(t, 16)
	orders := []*Sub{subscribe(t, h, "orders", 0), subscribe(t, h, "orders", 0), subscribe(t, h, "orders", 0)}
	users := subscribe(t, h, "users", 0)
	all := subscribe(t, h, "", 0)
	for _, s := range append(orders, users, all) {
		if u := next(t, s); !u.Batch().Snapshot || u.Revision() != 1 {
			t.Fatalf("first unit %+v, want the snapshot at 1", u.Batch())
		}
	}
	mustApply(t, h, cache.Batch{Revision: 2, Events: []cache.Event{put("orders", "a", 1), put("users", "b", 1)}})
	first := next(t, orders[0])
	c0, err := first.Chunks()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range orders[1:] {
		u := next(t, s)
		if u != first {
			t.Fatal("subscribers of one service got different units of one transaction")
		}
		c, _ := u.Chunks()
		if &c[0][0] != &c0[0][0] {
			t.Fatal("the unit was encoded again for another subscriber")
		}
	}
	var got registryv1.WatchResponse
	if err := proto.Unmarshal(c0[0], &got); err != nil {
		t.Fatal(err)
	}
	if evs := got.GetEvents().GetEvents(); got.Revision != 2 || got.Epoch != "e1" || len(evs) != 1 || evs[0].Id != "a" || evs[0].Instance.GetId() != "a" {
		t.Fatalf("orders unit decodes to %v", &got)
	}
	if u := next(t, users); len(u.Batch().Events) != 1 || u.Batch().Events[0].ID != "b" {
		t.Fatalf("users unit %+v", u.Batch())
	}
	if u := next(t, all); len(u.Batch().Events) != 2 {
		t.Fatalf("the all-services unit holds %d events, want 2", len(u.Batch().Events))
	}

	// users only: nothing is queued for orders, whose subscribers all
	// send the one shared progress at 3.
	mustApply(t, h, cache.Batch{Revision: 3, Events: []cache.Event{put("users", "b", 2)}})
	for _, s := range orders {
		if n := queued(s); n != 0 {
			t.Fatalf("a transaction of users queued %d units for orders", n)
		}
	}
	p := next(t, orders[0])
	if p.Batch().Snapshot || len(p.Batch().Events) != 0 || p.Revision() != 3 {
		t.Fatalf("orders after a users transaction: %+v, want progress at 3", p.Batch())
	}
	for _, s := range orders[1:] {
		if u := next(t, s); u != p {
			t.Fatal("progress is not shared")
		}
	}
	// A confirmation from etcd at the same revision is progress again.
	mustApply(t, h, cache.Batch{Revision: 3})
	if u := next(t, orders[0]); u.Revision() != 3 || len(u.Batch().Events) != 0 || u.Batch().Snapshot {
		t.Fatalf("after a confirmation: %+v, want progress at 3", u.Batch())
	}
}

// A resume from a revision in the ring gets exactly the missed events of
// its service, at the hub's revision; one older than the ring a reset.
func TestResumeFromRing(t *testing.T) {
	r := &resets{n: map[string]int{}}
	h := newHub(Config{RingSize: 4, QueueSize: 16, CatchUpTimeout: time.Second, Logger: slog.New(slog.DiscardHandler), OnReset: r.add})
	mustApply(t, h, cache.Batch{Revision: 1, Snapshot: true, Epoch: "e1"})
	for rev := int64(2); rev <= 7; rev++ {
		mustApply(t, h, cache.Batch{Revision: rev, Events: []cache.Event{put("orders", fmt.Sprint("o", rev), 1), put("users", "u", int(rev))}})
	}
	// The ring holds 4 events: revisions 6 and 7, so it starts after 5.
	u := next(t, subscribe(t, h, "orders", 5))
	b := u.Batch()
	if b.Snapshot || b.Revision != 7 || len(b.Events) != 2 || b.Events[0].ID != "o6" || b.Events[1].ID != "o7" {
		t.Fatalf("resume from 5: %+v, want o6 and o7 at 7", b)
	}
	u = next(t, subscribe(t, h, "orders", 6))
	if b := u.Batch(); len(b.Events) != 1 || b.Events[0].ID != "o7" {
		t.Fatalf("resume from 6: %+v, want o7", b)
	}
	if u := next(t, subscribe(t, h, "orders", 7)); len(u.Batch().Events) != 0 || u.Revision() != 7 {
		t.Fatalf("resume from 7: %+v, want nothing at 7", u.Batch())
	}
	u = next(t, subscribe(t, h, "orders", 4))
	if b := u.Batch(); !b.Snapshot || !b.Reset || len(b.Instances) != 6 || r.get("ring") != 1 {
		t.Fatalf("resume from 4: %+v (ring resets %d), want a reset snapshot of 6", b, r.get("ring"))
	}
}

// A subscriber that does not read is reset once its queue is full, and
// its reset snapshot is the whole state; one that reads sees every
// transaction and is never reset.
func TestSlowSubscriberResetFastOneNot(t *testing.T) {
	const queue = 4
	h, r := testHub(t, queue)
	slow, fast := subscribe(t, h, "orders", 0), subscribe(t, h, "orders", 0)
	next(t, slow)
	next(t, fast)
	for rev := int64(2); rev <= 12; rev++ {
		mustApply(t, h, cache.Batch{Revision: rev, Events: []cache.Event{put("orders", fmt.Sprint("o", rev%3), int(rev))}})
		if u := next(t, fast); u.Revision() != rev || len(u.Batch().Events) != 1 || u.Batch().Snapshot {
			t.Fatalf("fast at %d: %+v", rev, u.Batch())
		}
		if rev == queue+1 && r.get("slow-subscriber") != 0 {
			t.Fatalf("reset with %d units queued, queue of %d", queue, queue)
		}
	}
	if n := r.get("slow-subscriber"); n != 1 {
		t.Fatalf("%d slow-subscriber resets, want 1", n)
	}
	u := next(t, slow)
	if b := u.Batch(); !b.Snapshot || !b.Reset || b.Revision != 12 || len(b.Instances) != 3 {
		t.Fatalf("slow subscriber's next unit %+v, want a reset snapshot of 3 at 12", b)
	}
	for _, in := range u.Batch().Instances {
		if want, _ := h.Cache().Get("orders", in.Id); want != in {
			t.Fatalf("reset snapshot holds %v, the cache %v", in, want)
		}
	}
}

// A relist of the same history sends every subscriber what it changed,
// as one transaction at the relist's revision: the subscribers of one
// service share one unit, the all-services feed gets every change, a
// service the relist did not change gets progress only, no one is reset,
// and each view built from its units is the cache's. The ring keeps the
// differences for resumes from before the relist; a resume from inside
// it is reset. A relist onto another history (a new epoch) still resets
// everyone.
func TestRelistSendsTheDifferences(t *testing.T) {
	h, r := testHub(t, 16, inst("orders", "a", 1), inst("orders", "b", 1), inst("pay", "p", 1), inst("users", "u", 1))
	a, b, c, p, all := subscribe(t, h, "orders", 0), subscribe(t, h, "orders", 0), subscribe(t, h, "users", 0),
		subscribe(t, h, "pay", 0), subscribe(t, h, "", 0)
	views := map[*Sub]*cache.Cache{}
	for _, s := range []*Sub{a, b, c, p, all} {
		views[s] = cache.New()
		if _, err := views[s].Apply(next(t, s).Batch()); err != nil {
			t.Fatal(err)
		}
	}
	// A transaction, then etcd compacts past it and the hub relists: a
	// changed, b unchanged (the cache keeps it), n new, u gone.
	mustApply(t, h, cache.Batch{Revision: 2, Events: []cache.Event{put("orders", "b", 2)}})
	b2, _ := h.Cache().Get("orders", "b")
	mustApply(t, h, cache.Batch{Revision: 9, Snapshot: true, Reset: true, Epoch: "e1", Instances: []*registryv1.Instance{
		inst("orders", "a", 9), b2, inst("orders", "n", 9), inst("pay", "p", 1)}})
	apply := func(s *Sub, u *Unit) {
		t.Helper()
		if _, err := views[s].Apply(u.Batch()); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*Sub{a, b, all} {
		if u := next(t, s); u.Revision() != 2 || len(u.Batch().Events) != 1 {
			t.Fatalf("%q: the transaction before the relist: %+v", s.Service(), u.Batch())
		} else {
			apply(s, u)
		}
	}
	ua, ub, uc, up, uall := next(t, a), next(t, b), next(t, c), next(t, p), next(t, all)
	ids := func(u *Unit) string {
		var out []string
		for _, e := range u.Batch().Events {
			out = append(out, e.Type.String()+" "+e.Service+"/"+e.ID)
		}
		return strings.Join(out, ", ")
	}
	if ua != ub || ua.Batch().Snapshot || ua.Revision() != 9 || ids(ua) != "put orders/n, put orders/a" {
		t.Fatalf("orders after a relist: %+v [%s] / shared %v", ua.Batch(), ids(ua), ua == ub)
	}
	if uc.Batch().Snapshot || uc.Revision() != 9 || ids(uc) != "delete users/u" {
		t.Fatalf("users after a relist: %+v [%s]", uc.Batch(), ids(uc))
	}
	if up.Batch().Snapshot || up.Revision() != 9 || len(up.Batch().Events) != 0 {
		t.Fatalf("pay (unchanged) after a relist: %+v, want progress at 9", up.Batch())
	}
	if uall.Batch().Snapshot || uall.Revision() != 9 || ids(uall) != "put orders/n, put orders/a, delete users/u" {
		t.Fatalf("all services after a relist: %+v [%s]", uall.Batch(), ids(uall))
	}
	for s, u := range map[*Sub]*Unit{a: ua, b: ub, c: uc, p: up, all: uall} {
		apply(s, u)
		want := h.Cache().Snapshot()
		for _, svc := range []string{"orders", "pay", "users"} {
			if s.Service() != "" && s.Service() != svc {
				continue
			}
			got := views[s].Instances(svc)
			if w := want.Instances(svc); len(got) != len(w) {
				t.Fatalf("%q: view of %s after the relist %v, the cache's %v", s.Service(), svc, got, w)
			} else {
				for i := range got {
					if !proto.Equal(got[i], w[i]) {
						t.Fatalf("%q: view of %s after the relist %v, the cache's %v", s.Service(), svc, got, w)
					}
				}
			}
		}
	}
	if n := r.get("etcd-relist") + r.get("new-epoch") + r.get("ring"); n != 0 {
		t.Fatalf("%d subscribers reset by a relist of the same history", n)
	}
	// Resumes: from before the relist (a stream that stalled while etcd
	// was away), the ring's transactions then the differences; from the
	// relist's own revision, nothing; from between the two revisions, a
	// revision this hub never held, a reset.
	for _, c := range []struct {
		from int64
		want string
	}{{1, "put orders/b, put orders/n, put orders/a"}, {2, "put orders/n, put orders/a"}, {9, ""}} {
		u := next(t, subscribe(t, h, "orders", c.from))
		if u.Batch().Snapshot || u.Revision() != 9 || ids(u) != c.want {
			t.Fatalf("resume from %d: %+v [%s], want [%s] at 9", c.from, u.Batch(), ids(u), c.want)
		}
	}
	if u := next(t, subscribe(t, h, "orders", 5)); !u.Batch().Snapshot || !u.Batch().Reset || len(u.Batch().Instances) != 3 || r.get("ring") != 1 {
		t.Fatalf("resume from 5, inside the relist: %+v (ring resets %d), want a reset snapshot of 3", u.Batch(), r.get("ring"))
	}
	mustApply(t, h, cache.Batch{Revision: 3, Snapshot: true, Reset: true, NewEpoch: true, Epoch: "e2", Instances: []*registryv1.Instance{inst("orders", "a", 3)}})
	for _, s := range []*Sub{a, c, all} {
		if u := next(t, s); !u.Batch().Snapshot || !u.Batch().Reset || !u.Batch().NewEpoch || u.Batch().Epoch != "e2" || u.Revision() != 3 {
			t.Fatalf("%q after a new epoch: %+v", s.Service(), u.Batch())
		}
	}
	if n := r.get("new-epoch"); n != 9 {
		t.Fatalf("%d new-epoch resets, want 9 (every subscriber)", n)
	}
}

// Subscribers joining and reading while transactions go in: each one
// gets every transaction of its service after its first unit, as its own
// unit at its revision (no gap, no duplicate, never back in time), and
// its view, built from its units alone, is the cache's at the end.
func TestConcurrentSubscribersSeeEveryTransaction(t *testing.T) {
	const txns, subs = 2000, 40
	h, _ := testHub(t, 1<<20)
	services := []string{"a", "b", "c", ""}
	plan := make([]string, txns+2) // the service of each revision's transaction
	for rev := 2; rev <= txns+1; rev++ {
		plan[rev] = services[rand.IntN(3)]
	}
	var wg sync.WaitGroup
	errs := make(chan error, subs)
	for i := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Join somewhere in the middle of the writes.
			join := int64(rand.IntN(txns))
			for h.Revision() < join {
				runtime.Gosched()
			}
			svc := services[i%len(services)]
			s, err := h.Subscribe(context.Background(), svc, 0, "")
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			view := map[cache.Key]*registryv1.Instance{}
			var rev int64
			for rev < txns+1 {
				u, err := s.Next(context.Background())
				if err != nil {
					errs <- err
					return
				}
				b := u.Batch()
				if b.Revision < rev || b.Revision == rev && len(b.Events) > 0 {
					errs <- fmt.Errorf("%q went from %d to %d (%d events)", svc, rev, b.Revision, len(b.Events))
					return
				}
				if rev != 0 && !b.Snapshot {
					// Every transaction of svc after rev comes as its own unit.
					for r := rev + 1; r <= b.Revision; r++ {
						if mine := svc == "" || plan[r] == svc; mine != (r == b.Revision && len(b.Events) > 0) {
							errs <- fmt.Errorf("%q: at %d after %d, the transaction at %d (of %q) missed or misplaced", svc, b.Revision, rev, r, plan[r])
							return
						}
					}
				}
				rev = b.Revision
				if b.Snapshot {
					clear(view)
					for _, in := range b.Instances {
						view[cache.Key{Service: in.Service, ID: in.Id}] = in
					}
				}
				for _, e := range b.Events {
					view[cache.Key{Service: e.Service, ID: e.ID}] = e.Instance
				}
			}
			snap := h.Cache().Snapshot()
			n := 0
			for _, name := range snap.Services() {
				if svc != "" && name != svc {
					continue
				}
				for _, in := range snap.Instances(name) {
					n++
					if view[cache.Key{Service: in.Service, ID: in.Id}] != in {
						errs <- fmt.Errorf("%q: %s/%s is %v in the view, %v in the cache", svc, in.Service, in.Id, view[cache.Key{Service: in.Service, ID: in.Id}], in)
						return
					}
				}
			}
			if n != len(view) {
				errs <- fmt.Errorf("%q: %d in the view, %d in the cache", svc, len(view), n)
			}
		}()
	}
	for rev := int64(2); rev <= txns+1; rev++ {
		mustApply(t, h, cache.Batch{Revision: rev, Events: []cache.Event{put(plan[rev], fmt.Sprint("i", rand.IntN(10)), int(rev))}})
		if rev%50 == 0 {
			runtime.Gosched()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Subscribers joining at one revision share one snapshot unit; one
// joining later, after other services changed, gets a new unit framed
// from the same stored instance bytes.
func TestSnapshotsShareStoredBytes(t *testing.T) {
	h, _ := testHub(t, 16, inst("orders", "a", 1), inst("orders", "b", 1), inst("users", "u", 1))
	u1, u2 := next(t, subscribe(t, h, "orders", 0)), next(t, subscribe(t, h, "orders", 0))
	if u1 != u2 {
		t.Fatal("two subscribers at one revision got two snapshot units")
	}
	a1, a2 := next(t, subscribe(t, h, "", 0)), next(t, subscribe(t, h, "", 0))
	if a1 != a2 || len(a1.Batch().Instances) != 3 {
		t.Fatalf("all-services snapshots: shared %v, %d instances", a1 == a2, len(a1.Batch().Instances))
	}
	mustApply(t, h, cache.Batch{Revision: 2, Events: []cache.Event{put("users", "u", 2)}})
	u3 := next(t, subscribe(t, h, "orders", 0))
	if u3 == u1 || u3.Revision() != 2 {
		t.Fatalf("snapshot after a change: revision %d, same unit %v", u3.Revision(), u3 == u1)
	}
	if u3.body.parts[0] != u1.body.parts[0] {
		t.Fatal("orders did not change, and its instances were encoded again")
	}
	a3 := next(t, subscribe(t, h, "", 0))
	if a3.body.parts[0] != a1.body.parts[0] || a3.body.parts[1] == a1.body.parts[1] {
		t.Fatal("the all-services snapshot did not reuse exactly the unchanged service")
	}
	c1, _ := u1.Chunks()
	c3, _ := u3.Chunks()
	var r1, r3 registryv1.WatchResponse
	if err := proto.Unmarshal(c1[0], &r1); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(c3[0], &r3); err != nil {
		t.Fatal(err)
	}
	if r3.Revision != 2 || r1.Revision != 1 || !proto.Equal(r1.GetSnapshot(), r3.GetSnapshot()) {
		t.Fatalf("snapshots at 1 and 2 differ beyond their revision: %v / %v", &r1, &r3)
	}
}

// Subscribers that come and go at the same moment (a Subscribe stream
// moving eight services to this regnode at once) leave OnSubscribers, and
// so the registry_subscribers gauge, at the true count: the calls come in
// the order of the changes, each one more or one less than the last.
// Before, a count reported after the hub's lock was released could be
// overtaken by the next one's, and the gauge stayed at 1 of 8.
func TestOnSubscribersInOrderOfChanges(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []int
	)
	h := newHub(Config{RingSize: 100, QueueSize: 16, CatchUpTimeout: time.Second,
		Logger: slog.New(slog.DiscardHandler),
		OnSubscribers: func(n int) {
			runtime.Gosched() // widens the window a call made outside the lock would lose
			mu.Lock()
			seen = append(seen, n)
			mu.Unlock()
		}})
	mustApply(t, h, cache.Batch{Revision: 1, Snapshot: true, Epoch: "e1"})
	const rounds, width = 20, 8
	for range rounds {
		subs := make([]*Sub, width)
		var wg sync.WaitGroup
		for i := range width {
			wg.Go(func() {
				s, err := h.Subscribe(context.Background(), fmt.Sprintf("svc-%d", i), 0, "")
				if err != nil {
					t.Error(err)
					return
				}
				subs[i] = s
			})
		}
		wg.Wait()
		mu.Lock()
		last := seen[len(seen)-1]
		mu.Unlock()
		if last != h.Subscribers() || last != width {
			t.Fatalf("OnSubscribers last told %d, the hub has %d subscribers (want %d)", last, h.Subscribers(), width)
		}
		for _, s := range subs {
			wg.Go(func() {
				if s != nil {
					s.Close()
				}
			})
		}
		wg.Wait()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2*rounds*width {
		t.Fatalf("OnSubscribers called %d times, want %d", len(seen), 2*rounds*width)
	}
	for i, n := range seen {
		prev := 0
		if i > 0 {
			prev = seen[i-1]
		}
		if n != prev+1 && n != prev-1 {
			t.Fatalf("call %d told %d after %d: not in the order of the changes (%v)", i, n, prev, seen)
		}
	}
	if seen[len(seen)-1] != 0 {
		t.Fatalf("last count %d after every subscriber left", seen[len(seen)-1])
	}
}

// poll is s's next unit if one is ready now, or nil.
func poll(t *testing.T, s *Sub) *Unit {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	u, err := s.Next(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Transactions of one service cost its own subscribers one unit each and
// the subscribers of other services nothing until the next beat: a
// hundred changes to users send orders' subscriber no progress while the
// gap lasts (it was one progress message per change).
func TestProgressPacedForOtherServices(t *testing.T) {
	h := newHub(Config{RingSize: 1000, QueueSize: 1024, CatchUpTimeout: time.Second, ProgressGap: time.Hour,
		Logger: slog.New(slog.DiscardHandler)})
	defer h.beats.close()
	mustApply(t, h, cache.Batch{Revision: 1, Snapshot: true, Epoch: "e1"}) // the first beat: at once
	orders, users := subscribe(t, h, "orders", 0), subscribe(t, h, "users", 0)
	for _, s := range []*Sub{orders, users} {
		if u := next(t, s); !u.Batch().Snapshot {
			t.Fatalf("first unit %+v, want the snapshot", u.Batch())
		}
	}
	const n = 100
	for i := range n {
		mustApply(t, h, cache.Batch{Revision: int64(2 + i), Events: []cache.Event{put("users", "u", i)}})
	}
	for i := range n {
		u := poll(t, users)
		if u == nil || len(u.Batch().Events) != 1 || u.Revision() != int64(2+i) {
			t.Fatalf("users' unit %d: %+v, want its transaction at %d", i, u, 2+i)
		}
	}
	if u := poll(t, orders); u != nil {
		t.Fatalf("orders got %+v within the gap after %d transactions of users, want nothing", u.Batch(), n)
	}
	// Its own change is never paced.
	mustApply(t, h, cache.Batch{Revision: n + 2, Events: []cache.Event{put("orders", "o", 1)}})
	if u := poll(t, orders); u == nil || len(u.Batch().Events) != 1 || u.Revision() != n+2 {
		t.Fatalf("orders' own transaction: %+v", u)
	}
}

// The beat carries the latest tick: after a burst, a subscriber of a
// quiet service hears progress at the hub's last revision, shared by
// every subscriber of every quiet service.
func TestProgressBeatCarriesLatest(t *testing.T) {
	h := newHub(Config{RingSize: 1000, QueueSize: 1024, CatchUpTimeout: time.Second, ProgressGap: 10 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	defer h.beats.close()
	mustApply(t, h, cache.Batch{Revision: 1, Snapshot: true, Epoch: "e1"})
	a, b := subscribe(t, h, "a", 0), subscribe(t, h, "b", 0)
	next(t, a)
	next(t, b)
	const last = 51
	for rev := int64(2); rev <= last; rev++ {
		mustApply(t, h, cache.Batch{Revision: rev, Events: []cache.Event{put("users", "u", int(rev))}})
	}
	var seen []int64
	for {
		u := next(t, a)
		if u.Batch().Snapshot || len(u.Batch().Events) != 0 {
			t.Fatalf("a quiet service got %+v", u.Batch())
		}
		seen = append(seen, u.Revision())
		if u.Revision() == last {
			if v := next(t, b); v.Revision() != last {
				t.Fatalf("b's progress at %d, a's at %d", v.Revision(), last)
			}
			break
		}
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("progress revisions %v not increasing", seen)
		}
	}
}
