package balance_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/regcluster/registry/balance"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A caller in zone a with enough healthy instances there keeps ≥ 95% of
// its calls in a; when a's instances fail (ejected, or UNAVAILABLE in the
// registry), calls spill over to b.
func TestZoneAwareRouting(t *testing.T) {
	bs := startBackends(t, 6)
	p := balance.DefaultPolicy()
	p.Idempotent = []string{healthMethods}
	p.ZoneMinInstances = 4
	m := balance.NewMetrics()
	zoned := func(b *backend, z string) inst { in := serving(b, 100); in.zone = z; return in }
	insts := []inst{zoned(bs[0], "a"), zoned(bs[1], "a"), zoned(bs[2], "a"), zoned(bs[3], "b"), zoned(bs[4], "b"), zoned(bs[5], "b")}
	ch := newChannel(t, p, zoneState(t, "a", m, true, insts...))
	// Connect every child (zone routing would keep the b ones unused).
	waitFor(t, 10*time.Second, "all six ready", func() bool { return len(m.Counts().Weights) == 6 })
	inZone := func(n int) (a, b int64) {
		before := make([]int64, 6)
		for i, x := range bs {
			before[i] = x.calls.Load()
		}
		for range n {
			if err := ch.check("", 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		for i, x := range bs {
			if i < 3 {
				a += x.calls.Load() - before[i]
			} else {
				b += x.calls.Load() - before[i]
			}
		}
		return a, b
	}
	if a, b := inZone(1000); a*100 < 95*(a+b) {
		t.Fatalf("zone a kept %d of %d calls, want ≥ 95%%", a, a+b)
	}
	// Two of a's three go UNAVAILABLE: a has 1/4 of the healthy weight
	// for 1/2 of the callers, so half the calls stay and half spill over
	// (without zone routing a would get a quarter, with it all).
	down := func(in inst) inst { in.health = registryv1.HealthState_HEALTH_STATE_UNAVAILABLE; return in }
	ch.r.UpdateState(zoneState(t, "a", m, true, zoned(bs[0], "a"), down(insts[1]), down(insts[2]), insts[3], insts[4], insts[5]))
	waitFor(t, 10*time.Second, "the registry change applied", func() bool { return len(m.Counts().Weights) == 4 })
	if a, b := inZone(2000); a*100 < 40*(a+b) || a*100 > 60*(a+b) {
		t.Fatalf("after two of a's instances failed a kept %d of %d calls, want 50±10%%", a, a+b)
	}
	// The last one in a fails its calls: ejected, all calls spill over
	// (3 healthy left: below ZoneMinInstances, no zone routing).
	bs[0].failWith.Store(int32(codes.Unavailable))
	waitFor(t, 10*time.Second, "the failing one ejected", func() bool {
		_, _ = inZone(10)
		_, in := m.Counts().Weights["orders/b0"]
		return m.Counts().Ejections > 0 && !in
	})
	if a, b := inZone(300); a > 10 {
		t.Fatalf("%d of %d calls still went to ejected zone a", a, a+b)
	}

	// Three healthy instances, below ZoneMinInstances: no zone routing,
	// a's one instance gets its weight's third (zone routing would give
	// it two thirds).
	m2 := balance.NewMetrics()
	ch2 := newChannel(t, p, zoneState(t, "a", m2, true, insts[1], insts[3], insts[4]))
	waitFor(t, 10*time.Second, "three ready", func() bool { return len(m2.Counts().Weights) == 3 })
	before := bs[1].calls.Load()
	for range 1500 {
		if err := ch2.check("", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if a := bs[1].calls.Load() - before; a*100 > 45*1500 {
		t.Fatalf("below ZoneMinInstances zone a got %d of 1500 calls, want ≈ a third", a)
	}
}
