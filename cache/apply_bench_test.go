package cache

import (
	"fmt"
	"strconv"
	"testing"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// BenchmarkApplyLarge measures applying one small batch to one large
// service: what a regnode pays per group-committed Register transaction
// (one watch batch) once a service has many instances. Each op is one
// batch of `batch` events on a service of `n` instances:
//
//   - register: even ops put `batch` new ids, odd ops delete them again
//     (registrations and expiries, the service staying at n or n+batch);
//   - update: `batch` existing records get a new mod revision (health
//     writes, renewals that rewrite a record).
//
// Ids are "r-<seq>", like regbench's, so new ones land all over the sorted
// order rather than at its end. It uses only the exported API, so it runs
// the same on any version of the package.
func BenchmarkApplyLarge(b *testing.B) {
	for _, n := range []int{1_000, 36_000, 100_000} {
		for _, batch := range []int{1, 32} {
			for _, op := range []string{"register", "update"} {
				b.Run(fmt.Sprintf("n=%d/batch=%d/%s", n, batch, op), func(b *testing.B) {
					benchApply(b, n, batch, op)
				})
			}
		}
	}
}

func benchApply(b *testing.B, n, batch int, op string) {
	const svc = "bench"
	all := make([]*registryv1.Instance, n)
	for i := range all {
		all[i] = in(svc, "r-"+strconv.Itoa(i), "10.0.0.1:80", 1)
	}
	c := New()
	if _, err := c.Apply(Batch{Revision: 1, Snapshot: true, Instances: all}); err != nil {
		b.Fatal(err)
	}
	rev, seq := int64(1), n
	var fresh []string // the ids the last register op added
	evs := make([]Event, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rev++
		switch {
		case op == "update":
			for j := range evs {
				k := (i*batch + j) * 7919 % n // spread over the service
				evs[j] = put(in(svc, "r-"+strconv.Itoa(k), "10.0.0.1:80", rev))
			}
		case i%2 == 0:
			fresh = fresh[:0]
			for j := range evs {
				id := "r-" + strconv.Itoa(seq)
				seq++
				fresh = append(fresh, id)
				evs[j] = put(in(svc, id, "10.0.0.1:80", rev))
			}
		default:
			for j, id := range fresh {
				evs[j] = del(svc, id)
			}
		}
		if _, err := c.Apply(Batch{Revision: rev, Events: evs}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if got := c.Len(); got != n && got != n+batch {
		b.Fatalf("service holds %d instances, want %d or %d", got, n, n+batch)
	}
}
