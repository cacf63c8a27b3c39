package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// BenchmarkRegister measures registrations per second through regnode's
// API (lease grant + compare-and-put, over gRPC) against raw etcd lease
// grant + put from a client, at the same concurrency, on the same etcd
// (fsync on). The two alternate in rounds so that machine noise hits both;
// it reports ours/s, raw/s and their ratio.
func BenchmarkRegister(b *testing.B) {
	m := etcdtest.Start(b, true)
	// Unlimited: this measures the registry's cost, not its per-peer limits
	// (thousands of registrations from one host in a few seconds).
	rn := regnodetest.StartWith(b, node.Config{EtcdEndpoints: []string{m.ClientURL}, Limits: peerlimit.Unlimited()}, m.ClientURL)
	api := newClient(b, rn.Addr).API()
	raw := m.Client(b)
	keys := record.NewKeys("")
	var seq atomic.Int64

	ours := func(ctx context.Context) error {
		n := seq.Add(1)
		_, err := api.Register(ctx, &registryv1.RegisterRequest{
			Instance: &registryv1.Instance{Service: "bench", Id: fmt.Sprint("o-", n), Address: "10.0.0.1:80"},
			Ttl:      durationpb.New(30 * time.Second)})
		return err
	}
	direct := func(ctx context.Context) error {
		n := seq.Add(1)
		in := &registryv1.Instance{Service: "bench", Id: fmt.Sprint("r-", n), Address: "10.0.0.1:80"}
		g, err := raw.Grant(ctx, 30)
		if err != nil {
			return err
		}
		in.LeaseId = int64(g.ID)
		val, err := record.Encode(in)
		if err != nil {
			return err
		}
		_, err = raw.Put(ctx, keys.Instance(in.Service, in.Id), string(val), clientv3.WithLease(g.ID))
		return err
	}
	for _, conc := range []int{1, 32} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) {
			ctx := context.Background()
			// Warm both paths (connections, leases) before timing.
			if err := run(ctx, 64, conc, ours); err != nil {
				b.Fatal(err)
			}
			if err := run(ctx, 64, conc, direct); err != nil {
				b.Fatal(err)
			}
			var oursT, rawT time.Duration
			const rounds = 4
			per := max(b.N/rounds, conc)
			b.ResetTimer()
			for range rounds {
				t0 := time.Now()
				if err := run(ctx, per, conc, ours); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := run(ctx, per, conc, direct); err != nil {
					b.Fatal(err)
				}
				oursT += t1.Sub(t0)
				rawT += time.Since(t1)
			}
			total := float64(per * rounds)
			o, r := total/oursT.Seconds(), total/rawT.Seconds()
			b.ReportMetric(o, "ours/s")
			b.ReportMetric(r, "raw/s")
			b.ReportMetric(o/r, "ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// run performs n calls of f on conc goroutines.
func run(ctx context.Context, n, conc int, f func(context.Context) error) error {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first atomic.Value
	)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := f(ctx); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}
