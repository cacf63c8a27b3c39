package prober

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// BenchmarkSyncOneChange measures what following the view costs the
// prober per revision: 10,000 instances with a check (in 100 services, or
// all in one) or 100,000 in 1,000 services, and one of them changed (a new
// record, as a health write or a drain makes) per revision.
// The cache's own Apply is not timed; only the prober's sync is.
func BenchmarkSyncOneChange(b *testing.B) {
	for _, c := range []struct{ n, services int }{{10_000, 100}, {10_000, 1}, {100_000, 1000}} {
		n, services := c.n, c.services
		b.Run(fmt.Sprintf("instances=%d/services=%d", n, services), func(b *testing.B) {
			c := cache.New()
			insts := make([]*registryv1.Instance, n)
			for i := range insts {
				insts[i] = benchInstance(fmt.Sprintf("svc-%03d", i%services), fmt.Sprintf("i-%05d", i), 1)
			}
			if _, err := c.Apply(cache.Batch{Revision: 1, Snapshot: true, Instances: insts}); err != nil {
				b.Fatal(err)
			}
			p := &Prober{cfg: Config{Probe: zeroChecker(), Thresholds: health.DefaultThresholds(),
				Interval: time.Second, Floor: 100 * time.Millisecond}}
			p.log = discardLogger()
			f := p.newFollower()
			now := time.Now()
			f.sync(c.Snapshot(), now)
			if len(f.all) != n {
				b.Fatalf("tracking %d instances, want %d", len(f.all), n)
			}
			rev := int64(1)
			// The views are made ahead, a batch at a time, so that only
			// the prober's sync is timed (not the cache's Apply, and not
			// a Stop/StartTimer per revision).
			const batch = 256
			views := make([]*cache.Snapshot, 0, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				b.StopTimer()
				views = views[:0]
				for k := i; k < min(i+batch, b.N); k++ {
					rev++
					old := insts[(k*7919)%n]
					next := benchInstance(old.Service, old.Id, rev)
					if _, err := c.Apply(cache.Batch{Revision: rev, Events: []cache.Event{{Type: cache.Put, Instance: next}}}); err != nil {
						b.Fatal(err)
					}
					views = append(views, c.Snapshot())
				}
				b.StartTimer()
				for _, snap := range views {
					f.sync(snap, now)
				}
			}
			b.StopTimer()
			if len(f.all) != n {
				b.Fatalf("tracking %d instances after the changes, want %d", len(f.all), n)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/revision")
		})
	}
}

func benchInstance(service, id string, rev int64) *registryv1.Instance {
	return &registryv1.Instance{Service: service, Id: id, Address: "127.0.0.1:1", CreateRevision: 1, ModRevision: rev,
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
		Check:     &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
