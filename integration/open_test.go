package integration

import (
	"strings"
	"testing"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Invariant 4 is judged at the revision the finish saw every open
// registration held: k1 is put (2), revoked (4) and put again (6); k2 is
// put (3) and deleted (5) for good. At 3 both are held; at 4 k1 is not;
// at the end k2 is not, and its violation lists its events.
func TestCheckJudgesOpenRegistrationsAtTheirRevision(t *testing.T) {
	keys := record.NewKeys("")
	put := func(rev, create int64, id string) Event {
		b, err := record.Encode(&registryv1.Instance{Service: "orders", Id: id, Address: "127.0.0.1:1001", Weight: 100})
		if err != nil {
			t.Fatal(err)
		}
		return Event{Rev: rev, Key: keys.Instance("orders", id), Value: b, Create: create, Lease: 0x1f}
	}
	k1, k2 := keys.Instance("orders", "k1"), keys.Instance("orders", "k2")
	events := []Event{put(2, 2, "k1"), put(3, 3, "k2"), {Rev: 4, Key: k1, Delete: true}, {Rev: 5, Key: k2, Delete: true}, put(6, 6, "k1")}
	for _, tc := range []struct {
		at   int64
		want []string // keys with a violation
	}{
		{at: 3},
		{at: 4, want: []string{k1}},
		{at: 5, want: []string{k1, k2}},
		{at: 0, want: []string{k2}},
	} {
		rep := Check(append([]Event(nil), events...), 6, nil, []string{k1, k2}, tc.at)
		if len(rep.Violations) != len(tc.want) {
			t.Fatalf("at %d: violations %q, want one for each of %q", tc.at, rep.Violations, tc.want)
		}
		for i, key := range tc.want {
			if !strings.HasPrefix(rep.Violations[i], key+": its registration is open") {
				t.Errorf("at %d: violation %q, want one for %s", tc.at, rep.Violations[i], key)
			}
		}
	}
	rep := Check(append([]Event(nil), events...), 6, nil, []string{k2}, 0)
	if len(rep.Violations) != 1 || !strings.HasSuffix(rep.Violations[0], "its events: 3:put@1f 5:delete") {
		t.Errorf("violation %q does not list k2's events", rep.Violations)
	}
}
