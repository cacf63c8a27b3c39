package fanout

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"google.golang.org/grpc/mem"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// BenchmarkDeliver: one transaction (one put of a ~300-byte record) goes
// to S subscribers of its service, each taking its unit and the wire
// bytes of its messages as Watch does (server.Encoded through the codec:
// a one-buffer mem.BufferSlice over the shared bytes). Reported per
// delivered event per subscriber: allocations and bytes allocated, the
// hub's own share (apply, the unit, its one encoding) spread over S.
func BenchmarkDeliver(b *testing.B) {
	for _, S := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("subs=%d", S), func(b *testing.B) {
			var insts []*registryv1.Instance
			for i := range 20 {
				insts = append(insts, benchInst(i, 0))
			}
			h, _ := testHub(b, 1<<30, insts...)
			subs := make([]*Sub, S)
			for i := range subs {
				subs[i] = subscribe(b, h, "orders", 0)
				next(b, subs[i])
			}
			ctx := context.Background()
			var sent int
			wire := func(u *Unit) {
				chunks, err := u.Chunks()
				if err != nil {
					b.Fatal(err)
				}
				for _, c := range chunks {
					sent += mem.BufferSlice{mem.SliceBuffer(c)}.Len()
				}
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b.ResetTimer()
			for i := range b.N {
				rev := int64(i + 2)
				in := benchInst(i%20, i)
				if err := h.apply(cache.Batch{Revision: rev, Events: []cache.Event{
					{Type: cache.Put, Service: "orders", ID: in.Id, Instance: in}}}); err != nil {
					b.Fatal(err)
				}
				for _, s := range subs {
					u, err := s.Next(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if u.Revision() != rev || len(u.Batch().Events) != 1 {
						b.Fatalf("subscriber got %+v, want the put at %d", u.Batch(), rev)
					}
					wire(u)
				}
			}
			b.StopTimer()
			runtime.ReadMemStats(&after)
			per := float64(b.N) * float64(S)
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/per, "allocs/sub-event")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/per, "B/sub-event")
			b.ReportMetric(float64(sent)/per, "wire-B/sub-event")
		})
	}
}

func benchInst(i, v int) *registryv1.Instance {
	return &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("o-%02d", i), Address: "10.0.0.1:8080", Zone: "z1",
		Version: fmt.Sprint("v", v), Weight: 100, Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
		Metadata:    map[string]string{"team": "core", "build": "2026-12-01T12:00:00Z", "region": "eu-west-1"},
		ModRevision: int64(v + 2), CreateRevision: 2}
}
