package prober

import (
	"fmt"
	"testing"
	"time"

	"github.com/regcluster/registry/store"
)

// The retention counts from the first listing that shows a state orphaned,
// only while every listing shows it unchanged.
func TestOrphanClock(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	const ret = time.Hour
	a := store.Orphan{Service: "s", ID: "a", ModRevision: 10}
	b := store.Orphan{Service: "s", ID: "b", ModRevision: 11}
	bChanged := b
	bChanged.ModRevision = 20
	c := newOrphanClock(ret)
	steps := []struct {
		at   time.Duration
		list []store.Orphan
		want []store.Orphan
	}{
		{0, []store.Orphan{a, b}, nil},
		{ret - time.Nanosecond, []store.Orphan{a, b}, nil},
		{ret, []store.Orphan{a, b}, []store.Orphan{a, b}},
		{ret + time.Minute, []store.Orphan{a, bChanged}, []store.Orphan{a}}, // b written again: counts afresh
		{ret + 2*time.Minute, []store.Orphan{bChanged}, nil},                // a registered again: gone from the listing
		{ret + 3*time.Minute, []store.Orphan{a, bChanged}, nil},             // a orphaned again: afresh
		{2*ret + time.Minute - time.Nanosecond, []store.Orphan{a, bChanged}, nil},
		{2*ret + time.Minute, []store.Orphan{a, bChanged}, []store.Orphan{bChanged}},
		{2*ret + 3*time.Minute, []store.Orphan{a, bChanged}, []store.Orphan{a, bChanged}},
	}
	for i, st := range steps {
		got := c.due(st.list, t0.Add(st.at))
		if fmt.Sprint(got) != fmt.Sprint(st.want) {
			t.Fatalf("step %d (at %v): due %v, want %v", i, st.at, got, st.want)
		}
	}
}

// A state that drops out of one listing (registered again, then lost once
// more) starts its retention afresh.
func TestOrphanClockForgets(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	a := store.Orphan{Service: "s", ID: "a", ModRevision: 10}
	c := newOrphanClock(time.Hour)
	c.due([]store.Orphan{a}, t0)
	c.due(nil, t0.Add(59*time.Minute))
	if got := c.due([]store.Orphan{a}, t0.Add(61*time.Minute)); len(got) != 0 {
		t.Fatalf("due %v right after coming back", got)
	}
	if got := c.due([]store.Orphan{a}, t0.Add(121*time.Minute)); len(got) != 1 {
		t.Fatalf("due %v an hour after coming back", got)
	}
}
