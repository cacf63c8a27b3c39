package client_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

var keys = record.NewKeys("")

// watchPerSubscription runs the package's tests over the older path, one
// Watch stream per Subscription (REGISTRY_TEST_WATCH_PER_SUBSCRIPTION=1),
// instead of the Client's one Subscribe stream.
var watchPerSubscription = os.Getenv("REGISTRY_TEST_WATCH_PER_SUBSCRIPTION") != ""

func newClient(t testing.TB, addrs ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: addrs, WatchPerSubscription: watchPerSubscription})
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

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func put(t testing.TB, cli *clientv3.Client, service, id, version string) int64 {
	t.Helper()
	b, err := record.Encode(&registryv1.Instance{Service: service, Id: id, Address: "10.0.0.1:80", Version: version, Weight: 100,
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING})
	if err != nil {
		t.Fatal(err)
	}
	r, err := cli.Put(context.Background(), keys.Instance(service, id), string(b))
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// churn makes n random puts, updates and deletes of service's instances
// straight in etcd and returns the last revision.
func churn(t testing.TB, cli *clientv3.Client, service string, n int, seed uint64) int64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	var last int64
	for i := range n {
		id := fmt.Sprint("i-", rng.IntN(60))
		if rng.IntN(4) == 0 {
			r, err := cli.Delete(context.Background(), keys.Instance(service, id))
			if err != nil {
				t.Fatal(err)
			}
			last = r.Header.Revision
		} else {
			last = put(t, cli, service, id, fmt.Sprint(i))
		}
	}
	return last
}

// recorder watches a subscription: every change's revision in order.
type recorder struct {
	mu    sync.Mutex
	revs  []int64
	snaps int
	diffs int
}

func (r *recorder) on(ch client.Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revs = append(r.revs, ch.Revision)
	if ch.Snapshot {
		r.snaps++
	} else if !ch.Progress {
		r.diffs++
	}
}

func (r *recorder) assertMonotonic(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 1; i < len(r.revs); i++ {
		if r.revs[i] < r.revs[i-1] {
			t.Fatalf("the subscriber's revision went down: %d after %d", r.revs[i], r.revs[i-1])
		}
	}
}

// equalsEtcd reports whether the subscription's view of service is exactly
// what etcd holds now.
func equalsEtcd(t testing.TB, cli *clientv3.Client, s *client.Subscription, service string) bool {
	t.Helper()
	resp, err := cli.Get(context.Background(), keys.Service(service), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if s.Revision() < resp.Header.Revision {
		return false
	}
	got := s.Instances(service)
	if len(got) != len(resp.Kvs) {
		return false
	}
	for i, kv := range resp.Kvs { // both sorted by id
		if got[i].ModRevision != kv.ModRevision || keys.Instance(service, got[i].Id) != string(kv.Key) {
			return false
		}
	}
	return true
}

// A subscriber cut off from its regnode, and the regnode cut off from
// etcd, while 1,000+ changes land and etcd compacts past both; healed, it
// converges to exactly what etcd holds, its revision never having gone
// down, without a reset: the regnode relists, and the subscriber's resume
// gets the relist's differences from the ring.
func TestCutOffThroughCompactionConverges(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	etcdLink := etcdtest.NewProxy(t, m.ClientURL)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{etcdLink.URL()}, RingSize: 100}, m.ClientURL)
	subLink := etcdtest.NewProxy(t, rn.Addr)
	c := newClient(t, subLink.Addr())
	churn(t, direct, "orders", 100, 1)
	rec := &recorder{}
	// Held until the view has been looked at: a snapshot arriving within
	// microseconds (an idle machine) must not make "not known before the
	// first snapshot" look false.
	subLink.Pause()
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{OnChange: rec.on})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if f := sub.Freshness(); f.Known {
		t.Fatal("known before the first snapshot")
	}
	subLink.Resume()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the first view", func() bool { return equalsEtcd(t, direct, sub, "orders") })

	subLink.Cut()
	etcdLink.Cut()
	last := churn(t, direct, "orders", 1200, 2)
	if _, err := direct.Compact(context.Background(), last); err != nil {
		t.Fatal(err)
	}
	before := sub.Revision()
	healed := time.Now()
	etcdLink.Heal()
	subLink.Heal()
	waitFor(t, time.Minute, "convergence after compaction", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	rec.assertMonotonic(t)
	if sub.Revision() <= before {
		t.Fatalf("revision %d did not move past %d", sub.Revision(), before)
	}
	st := sub.Stats()
	// The regnode relisted; the subscriber, resuming from before the
	// relist, gets what it changed from the ring, not a reset.
	if st.Resets != 0 || st.Cache.Stale != 0 {
		t.Fatalf("stats %+v: want no reset and no stale batch", st)
	}
	f := sub.Freshness()
	// Confirmed by what came after the heal: an order, not an age.
	if !f.Known || f.Revision != sub.Revision() || f.ConfirmedAt.Before(healed) || !f.Connected {
		t.Fatalf("freshness %+v", f)
	}
	if n := testutil.ToFloat64(rn.Node.Metrics().WatchRestarts.WithLabelValues("relist")); n < 1 {
		t.Fatalf("regnode relisted %v times, want at least once", n)
	}
}

// A short disconnect is served from the ring (the missed transactions, no
// reset); a longer one, past the ring, gets a reset snapshot.
func TestRingReplayAndReset(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, RingSize: 50}, m.ClientURL)
	link := etcdtest.NewProxy(t, rn.Addr)
	c := newClient(t, link.Addr())
	churn(t, direct, "orders", 30, 3)
	rec := &recorder{}
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{OnChange: rec.on})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitFor(t, time.Minute, "the first view", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	resets := func(reason string) float64 {
		return testutil.ToFloat64(rn.Node.Metrics().ResetsSent.WithLabelValues(reason))
	}

	link.Cut()
	churn(t, direct, "orders", 20, 4) // fits in the ring of 50
	link.Heal()
	waitFor(t, time.Minute, "ring replay", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	if sub.Stats().Resets != 0 || resets("ring") != 0 {
		t.Fatalf("a replay within the ring caused a reset (subscriber %d, regnode %v)", sub.Stats().Resets, resets("ring"))
	}
	if sub.Stats().Reconnects < 1 {
		t.Fatal("the subscription never reconnected: the cut did not cut")
	}

	link.Cut()
	churn(t, direct, "orders", 200, 5) // overflows the ring
	link.Heal()
	waitFor(t, time.Minute, "reset", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	if sub.Stats().Resets != 1 || resets("ring") != 1 {
		t.Fatalf("resets: subscriber %d, regnode %v; want 1 each", sub.Stats().Resets, resets("ring"))
	}
	rec.assertMonotonic(t)
}

// A subscriber moved from regnode A to a regnode B that lags behind A
// waits for B to catch up and resumes without a rewind.
func TestMoveToLaggingRegnode(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	a := regnodetest.StartExternal(t, m.ClientURL)
	bLink := etcdtest.NewProxy(t, m.ClientURL)
	b := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{bLink.URL()}}, m.ClientURL)
	toA := etcdtest.NewProxy(t, a.Addr)
	toB := etcdtest.NewProxy(t, b.Addr)
	toB.Cut() // the subscriber starts on A
	c := newClient(t, toA.Addr(), toB.Addr())
	churn(t, direct, "orders", 20, 6)
	rec := &recorder{}
	sub, err := c.Subscribe(context.Background(), "", client.SubscribeOptions{OnChange: rec.on})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitFor(t, time.Minute, "the first view", func() bool { return equalsEtcd(t, direct, sub, "orders") })

	bLink.Pause() // B stops hearing from etcd
	// Released before B is closed even if the test fails first: a regnode
	// whose etcd link is paused does not finish closing.
	defer bLink.Resume()
	last := churn(t, direct, "orders", 50, 7)
	waitFor(t, time.Minute, "A's view", func() bool { return sub.Revision() >= last })
	if b.Node.Hub().Revision() >= last {
		t.Fatal("B did not lag")
	}
	// Move: A goes away, B comes into reach; B is behind the subscriber.
	toA.Cut()
	toB.Heal()
	// B holds a resume request from ahead of it until it catches up, and
	// past its catch-up timeout answers Unavailable "behind": that answer
	// shows the subscriber reached B and was held back, not served B's
	// older view (which its cache would have refused as stale).
	waitFor(t, time.Minute, "B to hold the subscriber back as ahead of it", func() bool {
		err := sub.LastError()
		return err != nil && strings.Contains(err.Error(), "behind the requested revision")
	})
	bLink.Resume()
	last = churn(t, direct, "orders", 30, 8)
	waitFor(t, time.Minute, "B's view", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	rec.assertMonotonic(t)
	if st := sub.Stats(); st.Resets != 0 || st.Cache.Stale != 0 {
		t.Fatalf("moving to B cost %d resets and %d stale batches, want a replay and none", st.Resets, st.Cache.Stale)
	}
	if b.Node.Hub().Subscribers() != 1 {
		t.Fatalf("B serves %d subscribers, want 1", b.Node.Hub().Subscribers())
	}
}

// A subscriber too slow to read is reset, and then correct; a fast one on
// the same regnode is never reset and sees every transaction.
//
// Both sides are bounded by counts, not by the machine's speed: the
// writer never lets the fast subscriber fall more than fastLag
// transactions behind (it waits for it to apply them), well inside the
// regnode's queue of 64, while the slow one reads nothing at all, so its
// queue overflows after 64 transactions plus what the fixed flow-control
// windows hold, far fewer than the 300 written.
func TestSlowSubscriberIsResetFastOneUnaffected(t *testing.T) {
	const queue, fastLag, writes = 64, 16, 300
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, QueueSize: queue}, m.ClientURL)
	fast := newClient(t, rn.Addr)
	frec := &recorder{}
	fsub, err := fast.Subscribe(context.Background(), "orders", client.SubscribeOptions{OnChange: frec.on})
	if err != nil {
		t.Fatal(err)
	}
	defer fsub.Close()
	waitFor(t, time.Minute, "fast ready", func() bool { return fsub.Freshness().Known })

	// The slow subscriber: a raw stream that is not read while the
	// registry churns, so gRPC flow control backs up into its queue.
	// Fixed 64 KiB windows (no BDP growth), so the regnode's sends block
	// soon after the reader stops reading.
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow, err := registryv1.NewRegistryClient(cc).Watch(ctx, &registryv1.WatchRequest{Service: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := slow.Recv()
	if err != nil || first.GetSnapshot() == nil {
		t.Fatalf("slow first message %v, %v", first, err)
	}
	big := make(map[string]string)
	for i := range 40 {
		big[fmt.Sprint("k", i)] = fmt.Sprintf("%0350d", i) // ~14 KiB per record (limit 16): windows fill fast
	}
	var last int64
	for i := range writes {
		b, err := record.Encode(&registryv1.Instance{Service: "orders", Id: fmt.Sprint("i-", i%20), Address: "10.0.0.1:80", Weight: 100,
			Version: fmt.Sprint(i), Metadata: big, Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING})
		if err != nil {
			t.Fatal(err)
		}
		r, err := direct.Put(context.Background(), keys.Instance("orders", fmt.Sprint("i-", i%20)), string(b))
		if err != nil {
			t.Fatal(err)
		}
		last = r.Header.Revision
		if (i+1)%fastLag == 0 {
			waitFor(t, time.Minute, "the fast subscriber to keep up", func() bool { return fsub.Revision() >= last })
		}
	}
	waitFor(t, time.Minute, "fast subscriber", func() bool { return fsub.Revision() >= last })
	// OnChange runs behind the view, on the subscription's own goroutine.
	waitFor(t, time.Minute, "the fast subscriber's OnChange", func() bool { return frec.last() >= last })
	waitFor(t, time.Minute, "the slow reset", func() bool {
		return testutil.ToFloat64(rn.Node.Metrics().ResetsSent.WithLabelValues("slow-subscriber")) >= 1
	})
	// Now read the slow stream: it must come to a reset snapshot and end
	// up exactly at etcd's state.
	view := map[string]int64{}
	var rev int64
	sawReset := false
	for rev < last || !sawReset {
		resp, err := slow.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Revision < rev {
			t.Fatalf("slow stream went back: %d after %d", resp.Revision, rev)
		}
		rev = resp.Revision
		switch k := resp.Kind.(type) {
		case *registryv1.WatchResponse_Snapshot:
			if k.Snapshot.Reset_ {
				sawReset = true
			}
			clear(view)
			for _, in := range k.Snapshot.Instances {
				view[in.Id] = in.ModRevision
			}
		case *registryv1.WatchResponse_Events:
			for _, e := range k.Events.Events {
				if e.Type == registryv1.Event_TYPE_PUT {
					view[e.Instance.Id] = e.Instance.ModRevision
				} else {
					delete(view, e.Id)
				}
			}
		}
	}
	resp, err := direct.Get(context.Background(), keys.Service("orders"), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(view) != len(resp.Kvs) {
		t.Fatalf("slow view has %d instances, etcd %d", len(view), len(resp.Kvs))
	}
	for _, kv := range resp.Kvs {
		_, id, _ := keys.Parse(string(kv.Key))
		if view[id] != kv.ModRevision {
			t.Fatalf("slow view of %s at %d, etcd at %d", id, view[id], kv.ModRevision)
		}
	}
	if fsub.Stats().Resets != 0 {
		t.Fatalf("the fast subscriber was reset %d times", fsub.Stats().Resets)
	}
	frec.mu.Lock()
	diffs := frec.diffs
	frec.mu.Unlock()
	if diffs != writes {
		t.Fatalf("the fast subscriber saw %d transactions, want all %d", diffs, writes)
	}
	frec.assertMonotonic(t)
}

// An empty service is a known, empty list; before the first snapshot the
// list is unknown.
func TestEmptyIsNotUnknown(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	// The regnode's prober election writes once; let it, so that nothing
	// writes to etcd while the idle view is watched.
	waitFor(t, time.Minute, "the prober election", func() bool {
		st, err := c.API().Status(context.Background(), &registryv1.StatusRequest{})
		return err == nil && st.Leader != ""
	})
	sub, err := c.Subscribe(context.Background(), "nobody", client.SubscribeOptions{Changes: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	select {
	case ch := <-sub.Changes():
		if !ch.Snapshot || len(ch.Instances) != 0 {
			t.Fatalf("first change %+v", ch)
		}
	case <-time.After(time.Minute):
		t.Fatal("no first snapshot")
	}
	first := sub.Freshness()
	if !first.Known || first.Revision == 0 {
		t.Fatalf("freshness %+v", first)
	}
	// Nothing changes, yet the view keeps being confirmed: a quiet list,
	// not a stale one.
	waitFor(t, time.Minute, "a heartbeat confirming the idle view", func() bool {
		return sub.Freshness().ConfirmedAt.After(first.ConfirmedAt)
	})
	if f := sub.Freshness(); f.Revision != first.Revision {
		t.Fatalf("revision moved from %d to %d with no writes", first.Revision, f.Revision)
	}
	if _, err := c.Subscribe(context.Background(), "Bad_Name", client.SubscribeOptions{}); err == nil {
		t.Fatal("bad service name accepted")
	}
}

// The Subscriptions of one service on one Client are copies of one feed:
// each takes the feed's step (cache.Replay), so they share its snapshot
// instead of applying every unit again, the first (the feed's first
// snapshot) and one that joins later (seeded from the feed's view) alike;
// and each still holds exactly what etcd holds, with its own changes.
func TestSubscriptionsOfOneServiceShareOneView(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}}, m.ClientURL)
	c := newClient(t, rn.Addr)
	churn(t, direct, "orders", 20, 1)
	var changes [2]atomic.Int64
	subscribe := func(i int) *client.Subscription {
		s, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{OnChange: func(ch client.Change) {
			if !ch.Progress {
				changes[i].Add(1)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	a := subscribe(0)
	waitFor(t, time.Minute, "the first view", func() bool { return equalsEtcd(t, direct, a, "orders") })
	b := subscribe(1)
	waitFor(t, time.Minute, "the second view", func() bool { return equalsEtcd(t, direct, b, "orders") })
	before := [2]int64{changes[0].Load(), changes[1].Load()}
	churn(t, direct, "orders", 20, 2)
	waitFor(t, time.Minute, "both views after the churn", func() bool {
		return equalsEtcd(t, direct, a, "orders") && equalsEtcd(t, direct, b, "orders")
	})
	// Progress may move both between two reads: wait for a moment they
	// agree, which copies of one feed reach at every step.
	waitFor(t, 10*time.Second, "one shared snapshot", func() bool { return a.Snapshot() == b.Snapshot() })
	for i := range changes {
		if changes[i].Load() <= before[i] {
			t.Fatalf("subscription %d was told of no change during the churn", i)
		}
	}
}

// forwarder is a TCP forwarder to addr that counts the connections it
// accepted, and can be closed with everything it carries.
type forwarder struct {
	ln       net.Listener
	accepted atomic.Int64
	open     atomic.Int64 // client connections not yet closed
	// hold, if set, keeps the regnode's bytes from the client until it
	// is closed: the client's connection stays connecting.
	hold  chan struct{}
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func forward(t *testing.T, addr string) *forwarder {
	return forwardHeld(t, addr, nil)
}

func forwardHeld(t *testing.T, addr string, hold chan struct{}) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, hold: hold}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.accepted.Add(1)
			f.open.Add(1)
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				f.open.Add(-1)
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, up)
			f.mu.Unlock()
			f.wg.Add(2)
			go func() { defer f.wg.Done(); io.Copy(up, c); up.Close(); f.open.Add(-1) }()
			go func() {
				defer f.wg.Done()
				if f.hold != nil {
					<-f.hold
				}
				io.Copy(c, up)
				c.Close()
			}()
		}
	}()
	t.Cleanup(f.close)
	return f
}

func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// A Client whose first regnode is slow to answer connects another after
// ConnectDelay; once one is ready, the other, still connecting, is let
// go: the Client ends with one connection, not two for good. Ten Clients,
// each trying the two regnodes in its own random order, so that some try
// the slow one first.
func TestRaceLeavesOneConnection(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}}, m.ClientURL)
	hold := make(chan struct{})
	slow, fast := forwardHeld(t, rn.Addr, hold), forward(t, rn.Addr)
	churn(t, direct, "orders", 5, 1)
	for range 10 {
		c := newClient(t, slow.ln.Addr().String(), fast.ln.Addr().String())
		sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sub.Close)
		waitFor(t, time.Minute, "a view through the fast regnode", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	}
	if slow.accepted.Load() == 0 {
		t.Skip("no Client tried the slow regnode first (1 in 1,024)")
	}
	close(hold) // the slow regnode answers now: a racer kept would turn ready
	waitFor(t, time.Minute, "no connection left to the slow regnode", func() bool { return slow.open.Load() == 0 })
	if n := fast.open.Load(); n != 10 {
		t.Fatalf("%d connections to the fast regnode, want one per Client (10)", n)
	}
}

// A Client of three regnodes connects to one of them, not to all three:
// its subscriptions and calls go there; when that one goes away it
// connects one more, and the third is never dialed.
func TestClientConnectsToOneRegnode(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}}, m.ClientURL)
	fs := []*forwarder{forward(t, rn.Addr), forward(t, rn.Addr), forward(t, rn.Addr)}
	c := newClient(t, fs[0].ln.Addr().String(), fs[1].ln.Addr().String(), fs[2].ln.Addr().String())
	churn(t, direct, "orders", 10, 1)
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitFor(t, time.Minute, "the first view", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	for range 5 {
		if _, err := c.API().List(context.Background(), &registryv1.ListRequest{Service: "orders"}); err != nil {
			t.Fatal(err)
		}
	}
	used := -1
	total := int64(0)
	for i, f := range fs {
		if n := f.accepted.Load(); n > 0 {
			used, total = i, total+n
		}
	}
	if total != 1 {
		t.Fatalf("connections accepted by the three regnodes' addresses: %d, %d, %d; want one in all",
			fs[0].accepted.Load(), fs[1].accepted.Load(), fs[2].accepted.Load())
	}
	fs[used].close()
	churn(t, direct, "orders", 10, 2)
	waitFor(t, time.Minute, "the view through another regnode", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	dialed := 0
	for _, f := range fs {
		if f.accepted.Load() > 0 {
			dialed++
		}
	}
	if dialed != 2 {
		t.Fatalf("%d of the three addresses dialed after the first went away, want 2", dialed)
	}
}
