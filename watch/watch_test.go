package watch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc/connectivity"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/watch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

var keys = record.NewKeys("")

func put(t testing.TB, cli *clientv3.Client, service, id, version string) int64 {
	t.Helper()
	b, err := record.Encode(&registryv1.Instance{Service: service, Id: id, Address: "10.0.0.1:80", Version: version, Weight: 100})
	if err != nil {
		t.Fatal(err)
	}
	r, err := cli.Put(context.Background(), keys.Instance(service, id), string(b))
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// proxied returns a proxy to etcd at url, which the test can cut, and a
// client of etcd through it; the test ends both.
func proxied(t *testing.T, url string) (*etcdtest.Proxy, *clientv3.Client) {
	t.Helper()
	p := etcdtest.NewProxy(t, url)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.URL()}, DialTimeout: 2 * time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return p, cli
}

// followedOrders is etcd with 50 instances of orders (direct: a client
// of it), and a follower of them through a proxy (cli: its client), at
// its first snapshot.
func followedOrders(t *testing.T) (direct, cli *clientv3.Client, p *etcdtest.Proxy, f *follower) {
	t.Helper()
	m := etcdtest.Start(t, false)
	direct = m.Client(t)
	p, cli = proxied(t, m.ClientURL)
	for i := range 50 {
		put(t, direct, "orders", fmt.Sprint("o-", i), "0")
	}
	f = follow(t, cli, "orders")
	waitFor(t, 5*time.Second, "the snapshot", func() bool { return converged(t, direct, f) })
	return direct, cli, p, f
}

// knownIn is a Config.Known as the hub's: c's record at exactly these
// revisions; n counts the records it gives.
func knownIn(c *cache.Cache, n *atomic.Int64) func(key string, modRev, createRev int64) *registryv1.Instance {
	return func(key string, modRev, createRev int64) *registryv1.Instance {
		svc, id, ok := keys.Parse(key)
		if !ok {
			return nil
		}
		in, ok := c.Get(svc, id)
		if !ok || in.ModRevision != modRev || in.CreateRevision != createRev {
			return nil
		}
		n.Add(1)
		return in
	}
}

// follower runs a Watcher into a cache and records every batch.
type follower struct {
	c       *cache.Cache
	mu      sync.Mutex
	batches []cache.Batch
	revs    []int64
	junk    atomic.Int64
	restart sync.Map
	known   atomic.Int64 // records a list took from the cache (Config.Known)
	cancel  context.CancelFunc
	done    chan error
}

func follow(t *testing.T, cli *clientv3.Client, service string) *follower {
	t.Helper()
	f := &follower{c: cache.New(), done: make(chan error, 1)}
	w, err := watch.New(watch.Config{Client: cli, Service: service, PageSize: 7, PageBytes: 1, MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond, ProgressInterval: 200 * time.Millisecond,
		OnJunk: func(string, error) { f.junk.Add(1) },
		Known:  knownIn(f.c, &f.known),
		OnRestart: func(reason string, _ error) {
			v, _ := f.restart.LoadOrStore(reason, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() {
		f.done <- w.Run(ctx, func(b cache.Batch) error {
			if _, err := f.c.Apply(b); err != nil {
				t.Errorf("cache refused batch at %d (cache at %d): %v", b.Revision, f.c.Revision(), err)
			}
			f.mu.Lock()
			f.batches = append(f.batches, b)
			f.revs = append(f.revs, b.Revision)
			f.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(f.stop)
	return f
}

func (f *follower) stop() {
	if f.cancel != nil {
		f.cancel()
		if err := <-f.done; !errors.Is(err, context.Canceled) {
			panic(fmt.Sprintf("Run returned %v, want context.Canceled", err))
		}
		f.cancel = nil
	}
}

func (f *follower) restarts(reason string) int64 {
	v, ok := f.restart.Load(reason)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// converged checks the follower's cache equals what etcd holds now.
func converged(t *testing.T, cli *clientv3.Client, f *follower) bool {
	t.Helper()
	resp, err := cli.Get(context.Background(), keys.Instances(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if f.c.Revision() < resp.Header.Revision {
		return false
	}
	want := map[string]int64{}
	for _, kv := range resp.Kvs {
		if in, err := keys.Decode(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision); err == nil {
			want[in.Service+"/"+in.Id] = kv.ModRevision
		}
	}
	all := f.c.Snapshot().All()
	if len(all) != len(want) {
		return false
	}
	for _, in := range all {
		if want[in.Service+"/"+in.Id] != in.ModRevision {
			return false
		}
	}
	return true
}

func (f *follower) assertMonotonic(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := 1; i < len(f.revs); i++ {
		if f.revs[i] < f.revs[i-1] {
			t.Fatalf("revision went down: %d after %d (batches %v)", f.revs[i], f.revs[i-1], f.revs)
		}
	}
}

func TestSnapshotThenTransactions(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	for i := range 20 { // several pages of 7
		put(t, cli, "orders", fmt.Sprint("o-", i), "1")
	}
	put(t, cli, "users", "u-1", "1")
	f := follow(t, cli, "")
	waitFor(t, 5*time.Second, "the snapshot", func() bool { return f.c.Len() == 21 })
	// One transaction with two puts and a delete arrives as one batch.
	b1, err := record.Encode(&registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80", Version: "2"})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := record.Encode(&registryv1.Instance{Service: "orders", Id: "new", Address: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := cli.Txn(context.Background()).Then(
		clientv3.OpPut(keys.Instance("orders", "o-1"), string(b1)),
		clientv3.OpPut(keys.Instance("orders", "new"), string(b2)),
		clientv3.OpDelete(keys.Instance("orders", "o-2")),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the transaction", func() bool { return f.c.Revision() >= tx.Header.Revision })
	f.mu.Lock()
	var txb *cache.Batch
	for i := range f.batches {
		if f.batches[i].Revision == tx.Header.Revision {
			txb = &f.batches[i]
		}
	}
	first := f.batches[0]
	f.mu.Unlock()
	if !first.Snapshot || first.Reset || len(first.Instances) != 21 {
		t.Fatalf("first batch = snapshot %v reset %v with %d instances", first.Snapshot, first.Reset, len(first.Instances))
	}
	if txb == nil || len(txb.Events) != 3 {
		t.Fatalf("transaction batch = %+v, want its 3 events together", txb)
	}
	if g, ok := f.c.Get("orders", "o-1"); !ok || g.Version != "2" {
		t.Fatalf("o-1 = %v (present %v), want version 2", g, ok)
	}
	if _, ok := f.c.Get("orders", "o-2"); ok {
		t.Fatal("o-2 not deleted")
	}
	// An idle watcher's revision moves with progress notifications.
	other, err := cli.Put(context.Background(), "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "progress past an unrelated write", func() bool { return f.c.Revision() >= other.Header.Revision })
	f.assertMonotonic(t)
}

// Cut from etcd while 1,000 changes land and etcd compacts past the
// watcher's revision: it relists, delivers a reset, and converges, with
// its revision never going down.
func TestResumeAndCompaction(t *testing.T) {
	direct, cli, p, f := followedOrders(t)

	// A short cut with few changes: resumed, no relist. The change lands
	// once the client has seen its connection go.
	p.Cut()
	waitFor(t, 10*time.Second, "the client to see the cut", func() bool {
		return cli.ActiveConnection().GetState() != connectivity.Ready
	})
	put(t, direct, "orders", "o-1", "1")
	p.Heal()
	waitFor(t, 10*time.Second, "resume after a short cut", func() bool { return converged(t, direct, f) })
	if f.c.Stats().Resets != 0 {
		t.Fatalf("a short cut caused %d resets", f.c.Stats().Resets)
	}

	p.Cut()
	rng := rand.New(rand.NewPCG(1, 2))
	var last int64
	for i := range 1000 {
		id := fmt.Sprint("o-", rng.IntN(80))
		if rng.IntN(4) == 0 {
			r, err := direct.Delete(context.Background(), keys.Instance("orders", id))
			if err != nil {
				t.Fatal(err)
			}
			last = r.Header.Revision
		} else {
			last = put(t, direct, "orders", id, fmt.Sprint(i))
		}
	}
	if _, err := direct.Compact(context.Background(), last); err != nil {
		t.Fatal(err)
	}
	p.Heal()
	waitFor(t, 15*time.Second, "convergence after compaction", func() bool { return converged(t, direct, f) })
	f.assertMonotonic(t)
	if f.c.Stats().Resets != 1 || f.restarts("relist") == 0 {
		t.Fatalf("resets %d, relist restarts %d: want exactly one reset after compaction", f.c.Stats().Resets, f.restarts("relist"))
	}
	if f.c.Stats().Stale != 0 {
		t.Fatalf("%d stale batches reached the cache", f.c.Stats().Stale)
	}
	// The relist forwards its records' stored bytes too.
	f.checkEncoded(t)
}

// A relist after a compaction takes the records it already holds (same
// key, mod and create revision) from Config.Known instead of decoding
// them: the reset snapshot carries the very instances the view had for
// those, new ones for what changed, and the stored bytes of all.
func TestRelistTakesKnownRecords(t *testing.T) {
	direct, _, p, f := followedOrders(t)
	before := map[string]*registryv1.Instance{}
	for _, in := range f.c.Instances("orders") {
		before[in.Id] = in
	}
	if n := f.known.Load(); n != 0 {
		t.Fatalf("the first list took %d records from an empty view", n)
	}

	p.Cut()
	var last int64
	for i := range 5 {
		last = put(t, direct, "orders", fmt.Sprint("o-", i), "1")
	}
	for _, id := range []string{"o-10", "o-11"} {
		r, err := direct.Delete(context.Background(), keys.Instance("orders", id))
		if err != nil {
			t.Fatal(err)
		}
		last = r.Header.Revision
	}
	for i := range 3 {
		last = put(t, direct, "orders", fmt.Sprint("n-", i), "1")
	}
	if _, err := direct.Compact(context.Background(), last); err != nil {
		t.Fatal(err)
	}
	p.Heal()
	waitFor(t, 15*time.Second, "convergence after compaction", func() bool { return converged(t, direct, f) })
	if f.restarts("relist") == 0 {
		t.Fatal("no relist")
	}
	var reset *cache.Batch
	f.mu.Lock()
	for i := range f.batches {
		if f.batches[i].Reset {
			reset = &f.batches[i]
		}
	}
	f.mu.Unlock()
	if reset == nil || len(reset.Instances) != 51 {
		t.Fatalf("reset snapshot %+v, want 51 instances", reset)
	}
	kept := 0
	for _, in := range reset.Instances {
		old := before[in.Id]
		changed := in.Version == "1"
		switch {
		case changed && old == in:
			t.Fatalf("%s changed, and the relist kept the old instance", in.Id)
		case !changed && old != in:
			t.Fatalf("%s did not change, and the relist decoded it again", in.Id)
		case !changed:
			kept++
		}
	}
	if kept != 43 || f.known.Load() != 43 {
		t.Fatalf("%d instances kept, %d taken from Known; want the 43 unchanged", kept, f.known.Load())
	}
	f.checkEncoded(t)
}

// Junk under the prefix is skipped and counted, in the list and in the
// watch; junk replacing a valid record reads as a delete.
func TestJunk(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	put(t, cli, "orders", "good", "1")
	put(t, cli, "orders", "soon-junk", "1")
	if _, err := cli.Put(context.Background(), keys.Instance("orders", "junk"), "\xff\xfe"); err != nil {
		t.Fatal(err)
	}
	f := follow(t, cli, "")
	waitFor(t, 5*time.Second, "the snapshot", func() bool { return f.c.Len() == 2 })
	r, err := cli.Put(context.Background(), keys.Instance("orders", "soon-junk"), "garbage")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the junk write", func() bool { return f.c.Revision() >= r.Header.Revision })
	if _, ok := f.c.Get("orders", "soon-junk"); ok {
		t.Fatal("junk replacing a record left the old record visible")
	}
	if f.junk.Load() != 2 {
		t.Fatalf("junk counted %d times, want 2", f.junk.Load())
	}
}

// etcd replaced by another cluster (as after a restore from backup): a
// NewEpoch snapshot is delivered, once, and the view is the new etcd's.
func TestNewEpoch(t *testing.T) {
	a := etcdtest.Start(t, false)
	b := etcdtest.Start(t, false)
	ca, cb := a.Client(t), b.Client(t)
	for i := range 30 {
		put(t, ca, "orders", fmt.Sprint("a-", i), "1")
	}
	put(t, cb, "orders", "b-1", "1") // b is at a much lower revision
	p, cli := proxied(t, a.ClientURL)
	f := follow(t, cli, "")
	waitFor(t, 5*time.Second, "the snapshot", func() bool { return f.c.Len() == 30 })
	p.Cut()
	p2 := retarget(t, p, b.ClientURL)
	defer p2.Cut()
	waitFor(t, 15*time.Second, "the new epoch", func() bool { return f.c.Stats().NewEpochs == 1 })
	if _, ok := f.c.Get("orders", "b-1"); !ok || f.c.Len() != 1 {
		t.Fatalf("after the new epoch the view holds %d instances", f.c.Len())
	}
}

// retarget starts a proxy on p's address that forwards to another target.
func retarget(t *testing.T, p *etcdtest.Proxy, target string) *etcdtest.Proxy {
	return etcdtest.NewProxyAt(t, p.Addr(), target)
}
