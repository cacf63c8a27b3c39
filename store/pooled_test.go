package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/leasepool"
	"github.com/regcluster/registry/internal/txnbatch"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// pooled is a Store on the registration path regnode runs: leases from a
// pool, writes group-committed, renewals on one stream.
type pooled struct {
	s     *store.Store
	cli   *clientv3.Client
	pool  *leasepool.Pool
	batch *txnbatch.Batcher
}

func newPooled(t *testing.T, pc leasepool.Config, bc txnbatch.Config) pooled {
	t.Helper()
	cli := etcdtest.Start(t, false).Client(t)
	ren := leasepool.NewRenewer(cli, nil)
	t.Cleanup(ren.Close)
	pc.Client, pc.Renewer = cli, ren
	pool, err := leasepool.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close(context.Background()) })
	bc.Client = cli
	b, err := txnbatch.New(bc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	s, err := store.New(store.Config{Client: cli, Leases: pool, Commit: b, Renew: ren})
	if err != nil {
		t.Fatal(err)
	}
	return pooled{s: s, cli: cli, pool: pool, batch: b}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One registration of a batch conflicts (its id is alive under another
// owner): it alone is refused, the others of the same etcd Txn land.
func TestBatchWithConflictingMember(t *testing.T) {
	const n = 8
	// The batch commits when full: all n are in one Txn.
	p := newPooled(t, leasepool.DefaultConfig(), txnbatch.Config{MaxOps: n, InFlight: 1, Linger: time.Minute})
	ctx := context.Background()
	// Registered by another owner through another store (another
	// regnode): a lone call would wait out the batch's Linger here.
	other, err := store.New(store.Config{Client: p.cli})
	if err != nil {
		t.Fatal(err)
	}
	taken, err := other.Register(ctx, inst("orders", "taken"), 0)
	if err != nil {
		t.Fatal(err)
	}
	before := p.batch.Stats()
	ids := make([]string, n)
	regs := make([]*store.Registration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = fmt.Sprint("o-", i)
		if i == 3 {
			ids[i] = "taken"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			regs[i], errs[i] = p.s.Register(ctx, inst("orders", ids[i]), 0)
		}()
	}
	wg.Wait()
	after := p.batch.Stats()
	if txns, members := after.Txns-before.Txns, after.Members-before.Members; txns != 1 || members != n {
		t.Fatalf("%d registrations went out in %d etcd Txns carrying %d members, want one batch", n, txns, members)
	}
	rev := int64(0)
	for i := range n {
		if ids[i] == "taken" {
			if !errors.Is(errs[i], record.ErrAlreadyExists) {
				t.Fatalf("the conflicting member: %v, want AlreadyExists", errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("member %s failed with the conflicting one: %v", ids[i], errs[i])
		}
		if rev == 0 {
			rev = regs[i].Revision
		}
		if regs[i].Revision != rev {
			t.Fatalf("member %s landed at revision %d, another at %d: not one Txn", ids[i], regs[i].Revision, rev)
		}
		got := storedRecord(t, p.s, "orders", ids[i])
		if got.LeaseId != regs[i].LeaseID || got.ModRevision != rev {
			t.Fatalf("record %s = lease %x at %d, registered under %x at %d", ids[i], got.LeaseId, got.ModRevision, regs[i].LeaseID, rev)
		}
	}
	// Every instance has a lease of its own.
	seen := map[int64]bool{taken.LeaseID: true}
	for i, r := range regs {
		if r == nil {
			continue
		}
		if seen[r.LeaseID] {
			t.Fatalf("member %s shares lease %x", ids[i], r.LeaseID)
		}
		seen[r.LeaseID] = true
	}
	if got := storedRecord(t, p.s, "orders", "taken"); got.LeaseId != taken.LeaseID {
		t.Fatalf("the live record moved to lease %x from %x", got.LeaseId, taken.LeaseID)
	}
}

// A lease that waited in the pool is refreshed when handed over, and the
// record under it lives exactly as long as that lease: renewed inside its
// TTL it stays, not renewed it goes when the lease expires, not before.
func TestPooledLeaseExpiresAfterLastRenewal(t *testing.T) {
	const ttl = 6 * time.Second
	// Idle leases are not renewed by the pool (the tick never comes), so
	// the one waiting ages until it is taken.
	pc := leasepool.DefaultConfig()
	pc.Size, pc.Tick = 1, time.Hour
	p := newPooled(t, pc, txnbatch.DefaultConfig())
	ctx := context.Background()
	first, err := p.s.Register(ctx, inst("orders", "a"), ttl) // makes the pool of 6s leases
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a lease in the pool", func() bool { return p.pool.Idle(ttl) == 1 })
	ls, err := p.cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var waiting clientv3.LeaseID
	for _, l := range ls.Leases {
		if int64(l.ID) != first.LeaseID {
			waiting = l.ID
		}
	}
	remaining := func(id int64) int64 {
		t.Helper()
		r, err := p.cli.TimeToLive(ctx, clientv3.LeaseID(id))
		if err != nil {
			t.Fatal(err)
		}
		if r.TTL > 0 && r.GrantedTTL != int64(ttl/time.Second) {
			t.Fatalf("lease %x granted for %ds, registered for %s", id, r.GrantedTTL, ttl)
		}
		return r.TTL
	}
	var aged int64
	waitUntil(t, "the pooled lease to age", func() bool { aged = remaining(int64(waiting)); return aged <= 4 })
	reg, err := p.s.Register(ctx, inst("orders", "b"), ttl)
	if err != nil {
		t.Fatal(err)
	}
	if reg.LeaseID != int64(waiting) {
		t.Fatalf("registered under lease %x, not the pooled %x", reg.LeaseID, int64(waiting))
	}
	handed := remaining(reg.LeaseID)
	if handed <= aged {
		t.Fatalf("the pooled lease had %ds left and %ds once handed over: not refreshed at handover", aged, handed)
	}
	// Renewed inside its TTL (after it aged), the record outlives the
	// expiry the handover set.
	waitUntil(t, "the handed-over lease to age", func() bool { aged = remaining(reg.LeaseID); return aged <= 4 })
	streams := etcdtest.KeepAliveStreams(t)
	for range 3 {
		got, err := p.s.KeepAliveAs(ctx, reg.Secret, "orders", "b", reg.LeaseID)
		if err != nil || got != ttl {
			t.Fatalf("renewal = %s, %v; want %s", got, err, ttl)
		}
	}
	// The handover's renewal opened the shared stream; these rode it.
	if k := etcdtest.KeepAliveStreams(t) - streams; k != 0 {
		t.Fatalf("3 renewals opened %v LeaseKeepAlive streams, want none (the shared one)", k)
	}
	if r := remaining(reg.LeaseID); r <= aged {
		t.Fatalf("renewed with %ds left, %ds after", aged, r)
	}
	// Not renewed again: present for as long as etcd has the lease, gone
	// once etcd dropped it.
	for {
		r := remaining(reg.LeaseID)
		resp, err := p.cli.Get(ctx, p.s.Keys().Instance("orders", "b"))
		if err != nil {
			t.Fatal(err)
		}
		if r == -1 { // the lease is gone; its keys went in the same apply
			if resp.Count != 0 {
				t.Fatalf("the lease expired and the record is still there")
			}
			break
		}
		// The TTL read first: the record was alive then; a read after it
		// may see it gone only if the lease went meanwhile.
		if resp.Count == 0 {
			if r2 := remaining(reg.LeaseID); r2 != -1 {
				t.Fatalf("the record is gone while its lease has %ds left", r2)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// An etcd restart brings every instance back at once: the re-registrations
// (same secrets, leases lost) take pooled leases and share Txns, so they
// cost etcd fewer write proposals than there are instances. Counted on
// etcd's side: its raft index, less the leases it granted meanwhile.
func TestReRegistrationStormBatched(t *testing.T) {
	const n = 48
	pc := leasepool.DefaultConfig()
	pc.Size = 64
	p := newPooled(t, pc, txnbatch.DefaultConfig())
	ctx := context.Background()
	regs := make([]*store.Registration, n)
	for i := range n {
		r, err := p.s.Register(ctx, inst("orders", fmt.Sprint("o-", i)), 0)
		if err != nil {
			t.Fatal(err)
		}
		regs[i] = r
	}
	// The leases are lost (a restore, a long partition): the records go,
	// their saved states stay.
	for _, r := range regs {
		if _, err := p.cli.Revoke(ctx, clientv3.LeaseID(r.LeaseID)); err != nil {
			t.Fatal(err)
		}
	}
	quiet := func() (raft uint64, leases map[clientv3.LeaseID]bool) {
		t.Helper()
		waitUntil(t, "a full pool", func() bool { return p.pool.Idle(record.DefaultTTL) == pc.Size })
		st, err := p.cli.Status(ctx, p.cli.Endpoints()[0])
		if err != nil {
			t.Fatal(err)
		}
		ls, err := p.cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases = map[clientv3.LeaseID]bool{}
		for _, l := range ls.Leases {
			leases[l.ID] = true
		}
		return st.RaftIndex, leases
	}
	raft0, leases0 := quiet()
	hits0 := p.pool.Stats().Hits
	var wg sync.WaitGroup
	errs := make([]error, n)
	back := make([]*store.Registration, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			back[i], errs[i] = p.s.RegisterAs(ctx, regs[i].Secret, inst("orders", fmt.Sprint("o-", i)), 0)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || !back[i].Replaced {
			t.Fatalf("re-registration %d: %v (replaced %v)", i, errs[i], back[i] != nil && back[i].Replaced)
		}
	}
	raft1, leases1 := quiet()
	granted := 0
	for id := range leases1 {
		if !leases0[id] {
			granted++
		}
	}
	writes := int(raft1-raft0) - granted
	t.Logf("%d re-registrations: %d raft entries, %d of them lease grants (the pool refilling), %d writes; %d pool hits",
		n, raft1-raft0, granted, writes, p.pool.Stats().Hits-hits0)
	if writes >= n {
		t.Fatalf("%d re-registrations cost etcd %d write proposals (grants aside): not batched", n, writes)
	}
	if hits := p.pool.Stats().Hits - hits0; hits != n {
		t.Fatalf("%d of %d re-registrations took a pooled lease", hits, n)
	}
}
