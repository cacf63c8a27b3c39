package reports_test

import (
	"testing"
	"time"

	"github.com/regcluster/registry/internal/reports"
)

func TestAggregator(t *testing.T) {
	a, err := reports.New(reports.Config{Window: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	bad := []reports.Calls{{ID: "a", Failures: 5}, {ID: "b", Successes: 20}}
	for i, r := range []string{"c1", "c2", "c3"} {
		raised, _ := a.Add(r, "orders", bad, t0)
		if len(raised) != 1 || raised[0] != "a" {
			t.Fatalf("report %d raised %v, want [a]", i, raised)
		}
		if got := a.Failing("orders", "a", t0); got != i+1 {
			t.Fatalf("after %d reports: %d failing, want %d", i+1, got, i+1)
		}
	}
	// The same reporter again: no new vote.
	if raised, _ := a.Add("c1", "orders", bad, t0.Add(time.Second)); len(raised) != 0 {
		t.Fatalf("a repeated report raised %v", raised)
	}
	// A caller whose calls fail everywhere is discounted.
	if _, discounted := a.Add("c4", "orders", []reports.Calls{{ID: "a", Failures: 9}, {ID: "b", Failures: 9}}, t0); !discounted {
		t.Fatal("a caller failing everywhere was not discounted")
	}
	// Too few failures, more successes than failures, or no peer
	// success: none counts.
	a.Add("c5", "orders", []reports.Calls{{ID: "a", Failures: 2}, {ID: "b", Successes: 5}}, t0)
	a.Add("c6", "orders", []reports.Calls{{ID: "a", Failures: 4, Successes: 5}, {ID: "b", Successes: 5}}, t0)
	a.Add("c7", "orders", []reports.Calls{{ID: "a", Failures: 4}}, t0)
	if got := a.Failing("orders", "a", t0); got != 3 {
		t.Fatalf("%d failing, want the 3 that count", got)
	}
	if got := a.Failing("orders", "b", t0); got != 0 {
		t.Fatalf("b: %d failing", got)
	}
	// c2's calls to a succeed now: its vote goes at once.
	a.Add("c2", "orders", []reports.Calls{{ID: "a", Successes: 3}, {ID: "b", Successes: 3}}, t0.Add(2*time.Second))
	if got := a.Failing("orders", "a", t0.Add(2*time.Second)); got != 2 {
		t.Fatalf("after c2 recovered: %d failing, want 2", got)
	}
	// The window ends every vote: c1 reported last at t0+1s, c3 at t0.
	if got := a.Failing("orders", "a", t0.Add(10*time.Second)); got != 1 {
		t.Fatalf("at the window's end: %d failing, want 1 (c1's later report)", got)
	}
	if got := a.Failing("orders", "a", t0.Add(11*time.Second)); got != 0 {
		t.Fatalf("past the window: %d failing", got)
	}
	if s := a.Stats(); s.Discounted != 2 || s.Received != 9 { // c4, and c7 (it called only a)
		t.Fatalf("stats %+v, want 2 discounted of 9", s)
	}
}

func TestAggregatorBounds(t *testing.T) {
	a, err := reports.New(reports.Config{MaxInstances: 2, MaxReporters: 2})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	calls := []reports.Calls{{ID: "a", Failures: 5}, {ID: "b", Failures: 5}, {ID: "c", Failures: 5}, {ID: "ok", Successes: 5}}
	for _, r := range []string{"r1", "r2", "r3"} {
		a.Add(r, "orders", calls, t0)
	}
	if a.Failing("orders", "c", t0) != 0 || a.Failing("orders", "a", t0) != 2 {
		t.Fatalf("bounds not kept: c %d, a %d", a.Failing("orders", "c", t0), a.Failing("orders", "a", t0))
	}
	if s := a.Stats(); s.Dropped == 0 {
		t.Fatalf("nothing counted as dropped: %+v", s)
	}
	if _, err := reports.New(reports.Config{Window: -1}); err == nil {
		t.Fatal("a negative window was accepted")
	}
}
