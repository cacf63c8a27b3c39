package balance_test

import (
	"testing"
	"time"

	"github.com/regcluster/registry/balance"
)

func TestRampPercent(t *testing.T) {
	since := time.Unix(1000, 0)
	w := 30 * time.Second
	for _, tc := range []struct {
		at   time.Duration
		want uint64
		next time.Duration
	}{{-5 * time.Second, 5, 10 * time.Second}, {0, 5, 10 * time.Second}, {9 * time.Second, 5, 10 * time.Second},
		{10 * time.Second, 25, 20 * time.Second}, {20 * time.Second, 50, w}, {w, 100, -1}, {time.Hour, 100, -1}} {
		pct, next := balance.RampPercent(since, since.Add(tc.at), w)
		if pct != tc.want || (tc.next < 0) != next.IsZero() || (tc.next >= 0 && !next.Equal(since.Add(tc.next))) {
			t.Errorf("at %v: %d%% next %v, want %d%% next %v", tc.at, pct, next, tc.want, tc.next)
		}
	}
	if pct, _ := balance.RampPercent(time.Time{}, since, w); pct != 100 {
		t.Error("no since: no ramp")
	}
	if pct, _ := balance.RampPercent(since, since, 0); pct != 100 {
		t.Error("no window: no ramp")
	}
}

// An instance that just became routable (by the record's time) gets 5%
// of its weight; the picker's weight says so and the shares follow.
func TestSlowStartFromRecordTime(t *testing.T) {
	bs := startBackends(t, 2)
	p := balance.DefaultPolicy()
	m := balance.NewMetrics()
	fresh := serving(bs[1], 100)
	fresh.since = time.Now()
	ch := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), fresh))
	waitAllConnected(t, ch, bs)
	if w := m.Counts().Weights; w["orders/b1"] != 5 || w["orders/b0"] != 100 {
		t.Fatalf("weights %v, want b0 100, b1 5", w)
	}
	for range 1000 {
		if err := ch.check("", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if n := bs[1].calls.Load(); n > 100 {
		t.Fatalf("ramping instance got %d of 1000 calls, want ≈48", n)
	}
	// A record that says it became routable two thirds of a window ago
	// is at 50% at once.
	older := serving(bs[1], 100)
	older.since = time.Now().Add(-p.SlowStartWindow * 2 / 3)
	ch.r.UpdateState(state(t, p, m, true, serving(bs[0], 100), older))
	waitFor(t, 5*time.Second, "the ramp read from the record", func() bool { return m.Counts().Weights["orders/b1"] == 50 })
}
