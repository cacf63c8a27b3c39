package fanout

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// BenchmarkQuietServices: 1,000 subscribers over 100 services, each read
// by its own goroutine as a stream does, while transactions, 2ms apart
// (500 a second), change one other service. Reported: the progress
// messages those subscribers are sent per transaction, and the CPU time
// the process spent per transaction; "gap=0" is the hub without pacing
// (progress to every subscriber on every tick), "gap=default" the hub as
// regnode runs it (Config.ProgressGap).
func BenchmarkQuietServices(b *testing.B) {
	for _, bc := range []struct {
		name string
		gap  time.Duration
	}{{"gap=0", time.Nanosecond}, {"gap=default", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			const S, K = 1000, 100
			h := newHub(Config{RingSize: 1 << 20, QueueSize: 1 << 20, CatchUpTimeout: time.Second, ProgressGap: bc.gap,
				Logger: slog.New(slog.DiscardHandler)})
			defer h.beats.close()
			mustApply(b, h, cache.Batch{Revision: 1, Snapshot: true, Epoch: "e1", Instances: []*registryv1.Instance{benchInst(0, 0)}})
			ctx, cancel := context.WithCancel(context.Background())
			var (
				msgs atomic.Int64
				wg   sync.WaitGroup
			)
			for i := range S {
				s := subscribe(b, h, fmt.Sprintf("svc-%02d", i%K), 0)
				next(b, s)
				wg.Go(func() {
					for {
						if _, err := s.Next(ctx); err != nil {
							return
						}
						msgs.Add(1)
					}
				})
			}
			cpu0 := processCPU(b)
			b.ResetTimer()
			for i := range b.N {
				in := benchInst(i%20, i)
				if err := h.apply(cache.Batch{Revision: int64(i + 2), Events: []cache.Event{
					{Type: cache.Put, Service: "orders", ID: in.Id, Instance: in}}}); err != nil {
					b.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond)
			}
			b.StopTimer()
			cpu := processCPU(b) - cpu0
			cancel()
			wg.Wait()
			b.ReportMetric(float64(msgs.Load())/float64(b.N), "quiet-msgs/change")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/change")
		})
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
