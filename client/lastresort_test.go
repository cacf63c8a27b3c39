package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/lastresort"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// lrFixture is a regnode, a client with cfg's last resort, n real gRPC
// backends registered with 2 s leases kept alive straight in etcd (so a
// test can revoke them, as an etcd leader stall does), a registry:///
// channel to them and a subscription of the service.
type lrFixture struct {
	rn     *regnodetest.Regnode
	c      *client.Client
	st     *store.Store
	sub    *client.Subscription
	cc     *grpc.ClientConn
	bs     []*backend
	leases []clientv3.LeaseID
	stop   []context.CancelFunc
}

func newLRFixture(t *testing.T, n int, cfg lastresort.Config) *lrFixture {
	t.Helper()
	f := &lrFixture{rn: regnodetest.Start(t)}
	var err error
	if f.c, err = client.New(client.Config{Endpoints: []string{f.rn.Addr}, Policy: noSlowStart(), LastResort: cfg}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.c.Close() })
	if f.st, err = storeFor(t, f.rn); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	for i := range n {
		b := startBackend(t)
		f.bs = append(f.bs, b)
		reg, err := f.st.Register(context.Background(), &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("b%d", i), Address: b.addr}, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		kctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		ka, err := f.rn.Etcd.KeepAlive(kctx, clientv3.LeaseID(reg.LeaseID))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for range ka { // closed when kctx ends or the lease is gone
			}
		})
		f.leases, f.stop = append(f.leases, clientv3.LeaseID(reg.LeaseID)), append(f.stop, cancel)
	}
	if f.sub, err = f.c.Subscribe(context.Background(), "orders", client.SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	if f.cc, err = grpc.NewClient("registry:///orders", f.c.DialOptions()...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cc.Close() })
	waitFor(t, 10*time.Second, "calls reaching every backend", func() bool {
		for _, s := range shares(t, f.cc, 10*n, f.bs...) {
			if s == 0 {
				return false
			}
		}
		return true
	})
	return f
}

// revoke revokes the leases of the backends given, at once, as an etcd
// leader stall or a restore does: their records vanish, not deregistered.
func (f *lrFixture) revoke(t *testing.T, which ...int) {
	t.Helper()
	var wg sync.WaitGroup
	for _, i := range which {
		f.stop[i]()
		wg.Go(func() {
			if _, err := f.rn.Etcd.Revoke(context.Background(), f.leases[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// call makes one fail-fast call on the channel.
func (f *lrFixture) call() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(f.cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// caller makes calls until the returned func is called, which returns the
// calls made and the errors.
func (f *lrFixture) caller() (stop func() (calls int64, errs []error)) {
	var (
		n    atomic.Int64
		mu   sync.Mutex
		errs []error
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			err := f.call()
			n.Add(1)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}
	})
	return func() (int64, []error) {
		close(done)
		wg.Wait()
		return n.Load(), errs
	}
}

func (f *lrFixture) noInstance(t *testing.T) bool {
	err := f.call()
	return status.Code(err) == codes.Unavailable && status.Convert(err).Message() == "no instance of orders is registered"
}

// (a) The three instances' leases revoked at once while their backends
// stay up: the channel keeps calling them, not one call fails, Freshness
// shows them served as a last resort; one registering again ends it at
// once and then takes every call.
func TestLastResortKeepsVanishedInstances(t *testing.T) {
	f := newLRFixture(t, 3, lastresort.Config{Grace: time.Minute})
	stop := f.caller()
	f.revoke(t, 0, 1, 2)
	waitFor(t, 10*time.Second, "the view empty and the last resort served", func() bool {
		fr := f.sub.Freshness()
		return len(f.sub.Instances("orders")) == 0 && fr.LastResort == 3 && time.Until(fr.LastResortUntil) > 30*time.Second
	})
	before := make([]int64, 3)
	for i, b := range f.bs {
		before[i] = b.calls.Load()
	}
	waitFor(t, 10*time.Second, "calls reaching every vanished backend", func() bool {
		for i, b := range f.bs {
			if b.calls.Load()-before[i] < 20 {
				return false
			}
		}
		return true
	})
	if c := f.c.Metrics().Counts(); c.LastResorts == 0 || c.LastResortHeld["orders"] != 3 {
		t.Fatalf("last resort not counted: %d started, held %v", c.LastResorts, c.LastResortHeld)
	}
	if _, err := f.st.Register(context.Background(), &registryv1.Instance{Service: "orders", Id: "b0", Address: f.bs[0].addr}, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the last resort ended by the re-registration", func() bool {
		fr := f.sub.Freshness()
		return len(f.sub.Instances("orders")) == 1 && fr.LastResort == 0 && fr.LastResortUntil.IsZero()
	})
	// b0 is dropped from the last resort; b1 and b2 are held, unused
	// while b0 is routable, till the grace ends.
	if held := f.c.Metrics().Counts().LastResortHeld["orders"]; held != 2 {
		t.Fatalf("held as a last resort after b0 came back: %d, want 2", held)
	}
	// (The caller runs on: shares counts its calls too, so only the
	// others' zero shares are exact.)
	waitFor(t, 10*time.Second, "calls going to b0 only", func() bool {
		s := shares(t, f.cc, 20, f.bs...)
		return s[1] == 0 && s[2] == 0
	})
	if s := shares(t, f.cc, 200, f.bs...); s[0] == 0 || s[1] != 0 || s[2] != 0 {
		t.Fatalf("after b0 came back, calls still went to the others: %v", s)
	}
	calls, errs := stop()
	if len(errs) > 0 {
		t.Fatalf("%d of %d calls failed through the incident; first: %v", len(errs), calls, errs[0])
	}
	t.Logf("%d calls, none failed", calls)
}

// (b) The same three deregistered (the Deregister RPC) or closed
// gracefully (the SDK's Registration.Close): no last resort, the channel
// has no instance at once.
func TestLastResortNotOnDeregistration(t *testing.T) {
	t.Run("Deregister RPC", func(t *testing.T) {
		f := newLRFixture(t, 3, lastresort.Config{Grace: time.Minute})
		for i := range 3 {
			if _, err := f.c.API().Deregister(context.Background(), &registryv1.DeregisterRequest{Service: "orders", Id: fmt.Sprintf("b%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 5*time.Second, "calls failing with no instance", func() bool { return f.noInstance(t) })
		if fr, n := f.sub.Freshness(), f.c.Metrics().Counts().LastResorts; fr.LastResort != 0 || n != 0 {
			t.Fatalf("a deregistration started a last resort: freshness %d, %d started", fr.LastResort, n)
		}
	})
	t.Run("graceful close", func(t *testing.T) {
		f := newLRFixture(t, 0, lastresort.Config{Grace: time.Minute})
		var regs []*client.Registration
		bs := []*backend{startBackend(t), startBackend(t), startBackend(t)}
		for i, b := range bs {
			r, err := f.c.Register(context.Background(), &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("g%d", i), Address: b.addr},
				client.RegisterOptions{TTL: 2 * time.Second, DrainGrace: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			regs = append(regs, r)
		}
		waitFor(t, 10*time.Second, "calls reaching every backend", func() bool {
			s := shares(t, f.cc, 30, bs...)
			return s[0] > 0 && s[1] > 0 && s[2] > 0
		})
		var wg sync.WaitGroup
		for _, r := range regs {
			wg.Go(func() {
				if err := r.Close(context.Background()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		waitFor(t, 5*time.Second, "calls failing with no instance", func() bool { return f.noInstance(t) })
		if fr, n := f.sub.Freshness(), f.c.Metrics().Counts().LastResorts; fr.LastResort != 0 || n != 0 {
			t.Fatalf("a graceful close started a last resort: freshness %d, %d started", fr.LastResort, n)
		}
	})
}

// (c) One of ten vanishing is no incident: nothing is held.
func TestLastResortNotForAFew(t *testing.T) {
	f := newLRFixture(t, 10, lastresort.Config{Grace: time.Minute})
	f.revoke(t, 4)
	waitFor(t, 10*time.Second, "b4 gone from the view", func() bool { return len(f.sub.Instances("orders")) == 9 })
	if c := f.c.Metrics().Counts(); c.LastResorts != 0 || len(c.LastResortHeld) != 0 {
		t.Fatalf("one of ten vanishing started a last resort: %d started, held %v", c.LastResorts, c.LastResortHeld)
	}
}

// (d) The grace ending drops the last resort with no change in the
// registry: the channel then has no instance.
func TestLastResortGraceEnds(t *testing.T) {
	f := newLRFixture(t, 3, lastresort.Config{Grace: 3 * time.Second})
	f.revoke(t, 0, 1, 2)
	waitFor(t, 10*time.Second, "the last resort served", func() bool { return f.sub.Freshness().LastResort == 3 })
	if err := f.call(); err != nil {
		t.Fatalf("a call during the last resort: %v", err)
	}
	waitFor(t, 10*time.Second, "the grace over", func() bool {
		fr := f.sub.Freshness()
		return fr.LastResort == 0 && fr.LastResortUntil.IsZero()
	})
	waitFor(t, 5*time.Second, "calls failing with no instance", func() bool { return f.noInstance(t) })
	if c := f.c.Metrics().Counts(); len(c.LastResortHeld) != 0 {
		t.Fatalf("still held after the grace: %v", c.LastResortHeld)
	}
}
