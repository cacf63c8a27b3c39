package server_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/server"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The registrations a peer holds are capped: past the cap a Register is
// ResourceExhausted with the limit's reason and a retry hint, writes
// nothing, and is counted; a re-Register of a held record is not a new
// one; another peer has its own count; and every way a registration ends
// gives its slot back: a Deregister, a KeepAlive told the lease is lost
// (both at once), a lease revoked behind the regnode's back (within the
// sweep of the view).
func TestRegistrationsHeldCapped(t *testing.T) {
	const capN = 3
	m := etcdtest.Start(t, false)
	limits := peerlimit.DefaultConfig()
	limits.MaxRegistrations = capN
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Limits: limits}, m.ClientURL)
	api := dialFrom(t, rn.Addr, "127.0.0.1")
	ctx := context.Background()
	register := func(c registryv1.RegistryClient, id, secret string) (*registryv1.RegisterResponse, error) {
		return c.Register(ctx, &registryv1.RegisterRequest{Instance: inst("capped", id), Secret: secret, Ttl: durationpb.New(time.Minute)})
	}
	// Refused Registers hold nothing.
	for i := range capN {
		bad := inst("capped", "bad-"+strconv.Itoa(i))
		bad.Address = "no-port"
		if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: bad}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("an invalid Register: %v", err)
		}
	}
	regs := map[string]*registryv1.RegisterResponse{}
	for i := range capN {
		id := "r-" + strconv.Itoa(i)
		resp, err := register(api, id, "")
		if err != nil {
			t.Fatalf("registration %d within the cap: %v", i, err)
		}
		regs[id] = resp
	}
	overCap := func(what string) {
		t.Helper()
		rev := headRev(t, rn.Etcd)
		_, err := register(api, "over", "")
		refused(t, rn, what, err, codes.ResourceExhausted, peerlimit.Registrations, rev)
		if server.Reason(err) != server.LimitReason(peerlimit.Registrations) || !hasRetryInfo(status.Convert(err)) {
			t.Fatalf("%s: %v, want reason %s and a retry hint", what, status.Convert(err).Details(), server.LimitReason(peerlimit.Registrations))
		}
	}
	overCap("a Register past the cap")
	if n := testutil.ToFloat64(rn.Node.Metrics().Limited.WithLabelValues(peerlimit.Registrations)); n != 1 {
		t.Fatalf("registry_limited_total{limit=registrations} = %v, want 1", n)
	}
	// Its owner registering a held record again replaces it: allowed at
	// the cap, and still one registration.
	again, err := register(api, "r-0", regs["r-0"].Secret)
	if err != nil {
		t.Fatalf("re-Register of a held record at the cap: %v", err)
	}
	regs["r-0"] = again
	overCap("a Register past the cap after a re-Register")
	if _, err := register(dialFrom(t, rn.Addr, "127.0.0.2"), "other", ""); err != nil {
		t.Fatalf("another peer, while the first holds its cap: %v", err)
	}

	// A Deregister frees its slot at once.
	if _, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "capped", Id: "r-1", Secret: regs["r-1"].Secret}); err != nil {
		t.Fatal(err)
	}
	// (Another id: the same one would be a re-Register of a held record,
	// allowed anyway.)
	if regs["d-1"], err = register(api, "d-1", ""); err != nil {
		t.Fatalf("Register after a Deregister freed a slot: %v", err)
	}
	overCap("a Register past the cap after the freed slot was taken")

	// A KeepAlive told the lease is lost frees its slot at once.
	if _, err := rn.Etcd.Revoke(ctx, clientv3.LeaseID(regs["r-2"].LeaseId)); err != nil {
		t.Fatal(err)
	}
	ka, err := api.KeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Send(&registryv1.KeepAliveRequest{LeaseId: regs["r-2"].LeaseId, Service: "capped", Id: "r-2", Secret: regs["r-2"].Secret}); err != nil {
		t.Fatal(err)
	}
	if resp, err := ka.Recv(); err != nil || !resp.Lost {
		t.Fatalf("KeepAlive of a revoked lease: %v, %v; want lost", resp, err)
	}
	if err := ka.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err = register(api, "l-2", ""); err != nil {
		t.Fatalf("Register after a lost lease freed a slot: %v", err)
	}
	overCap("a Register past the cap after the lost lease's slot was taken")

	// A lease revoked behind the regnode's back, with no call through it
	// to say so: the slot comes back once its view has seen the delete.
	if _, err := rn.Etcd.Revoke(ctx, clientv3.LeaseID(regs["d-1"].LeaseId)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the revoked registration's slot", func() bool {
		_, err := register(api, "after-revoke", "")
		if err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("Register after a revoke: %v", err)
		}
		return err == nil
	})
	overCap("a Register past the cap after the revoked lease's slot was taken")
}

// A flood from one peer does not starve another: while the flooding peer
// is over its write limit and refused, every Register of another peer in
// the same window succeeds.
func TestFloodDoesNotStarveAnotherPeer(t *testing.T) {
	const burst, victimN, floodMax = 50, 40, 5000
	m := etcdtest.Start(t, false)
	limits := peerlimit.DefaultConfig()
	limits.WriteRate, limits.WriteBurst = 1, burst
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Limits: limits}, m.ClientURL)
	attacker := dialFrom(t, rn.Addr, "127.0.0.2")
	victim := dialFrom(t, rn.Addr, "127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var (
		accepted, limited, inWindow, other atomic.Int64
		window                             atomic.Bool // the victim is registering
		stop                               = make(chan struct{})
		firstLimited                       = make(chan struct{})
		once                               sync.Once
		next                               atomic.Int64
		wg                                 sync.WaitGroup
		otherErr                           atomic.Value
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := next.Add(1)
				if i > floodMax {
					return
				}
				_, err := attacker.Register(ctx, &registryv1.RegisterRequest{Instance: inst("flood", "a-"+strconv.FormatInt(i, 10))})
				switch status.Code(err) {
				case codes.OK:
					accepted.Add(1)
				case codes.ResourceExhausted:
					limited.Add(1)
					if window.Load() {
						inWindow.Add(1)
					}
					once.Do(func() { close(firstLimited) })
				default:
					other.Add(1)
					otherErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	select {
	case <-firstLimited:
	case <-ctx.Done():
		t.Fatal("the flood was never limited")
	}
	window.Store(true)
	refusedBefore := limited.Load()
	victimOK := 0
	for i := range victimN {
		if _, err := victim.Register(ctx, &registryv1.RegisterRequest{Instance: inst("victim", "v-"+strconv.Itoa(i))}); err != nil {
			t.Errorf("victim's Register %d during the flood: %v", i, err)
		} else {
			victimOK++
		}
	}
	window.Store(false)
	// Let the flood go on until it has been refused during the window
	// (the window could close before a flooder's next call returns).
	for inWindow.Load() == 0 && next.Load() < floodMax && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if e, ok := otherErr.Load().(error); ok {
		t.Fatalf("%d attacker calls failed otherwise, first: %v", other.Load(), e)
	}
	if victimOK != victimN {
		t.Fatalf("victim: %d of %d Registers succeeded during the flood", victimOK, victimN)
	}
	if accepted.Load() < burst || refusedBefore == 0 || inWindow.Load() == 0 {
		t.Fatalf("attacker: %d accepted, %d limited (%d before the victim's window, %d in it), want its burst accepted and refusals before and during the window",
			accepted.Load(), limited.Load(), refusedBefore, inWindow.Load())
	}
	t.Logf("attacker: %d accepted, %d limited; victim: %d of %d accepted", accepted.Load(), limited.Load(), victimOK, victimN)
}
