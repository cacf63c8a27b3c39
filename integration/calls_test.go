package integration

import (
	"strings"
	"testing"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// The call checker judges by revision windows: one instance at A is
// registered (2), drained (3) and deleted (4); another takes A (5). A call
// whose window lies inside [3, 4] reached an instance no view had in
// rotation; a window touching a routable revision did not; an address
// never registered is never routed to; a window past the history is not
// judged.
func TestCheckCallsJudgesByRevision(t *testing.T) {
	keys := record.NewKeys("")
	put := func(rev, create int64, id, addr string, lc registryv1.Lifecycle) Event {
		b, err := record.Encode(&registryv1.Instance{Service: "orders", Id: id, Address: addr, Weight: 100, Lifecycle: lc})
		if err != nil {
			t.Fatal(err)
		}
		return Event{Rev: rev, Key: keys.Instance("orders", id), Value: b, Create: create}
	}
	const a, b = "127.0.0.1:1001", "127.0.0.1:1002"
	events := []Event{
		put(2, 2, "k1", a, registryv1.Lifecycle_LIFECYCLE_SERVING),
		put(3, 2, "k1", a, registryv1.Lifecycle_LIFECYCLE_DRAINING),
		{Rev: 4, Key: keys.Instance("orders", "k1"), Delete: true},
		put(5, 5, "k2", a, registryv1.Lifecycle_LIFECYCLE_SERVING),
	}
	calls := []Call{
		{ID: "in-rotation", Before: 2, After: 2},
		{ID: "drained-then-deleted", Before: 3, After: 4},
		{ID: "routed-before-the-drain", Before: 2, After: 3},
		{ID: "routed-after-the-new-one", Before: 4, After: 5},
		{ID: "never-registered", Before: 3, After: 3},
		{ID: "past-the-history", Before: 3, After: 9},
	}
	served := []Served{
		{ID: "in-rotation", Addr: a}, {ID: "drained-then-deleted", Addr: a}, {ID: "routed-before-the-drain", Addr: a},
		{ID: "routed-after-the-new-one", Addr: a}, {ID: "never-registered", Addr: b}, {ID: "past-the-history", Addr: a},
		{ID: "no-such-call", Addr: a},
	}
	var rep Report
	CheckCalls(&rep, events, 5, calls, served)
	if rep.Calls != 5 || rep.OutOfRotation != 2 {
		t.Errorf("judged %d calls, %d near a rotation change; want 5 and 2", rep.Calls, rep.OutOfRotation)
	}
	want := []string{"no-such-call", "drained-then-deleted", "never-registered"}
	if len(rep.Violations) != len(want) {
		t.Fatalf("violations %q, want one for each of %q", rep.Violations, want)
	}
	for _, id := range want {
		found := false
		for _, v := range rep.Violations {
			found = found || strings.Contains(v, "call "+id+" ")
		}
		if !found {
			t.Errorf("no violation for %s in %q", id, rep.Violations)
		}
	}
}
