package xds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/netproxy"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Mass expiry: every instance of a service loses its lease at once while
// its process lives (the leases revoked behind the registry's back, as an
// etcd leader stall or a restore does). Its SDK keepers register it again
// by themselves (once the test lets them reach the regnode); meanwhile callers through registry:/// and through
// grpc-go's own xDS client (both fail-fast: a call with nothing to call
// fails at once) keep succeeding on the vanished instances, held as a
// last resort, and not one call fails. The SDK's Freshness and the
// regnode's xDS counter say the view was held.
func TestMassExpiryLosesNoCall(t *testing.T) {
	rn := regnodetest.Start(t)
	// The keepers reach the regnode through a link the test holds while
	// it revokes, so their new registrations come only once both callers'
	// views have seen the instances vanish (else a keeper renewing right
	// after the revoke could hide the incident).
	link, err := netproxy.New("127.0.0.1:0", rn.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Cut()
	keepers, err := client.New(client.Config{Endpoints: []string{link.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer keepers.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const n = 3
	var (
		bs   []*backend
		regs []*client.Registration
	)
	for i := range n {
		b := startBackend(t)
		bs = append(bs, b)
		reg, err := keepers.Register(ctx, &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("b%d", i), Address: b.addr},
			client.RegisterOptions{TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, reg)
	}
	defer func() {
		for _, r := range regs {
			_ = r.Close(context.Background())
		}
	}()

	// The SDK's caller.
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sdkCall := func() error { // fail-fast
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		_, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{})
		return err
	}
	// grpc-go's xDS caller, in its own process.
	boot, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": rn.Addr, "channel_creds": []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"}}},
		"node": map[string]any{"id": "mass-expiry"},
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestXDSChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REGISTRY_XDS_CHILD=orders", "REGISTRY_XDS_CONCURRENCY=4", "REGISTRY_XDS_FAILFAST=1")
	xdsCall := startChild(t, cmd, boot)

	waitFor(t, time.Minute, "both callers reaching every backend", func() bool {
		for range 20 {
			if sdkCall() != nil {
				return false
			}
		}
		if r := xdsCall(20); r.Failed != 0 {
			return false
		}
		for _, b := range bs {
			if b.calls.Load() == 0 {
				return false
			}
		}
		return true
	})

	// Both callers call without pause through the incident.
	var (
		sdkCalls, sdkFailed, xdsCalls, xdsFailed atomic.Int64
		firstErr                                 atomic.Value
		held                                     atomic.Bool // the SDK's Freshness showed a last resort
		done                                     = make(chan struct{})
		wg                                       sync.WaitGroup
	)
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			err := sdkCall()
			sdkCalls.Add(1)
			if err != nil {
				sdkFailed.Add(1)
				firstErr.CompareAndSwap(nil, "registry:///: "+err.Error())
			}
			if sub.Freshness().LastResort > 0 {
				held.Store(true)
			}
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			r := xdsCall(20)
			xdsCalls.Add(int64(r.OK + r.Failed))
			if r.Failed > 0 {
				xdsFailed.Add(int64(r.Failed))
				firstErr.CompareAndSwap(nil, "xds:///: "+r.Err)
			}
		}
	})

	// Stopped before the test's cleanups (which end the child) however
	// the test ends.
	stopCalls := sync.OnceFunc(func() { close(done); wg.Wait() })
	defer stopCalls()

	old := make([]int64, n)
	link.Pause()
	for i, r := range regs {
		old[i] = r.Status().LeaseID
		if _, err := rn.Etcd.Revoke(ctx, clientv3.LeaseID(old[i])); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, time.Minute, "both callers' views holding the vanished instances", func() bool {
		return held.Load() && metricValue(t, rn, "registry_xds_last_resort_started_total") == 1
	})
	s1, x1 := sdkCalls.Load(), xdsCalls.Load()
	waitFor(t, time.Minute, "100 calls of each caller on the instances held", func() bool {
		return sdkCalls.Load()-s1 >= 100 && xdsCalls.Load()-x1 >= 100
	})
	link.Resume()
	// The keepers register again, each under a new lease.
	waitFor(t, time.Minute, "every keeper registered again", func() bool {
		for i, r := range regs {
			if st := r.Status(); !st.Registered || st.LeaseID == old[i] {
				return false
			}
		}
		resp, err := rn.Etcd.Get(ctx, rn.Prefix+"instances/orders/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == n
	})
	// And calls go on past it, on the registered instances again.
	s0, x0 := sdkCalls.Load(), xdsCalls.Load()
	waitFor(t, time.Minute, "200 more calls of each caller", func() bool {
		return sdkCalls.Load()-s0 >= 200 && xdsCalls.Load()-x0 >= 200
	})
	stopCalls()

	t.Logf("registry:/// %d calls, %d failed; xds:/// %d calls, %d failed", sdkCalls.Load(), sdkFailed.Load(), xdsCalls.Load(), xdsFailed.Load())
	if sdkFailed.Load() != 0 || xdsFailed.Load() != 0 {
		t.Fatalf("calls failed through the mass expiry: registry:/// %d of %d, xds:/// %d of %d; first: %v",
			sdkFailed.Load(), sdkCalls.Load(), xdsFailed.Load(), xdsCalls.Load(), firstErr.Load())
	}
	if !held.Load() || c.Metrics().Counts().LastResorts == 0 {
		t.Fatalf("the SDK never held the vanished instances (Freshness showed it: %v; started %d)", held.Load(), c.Metrics().Counts().LastResorts)
	}
	if v := metricValue(t, rn, "registry_xds_last_resort_started_total"); v != 1 {
		t.Fatalf("registry_xds_last_resort_started_total = %v, want 1", v)
	}
}
