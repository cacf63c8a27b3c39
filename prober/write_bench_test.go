package prober

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// BenchmarkHealthWrites measures health writes per second to one embedded
// etcd member, 1,000 instances, each write under a fence, and the etcd
// round trips each write takes, with the member on loopback and behind a
// link adding 1ms to every chunk each way (etcd on another machine):
//
//   - inline: what the probe loop did before, store.UpdateIf (a read, then
//     the txn) called in the loop, one write at a time;
//   - writer: the prober's writer (store.UpdateFrom from the record as the
//     view holds it, 8 writes in flight), transitions submitted as fast as
//     the loop makes them and the benchmark waiting for every one to land.
func BenchmarkHealthWrites(b *testing.B) {
	m := etcdtest.Start(b, false)
	link := etcdtest.NewProxy(b, m.ClientURL)
	link.Delay(time.Millisecond)
	direct, err := store.New(store.Config{Client: m.Client(b)})
	if err != nil {
		b.Fatal(err)
	}
	for _, at := range []struct{ name, url string }{{"direct", m.ClientURL}, {"link=1ms", link.URL()}} {
		b.Run(at.name, func(b *testing.B) { benchHealthWrites(b, at.url, direct, "bench-"+strings.TrimSuffix(at.name, "=1ms")) })
	}
}

// benchHealthWrites writes through a client of url to the instances of
// service, which it registers through direct.
func benchHealthWrites(b *testing.B, url string, direct *store.Store, service string) {
	var rpcs atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		rpcs.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: etcdtest.QuietLogger(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	st, err := store.New(store.Config{Client: cli})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	leaderKey := "/bench/leader/" + service
	r, err := cli.Put(ctx, leaderKey, "me")
	if err != nil {
		b.Fatal(err)
	}
	guard := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(leaderKey), "=", r.Header.Revision)}
	const n = 1000
	insts := make([]*registryv1.Instance, n)
	for i := range insts {
		reg, err := direct.Register(ctx, &registryv1.Instance{Service: service, Id: fmt.Sprintf("i-%04d", i), Address: "127.0.0.1:1"}, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		insts[i] = reg.Instance
	}
	states := []registryv1.HealthState{registryv1.HealthState_HEALTH_STATE_HEALTHY, registryv1.HealthState_HEALTH_STATE_DEGRADED}
	healthOf := func(k int) *registryv1.Health {
		return &registryv1.Health{State: states[(k/n)%2], Reason: fmt.Sprint("w", k), Observer: "bench"}
	}
	report := func(b *testing.B, rpc0 int64) {
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		b.ReportMetric(float64(rpcs.Load()-rpc0)/float64(b.N), "rpcs/write")
	}

	b.Run("inline", func(b *testing.B) {
		rpc0 := rpcs.Load()
		for k := range b.N {
			in := insts[k%n]
			h := healthOf(k)
			if _, _, err := st.UpdateIf(ctx, in.Service, in.Id, guard, func(in *registryv1.Instance) error {
				in.Health = h
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		report(b, rpc0)
	})

	b.Run("writer", func(b *testing.B) {
		var mu sync.Mutex
		landed := 0
		var w *writer
		wait := func(k int) { // until k writes landed
			deadline := time.Now().Add(5 * time.Minute)
			for {
				mu.Lock()
				l := landed
				mu.Unlock()
				if l >= k {
					return
				}
				select {
				case <-w.Fenced():
					b.Fatal("the writer was fenced")
				default:
				}
				if time.Now().After(deadline) {
					b.Fatalf("%d writes landed, want %d", l, k)
				}
				time.Sleep(100 * time.Microsecond)
			}
		}
		w = newWriter(st, guard, 8, discardLogger(), func(health.Transition) {
			mu.Lock()
			landed++
			mu.Unlock()
		})
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { w.run(wctx) })
		defer func() { cancel(); wg.Wait() }()
		// One round outside the timing: the writer learns each
		// instance's saved state on its first write (a read, then the
		// txn); the steady state is what is timed.
		for k, in := range insts {
			h := &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Reason: fmt.Sprint("warm", k), Observer: "bench"}
			w.submit(in, health.Transition{To: h.State, Reason: h.Reason}, h)
		}
		wait(n)
		mu.Lock()
		landed = 0
		mu.Unlock()
		// The records as the regnode's view holds them by the next
		// transition of an instance (they are probes apart): what the
		// prober submits with it.
		view := func() {
			list, _, _, err := direct.List(ctx, service)
			if err != nil || len(list) != n {
				b.Fatalf("list: %d instances, %v", len(list), err)
			}
			copy(insts, list)
		}
		view()
		rpc0 := rpcs.Load()
		b.ResetTimer()
		for k := range b.N {
			in := insts[k%n]
			h := healthOf(k)
			// One transition per instance in flight at a time, as a
			// machine makes them (probes apart): wait for the previous
			// round before the next.
			if k%n == 0 && k > 0 {
				wait(k)
				b.StopTimer()
				view()
				b.StartTimer()
			}
			w.submit(in, health.Transition{To: h.State, Reason: h.Reason}, h)
		}
		wait(b.N)
		b.StopTimer()
		report(b, rpc0)
		if _, coalesced := w.stats(); coalesced != 0 {
			b.Fatalf("%d writes coalesced: the benchmark must land every one", coalesced)
		}
	})
}
