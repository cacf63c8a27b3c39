package store_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/secret"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

func newStore(t *testing.T) (*store.Store, *clientv3.Client, *atomic.Int64) {
	t.Helper()
	cli := etcdtest.Start(t, false).Client(t)
	var junk atomic.Int64
	s, err := store.New(store.Config{Client: cli, PageSize: 3, OnJunk: func(string, error) { junk.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	return s, cli, &junk
}

func inst(service, id string) *registryv1.Instance {
	return &registryv1.Instance{Service: service, Id: id, Address: "127.0.0.1:8080"}
}

func TestRegisterGetList(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	for i := range 7 {
		if _, err := s.Register(ctx, inst("orders", fmt.Sprintf("o-%d", i)), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := s.Register(ctx, inst("users", "u-1"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got, rev, err := s.Get(ctx, "users", "u-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.LeaseId != reg.LeaseID || got.Weight != 100 || got.Lifecycle != registryv1.Lifecycle_LIFECYCLE_SERVING || rev < reg.Revision {
		t.Fatalf("get = %v at %d, registered %+v", got, rev, reg)
	}
	// The key itself is under the lease (the record's lease_id field is
	// only what the record says): it goes when the lease goes.
	if _, _, lease, _ := rawKey(t, cli, s.Keys().Instance("users", "u-1")); lease != reg.LeaseID {
		t.Fatalf("key's lease = %x, registered under %x", lease, reg.LeaseID)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(reg.LeaseID))
	if err != nil || ttl.TTL <= 0 || ttl.GrantedTTL != 5 {
		t.Fatalf("lease of u-1: %+v, %v; want a live 5s lease", ttl, err)
	}
	all, rev, skipped, err := s.List(ctx, "")
	if err != nil || len(all) != 8 || skipped != 0 || rev != reg.Revision {
		t.Fatalf("list all = %d instances at %d, skipped %d, err %v; want 8 at %d", len(all), rev, skipped, err, reg.Revision)
	}
	orders, _, _, err := s.List(ctx, "orders")
	if err != nil || len(orders) != 7 {
		t.Fatalf("list orders = %d, %v", len(orders), err)
	}
	if _, _, err := s.Get(ctx, "users", "nope"); !errors.Is(err, record.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
}

func TestDuplicateAndOwner(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	claimed := inst("orders", "a")
	claimed.Incarnation = "inc-a" // what an older client sends: kept nowhere
	first, err := s.Register(ctx, claimed, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if secret.Valid(first.Secret) != nil {
		t.Fatalf("Register returned secret %q", first.Secret)
	}
	// Nothing readable grants the take-over: not the incarnation the
	// request carried (it is not even stored), not another secret.
	if got := storedRecord(t, s, "orders", "a"); got.Incarnation != "" {
		t.Fatalf("the record stores incarnation %q", got.Incarnation)
	}
	before := revision(t, cli)
	for name, sec := range map[string]string{"no secret": "", "another secret": secret.New()} {
		_, err := s.RegisterAs(ctx, sec, claimed, 0)
		if !errors.Is(err, record.ErrAlreadyExists) {
			t.Fatalf("register with %s over a live record: %v", name, err)
		}
		if strings.Contains(err.Error(), first.Secret) || strings.Contains(err.Error(), secret.Hash(first.Secret)) {
			t.Fatalf("AlreadyExists carries the secret: %v", err)
		}
	}
	if _, err := s.RegisterAs(ctx, "guessed", inst("orders", "a"), 0); !errors.Is(err, record.ErrInvalid) {
		t.Fatalf("a malformed secret: %v", err)
	}
	if after := revision(t, cli); after != before {
		t.Fatalf("refused registrations moved etcd from revision %d to %d", before, after)
	}
	// The owner's secret takes over and revokes its old lease.
	second, err := s.RegisterAs(ctx, first.Secret, inst("orders", "a"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if second.Secret != first.Secret || !second.Replaced {
		t.Fatalf("take-over by the owner: secret kept %v, replaced %v", second.Secret == first.Secret, second.Replaced)
	}
	if second.LeaseID == first.LeaseID {
		t.Fatal("takeover kept the old lease")
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(first.LeaseID))
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("old lease still alive: ttl %v err %v", ttl, err)
	}
	// Leases granted for refused registrations are not left behind.
	leases, err := cli.Leases(ctx)
	if err != nil || len(leases.Leases) != 1 {
		t.Fatalf("leases = %v, %v; want exactly the live one", leases, err)
	}
}

func TestInvalidWritesNothing(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	bad := inst("Orders", "a")
	_, err := s.Register(ctx, bad, time.Hour)
	var fe *record.FieldError
	if !errors.As(err, &fe) || fe.Field != "service" {
		t.Fatalf("err = %v, want a FieldError on service", err)
	}
	if _, err := s.Register(ctx, inst("orders", "a"), time.Second); !errors.As(err, &fe) || fe.Field != "ttl" {
		t.Fatalf("ttl 1s: %v", err)
	}
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix())
	if err != nil || resp.Count != 0 {
		t.Fatalf("etcd holds %d keys after refused writes (%v)", resp.Count, err)
	}
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Fatalf("refused registration granted leases: %v", leases.Leases)
	}
}

func TestJunkSkipped(t *testing.T) {
	s, cli, junk := newStore(t)
	ctx := context.Background()
	if _, err := s.Register(ctx, inst("orders", "good"), time.Hour); err != nil {
		t.Fatal(err)
	}
	k := s.Keys()
	for key, val := range map[string]string{
		k.Instance("orders", "text"): "not protobuf at all \xff\xff",
		k.Instance("orders", "mism"): mustEncode(t, inst("orders", "other")),
		k.Instances() + "noid":       "x",
		k.Instance("orders", "bad"):  mustEncode(t, &registryv1.Instance{Service: "orders", Id: "bad", Address: "nohostport"}),
	} {
		if _, err := cli.Put(ctx, key, val); err != nil {
			t.Fatal(err)
		}
	}
	all, _, skipped, err := s.List(ctx, "")
	if err != nil || len(all) != 1 || skipped != 4 {
		t.Fatalf("list = %d instances, %d skipped, %v; want 1 and 4", len(all), skipped, err)
	}
	if _, _, err := s.Get(ctx, "orders", "text"); !errors.Is(err, record.ErrNotFound) {
		t.Fatalf("get junk: %v", err)
	}
	if junk.Load() != 5 {
		t.Fatalf("junk reported %d times, want 5", junk.Load())
	}
	// Junk under an id can be registered over.
	if _, err := s.Register(ctx, inst("orders", "text"), time.Hour); err != nil {
		t.Fatalf("register over junk: %v", err)
	}
}

func mustEncode(t *testing.T, in *registryv1.Instance) string {
	b, err := record.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Drain and undrain racing with metadata writers to the same key: every
// write lands because each is a compare-and-swap that retries.
func TestConcurrentUpdatesLoseNothing(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	// A TTL no run outlives, however loaded the machine: this is about
	// compare-and-swap, not lease expiry.
	reg, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 15
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				key := fmt.Sprintf("w%d-%d", w, i)
				if _, _, err := s.Update(ctx, "orders", "a", func(in *registryv1.Instance) error {
					if in.Metadata == nil {
						in.Metadata = map[string]string{}
					}
					if len(in.Metadata) >= record.MaxMetadata {
						clear(in.Metadata)
					}
					in.Metadata["last"] = key
					in.Version = fmt.Sprint(atoi(in.Version) + 1)
					return nil
				}); err != nil {
					t.Error(err)
					return
				}
				lc := registryv1.Lifecycle_LIFECYCLE_DRAINING
				if i%2 == 1 {
					lc = registryv1.Lifecycle_LIFECYCLE_SERVING
				}
				if _, _, err := s.SetLifecycle(ctx, "orders", "a", lc, key); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got, _, err := s.Get(ctx, "orders", "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != fmt.Sprint(writers*each) {
		t.Fatalf("version counter = %s, want %d: an update was lost", got.Version, writers*each)
	}
	if _, _, lease, _ := rawKey(t, cli, s.Keys().Instance("orders", "a")); lease != reg.LeaseID {
		t.Fatalf("after %d updates the key's lease is %x, want the registration's %x", 2*writers*each, lease, reg.LeaseID)
	}
}

// atoi reads the version counter; "" is 0, anything else not a number
// is a bug in the test.
func atoi(s string) int {
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(fmt.Sprintf("version %q is not a counter", s))
	}
	return n
}

func TestDeregisterOnlyOwnLease(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	reg, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// A lease that is not the record's (here: someone's session) is
	// never revoked, whoever names it.
	other, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	for name, dereg := range map[string]func() (bool, int64, error){
		"operator": func() (bool, int64, error) { return s.Deregister(ctx, "orders", "a", int64(other.ID)) },
		"owner":    func() (bool, int64, error) { return s.DeregisterAs(ctx, reg.Secret, "orders", "a", int64(other.ID)) },
	} {
		deleted, _, err := dereg()
		if err != nil || deleted {
			t.Fatalf("%s deregister naming another lease: deleted=%v err=%v", name, deleted, err)
		}
		if ttl, err := cli.TimeToLive(ctx, other.ID); err != nil || ttl.TTL <= 0 {
			t.Fatalf("%s deregister revoked a lease that is not the record's: ttl %v, %v", name, ttl, err)
		}
	}
	before := revision(t, cli)
	if _, _, err := s.DeregisterAs(ctx, secret.New(), "orders", "a", reg.LeaseID); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("deregister with another secret: %v", err)
	}
	if after := revision(t, cli); after != before {
		t.Fatalf("a refused deregister moved etcd from revision %d to %d", before, after)
	}
	deleted, _, err := s.DeregisterAs(ctx, reg.Secret, "orders", "a", reg.LeaseID)
	if err != nil || !deleted {
		t.Fatalf("deregister: deleted=%v err=%v", deleted, err)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(reg.LeaseID))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL != -1 {
		t.Fatalf("lease survives deregister: %d", ttl.TTL)
	}
}

func TestLeaseExpiryRemovesInstance(t *testing.T) {
	s, _, _ := newStore(t)
	ctx := context.Background()
	reg, err := s.Register(ctx, inst("orders", "a"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeepAliveAs(ctx, reg.Secret, "orders", "a", reg.LeaseID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, err := s.Get(ctx, "orders", "a")
		if errors.Is(err, record.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("instance still present 10s after a 2s lease stopped being kept alive")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := s.KeepAliveAs(ctx, reg.Secret, "orders", "a", reg.LeaseID); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("keepalive of an expired lease: %v", err)
	}
}

func TestCompactRevision(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	c, err := s.CompactRevision(ctx)
	if err != nil || c != 0 {
		t.Fatalf("fresh etcd compact revision = %d, %v", c, err)
	}
	var last int64
	for i := range 10 {
		r, err := cli.Put(ctx, fmt.Sprintf("k%d", i), "v")
		if err != nil {
			t.Fatal(err)
		}
		last = r.Header.Revision
	}
	if _, err := cli.Compact(ctx, last-2); err != nil {
		t.Fatal(err)
	}
	c, err = s.CompactRevision(ctx)
	if err != nil || c != last-2 {
		t.Fatalf("compact revision = %d, %v; want %d", c, err, last-2)
	}
}

// KeepAliveAs renews only the lease the owner's record is under: never
// another lease (a foreign one, the prober's election session), never
// for a caller without the secret.
func TestKeepAliveOnlyOwnRegistration(t *testing.T) {
	s, cli, _ := newStore(t)
	ctx := context.Background()
	reg, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	session, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeepAliveAs(ctx, reg.Secret, "orders", "a", int64(session.ID)); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("owner renewing a lease that is not its record's: %v", err)
	}
	if _, err := s.KeepAliveAs(ctx, secret.New(), "orders", "a", reg.LeaseID); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("another secret renewing the record's lease: %v", err)
	}
	if _, err := s.KeepAliveAs(ctx, "", "orders", "nobody", int64(session.ID)); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("renewing a lease under no record: %v", err)
	}
	if ttl, err := s.KeepAliveAs(ctx, reg.Secret, "orders", "a", reg.LeaseID); err != nil || ttl <= 0 {
		t.Fatalf("the owner renewing its own lease: %v, %v", ttl, err)
	}
}

// A lifecycle or health write keeps the owner: the secret still works
// after a drain.
func TestUpdateKeepsOwner(t *testing.T) {
	s, _, _ := newStore(t)
	ctx := context.Background()
	reg, err := s.Register(ctx, inst("orders", "a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SetLifecycle(ctx, "orders", "a", registryv1.Lifecycle_LIFECYCLE_DRAINING, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeepAliveAs(ctx, reg.Secret, "orders", "a", reg.LeaseID); err != nil {
		t.Fatalf("the owner's keepalive after a drain: %v", err)
	}
	if again, err := s.RegisterAs(ctx, reg.Secret, inst("orders", "a"), 0); err != nil || !again.Replaced {
		t.Fatalf("the owner's re-registration after a drain: %v", err)
	}
}

func revision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), "\x00")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}
