package lastresort_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/lastresort"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func serving(id string) *registryv1.Instance {
	return &registryv1.Instance{Service: "orders", Id: id, Address: "127.0.0.1:1", Weight: 100,
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING}
}

func drained(in *registryv1.Instance) *registryv1.Instance {
	d := proto.CloneOf(in)
	d.Lifecycle = registryv1.Lifecycle_LIFECYCLE_DRAINING
	return d
}

func unavailable(in *registryv1.Instance) *registryv1.Instance {
	d := proto.CloneOf(in)
	d.Check = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}
	d.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE}
	return d
}

// fleet is n serving instances i-00.. sorted by id.
func fleet(n int) []*registryv1.Instance {
	out := make([]*registryv1.Instance, n)
	for i := range out {
		out[i] = serving(fmt.Sprintf("i-%02d", i))
	}
	return out
}

// without is list minus the ids given.
func without(list []*registryv1.Instance, ids ...string) []*registryv1.Instance {
	return slices.DeleteFunc(slices.Clone(list), func(in *registryv1.Instance) bool { return slices.Contains(ids, in.Id) })
}

// replace is list with in in place of the record of its id.
func replace(list []*registryv1.Instance, in *registryv1.Instance) []*registryv1.Instance {
	out := slices.Clone(list)
	for i := range out {
		if out[i].Id == in.Id {
			out[i] = in
		}
	}
	return out
}

func ids(list []*registryv1.Instance) []string {
	out := make([]string, len(list))
	for i, in := range list {
		out[i] = in.Id
	}
	return out
}

// step is one change fed to the tracker, and what must hold after it.
type step struct {
	at         time.Duration // since t0
	prev, cur  []*registryv1.Instance
	expire     bool     // call Expire at at instead of Observe
	wantOffer  []string // Offer(cur) at at
	wantHeld   int
	wantEnded  lastresort.EndReason // the hook's last reason, 0 for none yet
	wantStarts int
}

func TestTracker(t *testing.T) {
	three := fleet(3)
	ten := fleet(10)
	cfg := lastresort.Config{Window: 10 * time.Second, Grace: time.Minute, Fraction: 0.5}
	for name, steps := range map[string][]step{
		"all vanish at once: kept until the grace ends": {
			{prev: nil, cur: three},
			{at: time.Second, prev: three, cur: nil, wantOffer: ids(three), wantHeld: 3, wantStarts: 1},
			{at: time.Minute, expire: true, cur: nil, wantOffer: ids(three), wantHeld: 3, wantStarts: 1},
			{at: time.Minute + time.Second, expire: true, cur: nil, wantEnded: lastresort.EndGrace, wantStarts: 1},
		},
		"deregistered (DRAINING, then deleted): nothing kept": {
			{prev: nil, cur: three},
			{at: time.Second, prev: three, cur: []*registryv1.Instance{drained(three[0]), drained(three[1]), drained(three[2])}},
			{at: 2 * time.Second, prev: []*registryv1.Instance{drained(three[0]), drained(three[1]), drained(three[2])}, cur: nil},
		},
		"deregistered in one folded batch (LastSeen): nothing kept": {
			{prev: lastresort.LastSeen(three, []*registryv1.Instance{drained(three[0]), drained(three[1]), drained(three[2])}), cur: nil},
		},
		"one of ten vanishes: nothing kept": {
			{prev: ten, cur: without(ten, "i-03")},
		},
		"half of ten within the window: kept": {
			{prev: ten, cur: without(ten, "i-01", "i-02")},
			{at: 9 * time.Second, prev: without(ten, "i-01", "i-02"), cur: ten[5:], wantHeld: 5, wantStarts: 1},
			// i-05..09 are routable: nothing is offered.
		},
		"half of ten, but spread beyond the window: nothing kept": {
			{prev: ten, cur: without(ten, "i-01", "i-02")},
			{at: 10 * time.Second, prev: without(ten, "i-01", "i-02"), cur: ten[5:]},
		},
		"offered only while nothing is routable": {
			{prev: three, cur: three[2:], wantHeld: 2, wantStarts: 1},
			{at: time.Second, prev: three[2:], cur: []*registryv1.Instance{unavailable(three[2])}, wantOffer: ids(three[:2]), wantHeld: 2, wantStarts: 1},
		},
		"an instance that was not routable is not kept": {
			{prev: []*registryv1.Instance{unavailable(three[0]), three[1], three[2]}, cur: nil, wantOffer: ids(three[1:]), wantHeld: 2, wantStarts: 1},
		},
		"one re-registers: it alone is called, the others are held; all back ends it": {
			{prev: three, cur: nil, wantOffer: ids(three), wantHeld: 3, wantStarts: 1},
			{at: time.Second, prev: nil, cur: three[:1], wantHeld: 2, wantStarts: 1},
			{at: 2 * time.Second, prev: three[:1], cur: []*registryv1.Instance{unavailable(three[0])}, wantOffer: ids(three[1:]), wantHeld: 2, wantStarts: 1},
			{at: 3 * time.Second, prev: []*registryv1.Instance{unavailable(three[0])}, cur: []*registryv1.Instance{unavailable(three[0]), three[1], three[2]}, wantEnded: lastresort.EndReturned, wantStarts: 1},
		},
		"a record back after a reset (not in prev) still ends it": {
			{prev: three, cur: nil, wantOffer: ids(three), wantHeld: 3, wantStarts: 1},
			{at: time.Second, prev: three, cur: three, wantEnded: lastresort.EndReturned, wantStarts: 1},
		},
		"a deliberate removal ends it": {
			{prev: ten, cur: ten[6:], wantHeld: 6, wantStarts: 1},
			{at: time.Second, prev: ten[6:], cur: replace(ten[6:], drained(ten[9])), wantHeld: 6, wantStarts: 1},
			{at: 2 * time.Second, prev: replace(ten[6:], drained(ten[9])), cur: ten[6:9], wantEnded: lastresort.EndDeliberate, wantStarts: 1},
		},
		"vanishing during an incident: kept to the same end": {
			{prev: ten, cur: ten[5:], wantHeld: 5, wantStarts: 1},
			{at: 30 * time.Second, prev: ten[5:], cur: nil, wantOffer: ids(ten), wantHeld: 10, wantStarts: 1},
			{at: time.Minute, prev: nil, cur: nil, wantEnded: lastresort.EndGrace, wantStarts: 1},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var starts int
			var ended lastresort.EndReason
			c := cfg
			c.OnStart = func(service string, kept []*registryv1.Instance, until time.Time) {
				starts++
				if service != "orders" || len(kept) == 0 || !until.After(t0) {
					t.Errorf("OnStart(%q, %d kept, %v)", service, len(kept), until)
				}
			}
			c.OnEnd = func(service string, why lastresort.EndReason) { ended = why }
			tr, err := lastresort.New(c)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range steps {
				now := t0.Add(s.at)
				if s.expire {
					tr.Expire(now)
				} else {
					tr.Observe("orders", s.prev, s.cur, now)
				}
				got := ids(tr.Offer("orders", s.cur, now))
				if len(got) == 0 {
					got = nil
				}
				want := s.wantOffer
				if !slices.Equal(got, want) {
					t.Fatalf("step %d: Offer = %v, want %v", i, got, want)
				}
				if n, until := tr.Held("orders"); n != s.wantHeld || (n > 0) != !until.IsZero() {
					t.Fatalf("step %d: Held = %d until %v, want %d", i, n, until, s.wantHeld)
				}
				if ended != s.wantEnded || starts != s.wantStarts {
					t.Fatalf("step %d: %d starts, last end %v; want %d, %v", i, starts, ended, s.wantStarts, s.wantEnded)
				}
			}
			st := tr.Stats()
			if st.Started != int64(starts) {
				t.Fatalf("Stats.Started = %d, OnStart called %d times", st.Started, starts)
			}
		})
	}
}

func TestNextAndForget(t *testing.T) {
	tr, err := lastresort.New(lastresort.Config{Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Next().IsZero() {
		t.Fatal("Next with nothing held is not zero")
	}
	tr.Observe("a", fleet(2), nil, t0)
	tr.Observe("b", fleet(2), nil, t0.Add(time.Second))
	if got := tr.Next(); !got.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Next = %v, want the earlier grace end %v", got, t0.Add(time.Minute))
	}
	if got := tr.Expire(t0.Add(time.Minute)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Expire ended %v, want [a]", got)
	}
	tr.Forget("b")
	if n, _ := tr.Held("b"); n != 0 || !tr.Next().IsZero() {
		t.Fatalf("after Forget: held %d, next %v", n, tr.Next())
	}
	st := tr.Stats()
	if st.Started != 2 || st.Ended[lastresort.EndGrace] != 1 || st.Ended[lastresort.EndForgotten] != 1 || st.Vanished != 4 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []lastresort.Config{{Window: -1}, {Grace: -1}, {Fraction: 1.5}, {Fraction: -0.1}} {
		if _, err := lastresort.New(c); !errors.Is(err, lastresort.ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", c, err)
		}
	}
	if err := lastresort.DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if d := lastresort.DefaultConfig(); d.Grace != lastresort.DefaultGrace || d.Window != lastresort.DefaultWindow || d.Fraction != lastresort.DefaultFraction {
		t.Fatalf("DefaultConfig = %+v", d)
	}
}

func TestLastSeen(t *testing.T) {
	three := fleet(3)
	if got := lastresort.LastSeen(three, nil); &got[0] != &three[0] {
		t.Fatal("LastSeen with nothing seen copied prev")
	}
	extra := serving("i-01a")
	got := lastresort.LastSeen(three, []*registryv1.Instance{three[1], drained(three[1]), extra})
	if !slices.Equal(ids(got), []string{"i-00", "i-01", "i-01a", "i-02"}) || got[1].Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING {
		t.Fatalf("LastSeen = %v (i-01 %v)", ids(got), got[1].Lifecycle)
	}
	if three[1].Lifecycle != registryv1.Lifecycle_LIFECYCLE_SERVING {
		t.Fatal("LastSeen modified prev")
	}
}

// Off keeps nothing, however much vanishes.
func TestTrackerOff(t *testing.T) {
	tr, err := lastresort.New(lastresort.Config{Off: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	all := []*registryv1.Instance{
		{Service: "orders", Id: "a", Address: "10.0.0.1:80", Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING},
		{Service: "orders", Id: "b", Address: "10.0.0.2:80", Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING},
	}
	tr.Observe("orders", nil, all, now)
	tr.Observe("orders", all, nil, now)
	if n, _ := tr.Held("orders"); n != 0 || len(tr.Offer("orders", nil, now)) != 0 {
		t.Fatalf("Off kept %d instances", n)
	}
}
