package lastresort_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/regcluster/registry/lastresort"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// TestTrackerProperties drives a Tracker with random registrations,
// health changes, vanishings, deregistrations (fed as two changes, or
// folded into one with LastSeen) and time, and checks after every change
// that what is offered is only ever: nothing while an instance is
// routable; never an instance the list has; only instances whose last
// removal was a vanishing while routable, within the grace of it, and
// after the last deliberate removal.
func TestTrackerProperties(t *testing.T) {
	const grace = time.Minute
	rapid.Check(t, func(rt *rapid.T) {
		tr, err := lastresort.New(lastresort.Config{Window: 10 * time.Second, Grace: grace, Fraction: rapid.Float64Range(0.1, 1).Draw(rt, "fraction")})
		if err != nil {
			rt.Fatal(err)
		}
		now := t0
		cur := map[string]*registryv1.Instance{}
		type removal struct {
			seq        int
			at         time.Time
			vanished   bool // not deliberate, and routable when last seen
			deliberate bool
		}
		last := map[string]removal{}
		lastDeliberate := -1
		seq := 0
		list := func() []*registryv1.Instance {
			out := make([]*registryv1.Instance, 0, len(cur))
			for _, in := range cur {
				out = append(out, in)
			}
			slices.SortFunc(out, func(a, b *registryv1.Instance) int { return strings.Compare(a.Id, b.Id) })
			return out
		}
		id := rapid.SampledFrom([]string{"a", "b", "c", "d", "e", "f"})
		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			prev := list()
			var seen []*registryv1.Instance
			seq++
			switch op := rapid.IntRange(0, 5).Draw(rt, "op"); op {
			case 0: // register (or come back)
				i := id.Draw(rt, "id")
				cur[i] = serving(i)
			case 1: // the prober finds it down
				i := id.Draw(rt, "id")
				if in, ok := cur[i]; ok {
					cur[i] = unavailable(in)
				}
			case 2, 3: // vanish: one, or all at once
				var gone []string
				if op == 2 {
					gone = []string{id.Draw(rt, "id")}
				} else {
					gone = slices.Collect(func(yield func(string) bool) {
						for k := range cur {
							if !yield(k) {
								return
							}
						}
					})
				}
				for _, i := range gone {
					if in, ok := cur[i]; ok {
						draining := in.Lifecycle == registryv1.Lifecycle_LIFECYCLE_DRAINING
						last[i] = removal{seq: seq, at: now, vanished: !draining && record.Routable(in), deliberate: draining}
						if draining {
							lastDeliberate = seq
						}
						delete(cur, i)
					}
				}
			case 4: // deregister: the mark, then the delete; seen apart or folded
				i := id.Draw(rt, "id")
				in, ok := cur[i]
				if !ok {
					continue
				}
				mark := drained(in)
				if rapid.Bool().Draw(rt, "folded") {
					seen = []*registryv1.Instance{mark}
				} else {
					cur[i] = mark
					tr.Observe("orders", prev, list(), now)
					prev = list()
				}
				delete(cur, i)
				last[i] = removal{seq: seq, at: now, deliberate: true}
				lastDeliberate = seq
			case 5:
				now = now.Add(time.Duration(rapid.IntRange(0, 90).Draw(rt, "seconds")) * time.Second)
				tr.Expire(now)
			}
			l := list()
			tr.Observe("orders", lastresort.LastSeen(prev, seen), l, now)
			offer := tr.Offer("orders", l, now)
			for _, in := range l {
				if record.Routable(in) && len(offer) > 0 {
					rt.Fatalf("offered %v while %s is routable", ids(offer), in.Id)
				}
			}
			for _, in := range offer {
				if _, ok := cur[in.Id]; ok {
					rt.Fatalf("offered %s, which is in the list", in.Id)
				}
				r := last[in.Id]
				if !r.vanished || r.seq <= lastDeliberate || !now.Before(r.at.Add(grace)) {
					rt.Fatalf("offered %s at %v: its last removal %+v, last deliberate removal at step %d", in.Id, now.Sub(t0), r, lastDeliberate)
				}
			}
			if n, _ := tr.Held("orders"); n < len(offer) {
				rt.Fatalf("Held %d < offered %d", n, len(offer))
			}
		}
	})
}
