package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

func newClient(t testing.TB, addrs ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close client: %v", err)
		}
	})
	return c
}

func inst(service, id string) *registryv1.Instance {
	return &registryv1.Instance{Service: service, Id: id, Address: "10.0.0.1:8080", Zone: "z1",
		Metadata: map[string]string{"team": "core"}}
}

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The same scenario on a regnode that embeds etcd and on one that uses an
// etcd started separately.
func TestRegisterListGet(t *testing.T) {
	for _, mode := range []string{"embedded", "external"} {
		t.Run(mode, func(t *testing.T) {
			var rn *regnodetest.Regnode
			if mode == "embedded" {
				rn = regnodetest.Start(t)
			} else {
				m := etcdtest.Start(t, false)
				rn = regnodetest.StartExternal(t, m.ClientURL)
				if rn.Node.Embedded() != nil {
					t.Fatal("external regnode embeds etcd")
				}
			}
			api := newClient(t, rn.Addr).API()
			ctx := context.Background()
			reg, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(20 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			if reg.LeaseId == 0 || reg.TtlSeconds != 20 || reg.Revision == 0 {
				t.Fatalf("register response = %v", reg)
			}
			// etcd holds it under the lease.
			kv, err := rn.Etcd.Get(ctx, rn.Prefix+"instances/orders/o-1")
			if err != nil || len(kv.Kvs) != 1 || kv.Kvs[0].Lease != reg.LeaseId {
				t.Fatalf("etcd = %v, %v", kv, err)
			}
			if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-2")}); err != nil {
				t.Fatal(err)
			}
			if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("users", "u-1")}); err != nil {
				t.Fatal(err)
			}
			got, err := api.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
			if err != nil {
				t.Fatal(err)
			}
			g := got.Instance
			if g.Address != "10.0.0.1:8080" || g.Weight != 100 || g.Zone != "z1" || g.Metadata["team"] != "core" ||
				g.Lifecycle != registryv1.Lifecycle_LIFECYCLE_SERVING || g.LeaseId != reg.LeaseId || g.RegisteredAt == nil ||
				g.ModRevision != reg.Revision || got.Revision < reg.Revision {
				t.Fatalf("get = %v at %d", g, got.Revision)
			}
			list, err := api.List(ctx, &registryv1.ListRequest{Service: "orders"})
			if err != nil || len(list.Instances) != 2 || list.Instances[0].Id != "o-1" || list.Instances[1].Id != "o-2" {
				t.Fatalf("list orders = %v, %v", list, err)
			}
			all, err := api.List(ctx, &registryv1.ListRequest{})
			if err != nil || len(all.Instances) != 3 {
				t.Fatalf("list all = %v, %v", all, err)
			}
			head, err := rn.Etcd.Get(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			if all.Revision != head.Header.Revision {
				t.Fatalf("list revision %d, etcd is at %d", all.Revision, head.Header.Revision)
			}
			if _, err := api.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "nope"}); status.Code(err) != codes.NotFound {
				t.Fatalf("get missing: %v", err)
			}
			// A second owner of the same id is refused, whatever
			// incarnation it claims.
			dup := inst("orders", "o-1")
			dup.Incarnation = "another"
			if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: dup}); status.Code(err) != codes.AlreadyExists {
				t.Fatalf("duplicate: %v", err)
			}
			st, err := api.Status(ctx, &registryv1.StatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Members) != 1 || !st.Members[0].IsLeader || st.Counts.Total != 3 || st.Counts.Services != 2 ||
				st.Counts.Serving != 3 || st.Counts.Unknown != 3 || st.Revision < all.Revision || st.ClusterId == 0 ||
				st.Embedded != (mode == "embedded") || st.EtcdVersion == "" {
				t.Fatalf("status = %v", st)
			}
			dr, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1"})
			if err != nil || !dr.Deleted {
				t.Fatalf("deregister = %v, %v", dr, err)
			}
			if _, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1"}); status.Code(err) != codes.NotFound {
				t.Fatalf("deregister twice: %v", err)
			}
			ttl, err := rn.Etcd.TimeToLive(ctx, clientv3.LeaseID(reg.LeaseId))
			if err != nil {
				t.Fatal(err)
			}
			if ttl.TTL != -1 {
				t.Fatal("deregister left the lease alive")
			}
		})
	}
}

func TestLeaseExpiryRemovesInstance(t *testing.T) {
	rn := regnodetest.Start(t)
	api := newClient(t, rn.Addr).API()
	ctx := context.Background()
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the instance to expire", func() bool {
		_, err := api.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
		return status.Code(err) == codes.NotFound
	})
}

func TestKeepAliveStream(t *testing.T) {
	rn := regnodetest.Start(t)
	api := newClient(t, rn.Addr).API()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := api.KeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		lease int64
		lost  bool
	}{{reg.LeaseId, false}, {reg.LeaseId + 12345, true}, {reg.LeaseId, false}} {
		if err := ka.Send(&registryv1.KeepAliveRequest{LeaseId: tc.lease, Service: "orders", Id: "o-1", Secret: reg.Secret}); err != nil {
			t.Fatal(err)
		}
		resp, err := ka.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Lost != tc.lost || resp.LeaseId != tc.lease || (tc.lost == (resp.TtlSeconds > 0)) {
			t.Fatalf("keepalive %x = %v, want lost=%v", tc.lease, resp, tc.lost)
		}
	}
	if err := ka.Send(&registryv1.KeepAliveRequest{LeaseId: -1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ka.Recv(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "lease_id") {
		t.Fatalf("keepalive of lease -1: %v", err)
	}
}

// Every validation rule of docs/architecture.md: InvalidArgument naming the field, and
// etcd holds no key and no lease afterwards.
func TestInvalidInputRefused(t *testing.T) {
	rn := regnodetest.Start(t)
	api := newClient(t, rn.Addr).API()
	ctx := context.Background()
	// The regnode's own prober election writes a key under a lease: wait
	// for it, then take etcd's revision and leases as the baseline.
	waitFor(t, time.Minute, "the prober election", func() bool {
		st, err := api.Status(ctx, &registryv1.StatusRequest{})
		return err == nil && st.Leader != ""
	})
	before, err := rn.Etcd.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	leasesBefore, err := rn.Etcd.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bigMeta := map[string]string{}
	for i := range 65 {
		bigMeta[fmt.Sprint("k", i)] = "v"
	}
	huge := map[string]string{}
	for i := range 20 {
		huge[fmt.Sprint("k", i)] = strings.Repeat("x", 1000)
	}
	mod := func(f func(*registryv1.Instance)) *registryv1.Instance { in := inst("orders", "o-1"); f(in); return in }
	cases := []struct {
		name  string
		req   *registryv1.RegisterRequest
		field string
	}{
		{"no instance", &registryv1.RegisterRequest{}, "instance"},
		{"empty service", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Service = "" })}, "service"},
		{"uppercase service", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Service = "Orders" })}, "service"},
		{"service with underscore", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Service = "my_svc" })}, "service"},
		{"service with slash", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Service = "a/b" })}, "service"},
		{"service of 64", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Service = strings.Repeat("a", 64) })}, "service"},
		{"service starting with -", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Service = "-a" })}, "service"},
		{"empty id", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Id = "" })}, "id"},
		{"id with slash", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Id = "a/b" })}, "id"},
		{"id with space", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Id = "a b" })}, "id"},
		{"id of 129", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Id = strings.Repeat("a", 129) })}, "id"},
		{"no address", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Address = "" })}, "address"},
		{"address without port", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Address = "10.0.0.1" })}, "address"},
		{"port 0", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Address = "10.0.0.1:0" })}, "address"},
		{"port 65536", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Address = "10.0.0.1:65536" })}, "address"},
		{"no host", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Address = ":80" })}, "address"},
		{"weight 1001", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Weight = 1001 })}, "weight"},
		{"65 metadata", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Metadata = bigMeta })}, "metadata"},
		{"metadata key of 64", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Metadata = map[string]string{strings.Repeat("k", 64): "v"} })}, "metadata"},
		{"metadata value over 1KiB", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": strings.Repeat("v", 1025)} })}, "metadata"},
		{"record over 16KiB", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Metadata = huge })}, "instance"},
		{"ttl 1s", &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(time.Second)}, "ttl"},
		{"ttl 0", &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(0)}, "ttl"},
		{"ttl 2h", &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(2 * time.Hour)}, "ttl"},
		{"ttl 2.5s", &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(2500 * time.Millisecond)}, "ttl"},
		{"http check without path", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) {
			i.Check = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_HTTP}
		})}, "check.target"},
		{"check interval 10ms", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) {
			i.Check = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP, Interval: durationpb.New(10 * time.Millisecond)}
		})}, "check.interval"},
		{"unknown lifecycle", &registryv1.RegisterRequest{Instance: mod(func(i *registryv1.Instance) { i.Lifecycle = 42 })}, "lifecycle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := api.Register(ctx, tc.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("code = %v (%v), want InvalidArgument", status.Code(err), err)
			}
			if msg := status.Convert(err).Message(); !strings.HasPrefix(msg, "invalid "+tc.field+":") {
				t.Fatalf("message %q does not name the field %q", msg, tc.field)
			}
		})
	}
	// Drain/get/deregister with bad names are refused too.
	for _, err := range []error{
		func() error { _, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "BAD", Id: "x"}); return err }(),
		func() error {
			_, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "x", Reason: strings.Repeat("r", 2000)})
			return err
		}(),
		func() error { _, err := api.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "a/b"}); return err }(),
		func() error {
			_, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "", Id: "x"})
			return err
		}(),
		func() error { _, err := api.List(ctx, &registryv1.ListRequest{Service: "no such!"}); return err }(),
	} {
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("got %v, want InvalidArgument", err)
		}
	}
	after, err := rn.Etcd.Get(ctx, "x")
	if err != nil || after.Header.Revision != before.Header.Revision {
		t.Fatalf("etcd moved from revision %d to %d on refused input (%v)", before.Header.Revision, after.Header.Revision, err)
	}
	leases, err := rn.Etcd.Leases(ctx)
	if err != nil || len(leases.Leases) != len(leasesBefore.Leases) {
		t.Fatalf("refused input granted leases: %v, before %v (%v)", leases.Leases, leasesBefore.Leases, err)
	}
	if got := testutil.ToFloat64(rn.Node.Metrics().RegistrationErrors.WithLabelValues("InvalidArgument")); got != float64(len(cases)) {
		t.Fatalf("registration errors counted %v, want %d", got, len(cases))
	}
}

// Drains and undrains through the API race with another writer of the same
// key (standing in for the prober); every acknowledged write landed.
func TestDrainRacesLoseNothing(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	api := c.API()
	ctx := context.Background()
	reg, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	key := rn.Prefix + "instances/orders/o-1"
	keys := record.NewKeys(rn.Prefix)
	const drainers, each, bumps = 4, 10, 40
	type ack struct {
		rev    int64
		lc     registryv1.Lifecycle
		reason string
	}
	var (
		mu       sync.Mutex
		acks     []ack
		timedOut atomic.Int64
		wg       sync.WaitGroup
	)
	// A call past the server's call timeout (a loaded machine, five
	// writers on one key) was not acknowledged: it may or may not have
	// landed, so it is not checked, only counted.
	unacked := func(err error) bool {
		if status.Code(err) == codes.DeadlineExceeded {
			timedOut.Add(1)
			return true
		}
		return false
	}
	for d := range drainers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				reason := fmt.Sprintf("d%d-%d", d, i)
				var rev int64
				lc := registryv1.Lifecycle_LIFECYCLE_DRAINING
				if i%2 == 0 {
					r, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "o-1", Reason: reason})
					if unacked(err) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					rev = r.Revision
				} else {
					r, err := api.Undrain(ctx, &registryv1.UndrainRequest{Service: "orders", Id: "o-1"})
					if unacked(err) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					rev, lc, reason = r.Revision, registryv1.Lifecycle_LIFECYCLE_SERVING, ""
				}
				mu.Lock()
				acks = append(acks, ack{rev, lc, reason})
				mu.Unlock()
			}
		}()
	}
	// The other writer: raw compare-and-swap on etcd bumping a counter in
	// the version field, as the prober will write health.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; n <= bumps; {
			resp, err := rn.Etcd.Get(ctx, key)
			if err != nil {
				t.Error(err)
				return
			}
			kv := resp.Kvs[0]
			in, err := keys.Decode(key, kv.Value, kv.CreateRevision, kv.ModRevision)
			if err != nil {
				t.Error(err)
				return
			}
			in.Version = fmt.Sprint(n)
			val, err := record.Encode(in)
			if err != nil {
				t.Error(err)
				return
			}
			tx, err := rn.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
				Then(clientv3.OpPut(key, string(val), clientv3.WithIgnoreLease())).Commit()
			if err != nil {
				t.Error(err)
				return
			}
			if tx.Succeeded {
				n++
			}
		}
	}()
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(acks) < drainers {
		t.Fatalf("%d of %d drains and undrains acknowledged (%d timed out): too few to check", len(acks), drainers*each, timedOut.Load())
	}
	t.Logf("%d acknowledged, %d timed out", len(acks), timedOut.Load())
	// Every acknowledged drain/undrain is what etcd holds at its revision,
	// with the counter never going down across revisions.
	for _, a := range acks {
		resp, err := rn.Etcd.Get(ctx, key, clientv3.WithRev(a.rev))
		if err != nil {
			t.Fatal(err)
		}
		in, err := keys.Decode(key, resp.Kvs[0].Value, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Kvs[0].ModRevision != a.rev || in.Lifecycle != a.lc || in.LifecycleReason != a.reason {
			t.Fatalf("at revision %d etcd holds %v %q (mod %d), the ack said %v %q", a.rev, in.Lifecycle, in.LifecycleReason, resp.Kvs[0].ModRevision, a.lc, a.reason)
		}
	}
	final, err := api.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	if final.Instance.Version != fmt.Sprint(bumps) {
		t.Fatalf("counter = %s, want %d: a concurrent write was lost", final.Instance.Version, bumps)
	}
	if n := int64(len(acks)) + timedOut.Load(); n != drainers*each {
		t.Fatalf("%d acks and %d timeouts, want %d calls answered", len(acks), timedOut.Load(), drainers*each)
	}
	// The key itself must still be attached to its lease (the record's
	// lease_id field is only what was written into the value).
	kv, err := rn.Etcd.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(kv.Kvs) != 1 || kv.Kvs[0].Lease != reg.LeaseId {
		t.Fatalf("etcd holds %v, want the key under lease %x: a lifecycle write dropped it", kv.Kvs, reg.LeaseId)
	}
}

// Junk under the prefix is skipped by List and Get, counted, and crashes
// nothing.
func TestJunkSkippedAndCounted(t *testing.T) {
	rn := regnodetest.Start(t)
	api := newClient(t, rn.Addr).API()
	ctx := context.Background()
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "good")}); err != nil {
		t.Fatal(err)
	}
	bad, err := record.Encode(&registryv1.Instance{Service: "orders", Id: "bad", Address: "x", Weight: 99999})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"instances/orders/junk":   "{\"json\": true}",
		"instances/orders/bad":    string(bad),
		"instances/orders/a/b/c":  "x",
		"instances/orders/empty":  "",
		"instances/Not_A_Service": "x",
	} {
		if _, err := rn.Etcd.Put(ctx, rn.Prefix+k, v); err != nil {
			t.Fatal(err)
		}
	}
	list, err := api.List(ctx, &registryv1.ListRequest{})
	if err != nil || len(list.Instances) != 1 || list.Skipped != 5 {
		t.Fatalf("list = %d instances, %d skipped, %v", len(list.Instances), list.Skipped, err)
	}
	if _, err := api.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "junk"}); status.Code(err) != codes.NotFound {
		t.Fatalf("get junk: %v", err)
	}
	if _, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "bad"}); status.Code(err) != codes.NotFound {
		t.Fatalf("drain junk: %v", err)
	}
	st, err := api.Status(ctx, &registryv1.StatusRequest{})
	if err != nil || st.JunkSkipped != 5 || st.Counts.Total != 1 {
		t.Fatalf("status = %v, %v", st, err)
	}
	if got := testutil.ToFloat64(rn.Node.Metrics().JunkSkipped); got < 7 {
		t.Fatalf("junk counter = %v, want at least 7", got)
	}
}

// The SDK's registration: a lease revoked behind its back comes back by
// itself, under a new lease, through regnode.
func TestSDKRegistrationComesBack(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	ctx := context.Background()
	reg, err := c.Register(ctx, inst("orders", "o-1"), client.RegisterOptions{TTL: 3 * time.Second, DrainGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	first := reg.Status().LeaseID
	if _, err := rn.Etcd.Revoke(ctx, clientv3.LeaseID(first)); err != nil {
		t.Fatal(err)
	}
	// Both ends: the regnode serves it under a new lease, and the
	// registration has recorded that (the key lands in etcd a moment
	// before the registration's status says so).
	waitFor(t, time.Minute, "re-registration", func() bool {
		g, err := c.API().Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
		return err == nil && g.Instance.LeaseId != first && reg.Status().Registrations == 2
	})
	if !reg.Status().Registered || reg.Status().Registrations != 2 {
		t.Fatalf("status = %+v", reg.Status())
	}
	if err := reg.Drain(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	g, err := c.API().Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	if g.Instance.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING {
		t.Fatalf("after Drain: %v", g.Instance.Lifecycle)
	}
	if err := reg.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.API().Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("after Close: %v", err)
	}
	// Invalid input through the SDK fails at once with the sentinel.
	bad := inst("orders", "o-2")
	bad.Weight = 2000
	if _, err := c.Register(ctx, bad, client.RegisterOptions{}); !errors.Is(err, record.ErrInvalid) || !strings.Contains(err.Error(), "weight") {
		t.Fatalf("bad weight through the SDK: %v", err)
	}
}

// The registration survives the loss of the regnode it talks to: two
// regnodes share one etcd; closing the one that carries its renewals
// leaves the lease renewed through the other. Counted, not timed: the
// other serves renewals of the same lease, and the registration never
// reports a loss.
func TestSDKRegistrationSurvivesRegnodeLoss(t *testing.T) {
	const renewals = 3
	m := etcdtest.Start(t, false)
	a := regnodetest.StartExternal(t, m.ClientURL)
	b := regnodetest.StartExternal(t, m.ClientURL)
	c := newClient(t, a.Addr, b.Addr)
	ctx := context.Background()
	var losses atomic.Int64
	reg, err := c.Register(ctx, inst("orders", "o-1"), client.RegisterOptions{TTL: 4 * time.Second, DrainGrace: 50 * time.Millisecond,
		OnChange: func(st client.RegistrationStatus) {
			if !st.Registered {
				losses.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := reg.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	leaseID := reg.Status().LeaseID
	served := func(rn *regnodetest.Regnode) float64 { return testutil.ToFloat64(rn.Node.Metrics().KeepAlives) }
	waitFor(t, time.Minute, "a first renewal", func() bool { return served(a)+served(b) >= 1 })
	carrier, other := a, b
	if served(a) == 0 {
		carrier, other = b, a
	}
	if err := carrier.Node.Close(); err != nil {
		t.Fatal(err)
	}
	since := served(other)
	waitFor(t, time.Minute, fmt.Sprint(renewals, " renewals through the remaining regnode"), func() bool {
		return served(other) >= since+renewals
	})
	st := reg.Status()
	if !st.Registered || st.LeaseID != leaseID || st.Registrations != 1 {
		t.Fatalf("after losing a regnode: %+v, want the same lease %x still registered", st, leaseID)
	}
	if n := losses.Load(); n != 0 {
		t.Fatalf("registration was lost %d times", n)
	}
	ttl, err := other.Etcd.TimeToLive(ctx, clientv3.LeaseID(leaseID))
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("lease TTL %v, %v", ttl, err)
	}
}
