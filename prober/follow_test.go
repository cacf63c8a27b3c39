package prober

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"pgregory.net/rapid"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func testProber() *Prober {
	p := &Prober{cfg: Config{Probe: zeroChecker(), Thresholds: health.DefaultThresholds(),
		Interval: time.Second, Floor: 100 * time.Millisecond}}
	p.log = discardLogger()
	return p
}

// view is a cache fed one batch at a time, at increasing revisions.
type view struct {
	t   testing.TB
	c   *cache.Cache
	rev int64
}

func (v *view) apply(evs ...cache.Event) *cache.Snapshot {
	v.t.Helper()
	v.rev++
	for i := range evs {
		if in := evs[i].Instance; in != nil && in.ModRevision == 0 {
			in.ModRevision = v.rev
			if in.CreateRevision == 0 {
				in.CreateRevision = v.rev
			}
		}
	}
	if _, err := v.c.Apply(cache.Batch{Revision: v.rev, Events: evs}); err != nil {
		v.t.Fatal(err)
	}
	return v.c.Snapshot()
}

func put(in *registryv1.Instance) cache.Event { return cache.Event{Type: cache.Put, Instance: in} }
func del(service, id string) cache.Event {
	return cache.Event{Type: cache.Delete, Service: service, ID: id}
}

func checked(service, id string) *registryv1.Instance {
	return &registryv1.Instance{Service: service, Id: id, Address: "127.0.0.1:1",
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
		Check:     &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}}
}

// changed returns a copy of in as a later write of the record would make
// it (a new mod revision, the same incarnation), changed by fn.
func changed(in *registryv1.Instance, fn func(*registryv1.Instance)) *registryv1.Instance {
	c := proto.CloneOf(in)
	c.ModRevision = 0
	fn(c)
	return c
}

// Following the view by difference: a change to one instance among 1,000
// restarts no other loop; a changed check, a re-registration and a new
// check start one loop each; a deleted instance or service stops its
// loops, and the writer is told.
func TestFollowerStartsOnlyChangedLoops(t *testing.T) {
	v := &view{t: t, c: cache.New()}
	var evs []cache.Event
	for i := range 1000 {
		in := checked(fmt.Sprintf("svc-%d", i%10), fmt.Sprintf("i-%04d", i))
		if i%100 == 99 {
			in.Check = nil // a tenth of a percent without a check: not followed
		}
		evs = append(evs, put(in))
	}
	f := testProber().newFollower()
	var gone []cache.Key
	f.gone = func(k cache.Key) { gone = append(gone, k) }
	now := time.Now()
	f.sync(v.apply(evs...), now)
	if f.starts != 990 || len(f.all) != 990 {
		t.Fatalf("first view: %d loops started, %d followed; want 990 (the instances with a check)", f.starts, len(f.all))
	}
	loops := maps.Clone(f.all)
	// others asserts that every loop but those of except is the one
	// started first, still running.
	others := func(step string, except ...cache.Key) {
		t.Helper()
		for k, tr := range loops {
			if slices.Contains(except, k) {
				continue
			}
			if f.all[k] != tr || tr.gone {
				t.Fatalf("%s: the loop of %v was restarted or stopped", step, k)
			}
		}
	}
	key := func(svc string, i int) cache.Key { return cache.Key{Service: svc, ID: fmt.Sprintf("i-%04d", i)} }
	get := func(k cache.Key) *registryv1.Instance {
		in, ok := v.c.Get(k.Service, k.ID)
		if !ok {
			t.Fatalf("%v not in the view", k)
		}
		return in
	}

	// A drain (a new record, the same check): no loop starts, the loop
	// follows the new record.
	k1 := key("svc-1", 1)
	drained := changed(get(k1), func(in *registryv1.Instance) { in.Lifecycle = registryv1.Lifecycle_LIFECYCLE_DRAINING })
	f.sync(v.apply(put(drained)), now)
	if f.starts != 990 {
		t.Fatalf("a drain started %d loops", f.starts-990)
	}
	if f.all[k1] != loops[k1] || f.all[k1].inst != drained {
		t.Fatalf("the drained instance's loop: %p (was %p), following %v", f.all[k1], loops[k1], f.all[k1].inst)
	}
	others("drain")

	// A progress-only revision, and the same view again: nothing.
	f.sync(v.apply(), now)
	f.sync(v.c.Snapshot(), now)
	if f.starts != 990 {
		t.Fatalf("progress started %d loops", f.starts-990)
	}

	// Its check changes: a new loop for it alone.
	k2 := key("svc-2", 2)
	f.sync(v.apply(put(changed(get(k2), func(in *registryv1.Instance) { in.Check.Interval = durationpb.New(5 * time.Second) }))), now)
	if f.starts != 991 || f.all[k2] == loops[k2] || !loops[k2].gone || f.all[k2].interval != 5*time.Second {
		t.Fatalf("check changed: %d loops started, old loop gone=%v, interval %s", f.starts-990, loops[k2].gone, f.all[k2].interval)
	}
	// Only its slow threshold changes: that is a new check too.
	k6 := key("svc-6", 6)
	f.sync(v.apply(put(changed(get(k6), func(in *registryv1.Instance) { in.Check.SlowThreshold = durationpb.New(time.Second) }))), now)
	if f.starts != 992 || f.all[k6].slow != time.Second {
		t.Fatalf("slow threshold changed: %d loops started, slow %s", f.starts-990, f.all[k6].slow)
	}
	others("check changed", k2, k6)

	// Deleted: its loop stops, the writer forgets it.
	k3 := key("svc-3", 3)
	f.sync(v.apply(del(k3.Service, k3.ID)), now)
	if f.all[k3] != nil || !loops[k3].gone || !slices.Equal(gone, []cache.Key{k3}) || f.starts != 992 {
		t.Fatalf("deleted: still followed %v, gone=%v, writer told %v", f.all[k3] != nil, loops[k3].gone, gone)
	}
	others("delete", k2, k6, k3)

	// Its lease lost and registered again (a new incarnation carrying the
	// stored health): a new loop that starts from that health.
	k4 := key("svc-4", 4)
	again := changed(get(k4), func(in *registryv1.Instance) {
		in.CreateRevision = 0
		in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE}
	})
	f.sync(v.apply(del(k4.Service, k4.ID)), now)
	f.sync(v.apply(put(again)), now)
	if f.starts != 993 || f.all[k4] == nil || f.all[k4].machine.State() != registryv1.HealthState_HEALTH_STATE_UNAVAILABLE {
		t.Fatalf("re-registered: %d loops started, state %v", f.starts-990, f.all[k4].machine.State())
	}
	// Registered anew in one revision (no delete seen): the same.
	k5 := key("svc-5", 5)
	f.sync(v.apply(put(changed(get(k5), func(in *registryv1.Instance) { in.CreateRevision = 0 }))), now)
	if f.starts != 994 || f.all[k5] == loops[k5] || !loops[k5].gone {
		t.Fatalf("registered anew in place: %d loops started", f.starts-990)
	}
	// One without a check gains one.
	k99 := key("svc-9", 99)
	f.sync(v.apply(put(changed(get(k99), func(in *registryv1.Instance) {
		in.Check = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}
	}))), now)
	if f.starts != 995 || f.all[k99] == nil {
		t.Fatalf("a check added: %d loops started", f.starts-990)
	}
	others("re-registrations", k2, k6, k3, k4, k5)

	// Whole services go, one in the middle and the last by name: their
	// loops stop, and only theirs.
	var evsDel []cache.Event
	for _, svc := range []string{"svc-7", "svc-9"} {
		for _, in := range v.c.Instances(svc) {
			evsDel = append(evsDel, del(in.Service, in.Id))
		}
	}
	gone = nil
	f.sync(v.apply(evsDel...), now)
	var svc7 []cache.Key
	for k := range loops {
		if k.Service == "svc-7" || k.Service == "svc-9" {
			svc7 = append(svc7, k)
			if f.all[k] != nil || !loops[k].gone {
				t.Fatalf("service deleted: %v still followed", k)
			}
		}
	}
	if len(gone) != len(svc7)+1 { // and k99, which gained a check
		t.Fatalf("services deleted: the writer was told of %d instances, want %d", len(gone), len(svc7)+1)
	}
	others("services deleted", append(svc7, k2, k6, k3, k4, k5)...)
	if f.starts != 995 {
		t.Fatalf("%d loops started in all, want 995", f.starts)
	}
}

// Following by difference ends where a full scan of the same view would:
// the same instances followed, each following the view's record.
func TestFollowerMatchesFullScan(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		v := &view{t: t, c: cache.New()}
		f := testProber().newFollower()
		now := time.Now()
		ids := []string{"a", "b", "c", "d"}
		svcs := []string{"s1", "s2", "s3"}
		for range rapid.IntRange(1, 30).Draw(rt, "steps") {
			var evs []cache.Event
			for range rapid.IntRange(0, 4).Draw(rt, "events") {
				svc, id := rapid.SampledFrom(svcs).Draw(rt, "service"), rapid.SampledFrom(ids).Draw(rt, "id")
				cur, ok := v.c.Get(svc, id)
				switch op := rapid.IntRange(0, 5).Draw(rt, "op"); {
				case op == 5: // the whole service
					for _, id := range ids {
						evs = append(evs, del(svc, id))
					}
				case op == 0:
					evs = append(evs, del(svc, id))
				case op == 1 || !ok: // new, or registered anew
					in := checked(svc, id)
					if rapid.Bool().Draw(rt, "no check") {
						in.Check = nil
					}
					evs = append(evs, put(in))
				case op == 2: // another check
					evs = append(evs, put(changed(cur, func(in *registryv1.Instance) {
						in.Check = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_HTTP, Target: "/h"}
					})))
				default: // a health write or a drain
					evs = append(evs, put(changed(cur, func(in *registryv1.Instance) {
						in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY}
					})))
				}
			}
			snap := v.apply(evs...)
			f.sync(snap, now)
			want := map[cache.Key]*registryv1.Instance{}
			for _, in := range snap.All() {
				if in.GetCheck().GetKind() != registryv1.CheckKind_CHECK_KIND_NONE {
					want[cache.Key{Service: in.Service, ID: in.Id}] = in
				}
			}
			if len(f.all) != len(want) {
				rt.Fatalf("following %d instances, the view has %d with a check", len(f.all), len(want))
			}
			for k, in := range want {
				if tr := f.all[k]; tr == nil || tr.inst != in || tr.gone {
					rt.Fatalf("%v: following %v, the view holds %v", k, tr, in)
				}
			}
		}
	})
}
