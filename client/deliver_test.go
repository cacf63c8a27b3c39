package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc/resolver"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// gate is an OnChange that records every change and, once armed, blocks
// in the next change that is not a heartbeat until released.
type gate struct {
	mu      sync.Mutex
	changes []client.Change
	armed   bool
	running int // calls in progress: never more than one
	overlap bool
	blocked chan struct{} // closed when a call blocks
	release chan struct{}
}

func newGate() *gate { return &gate{blocked: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) on(ch client.Change) {
	g.mu.Lock()
	g.running++
	g.overlap = g.overlap || g.running > 1
	g.changes = append(g.changes, ch)
	hold := g.armed && !ch.Progress
	if hold {
		g.armed = false
	}
	g.mu.Unlock()
	if hold {
		close(g.blocked)
		<-g.release
	}
	g.mu.Lock()
	g.running--
	g.mu.Unlock()
}

// arm makes the next change block, once OnChange got the view up to rev
// (the first snapshot, for 0): OnChange runs behind the view, and the
// regnode's first snapshot may be older than a write made before it.
func (g *gate) arm(t *testing.T, rev int64) {
	t.Helper()
	waitFor(t, time.Minute, fmt.Sprint("OnChange to get revision ", rev), func() bool {
		return len(g.seen()) > 0 && g.lastRevision() >= rev
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = true
}

// seen returns a copy of the changes recorded so far.
func (g *gate) seen() []client.Change {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.changes)
}

// lastRevision is the revision of the last change recorded (0: none).
func (g *gate) lastRevision() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.changes) == 0 {
		return 0
	}
	return g.changes[len(g.changes)-1].Revision
}

// waitBlocked waits (a minute at most: only a broken build fails it) until
// an armed gate blocks.
func (g *gate) waitBlocked(t *testing.T) {
	t.Helper()
	select {
	case <-g.blocked:
	case <-time.After(time.Minute):
		t.Fatal("the armed OnChange was never called with a change")
	}
}

// last is the last revision recorded by r (0: none).
func (r *recorder) last() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.revs) == 0 {
		return 0
	}
	return r.revs[len(r.revs)-1]
}

// ids is "id@modRevision" of each instance, in order.
func ids(insts []*registryv1.Instance) []string {
	out := make([]string, 0, len(insts))
	for _, in := range insts {
		out = append(out, fmt.Sprintf("%s@%d", in.Id, in.ModRevision))
	}
	return out
}

// One Client, two services: while the OnChange of "orders" is blocked,
// "users" gets its changes (callback and view), and the view of "orders"
// itself (Instances, Revision, Freshness) and its resolver stay current;
// released, the OnChange of "orders" gets every change it missed, in
// order, one call at a time, up to the latest revision.
func TestBlockedOnChangeDelaysOnlyItsOwnSubscription(t *testing.T) {
	rn := regnodetest.Start(t)
	direct := rn.Etcd
	c := newClient(t, rn.Addr)
	first := put(t, direct, "orders", "o-0", "1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	a := newGate()
	subA, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{OnChange: a.on})
	if err != nil {
		t.Fatal(err)
	}
	defer subA.Close()
	recB := &recorder{}
	subB, err := c.Subscribe(ctx, "users", client.SubscribeOptions{OnChange: recB.on})
	if err != nil {
		t.Fatal(err)
	}
	defer subB.Close()
	fc := &fakeConn{}
	res, err := c.ResolverBuilder().Build(resolver.Target{URL: *mustURL(t, "registry:///orders")}, fc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	for _, s := range []*client.Subscription{subA, subB} {
		if err := s.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}

	a.arm(t, first)
	blockedAt := put(t, direct, "orders", "o-1", "1")
	a.waitBlocked(t)
	calls := len(a.seen())
	var wantA []int64 // the revisions of the changes A is owed
	var lastB int64
	for i := range 5 {
		wantA = append(wantA, put(t, direct, "orders", fmt.Sprint("o-", i+2), "1"))
		lastB = put(t, direct, "users", fmt.Sprint("u-", i), "1")
	}
	lastA := wantA[len(wantA)-1]

	// B: its callback and its view.
	waitFor(t, time.Minute, "B's OnChange to get B's latest change", func() bool { return recB.last() >= lastB })
	waitFor(t, time.Minute, "B's view", func() bool { return equalsEtcd(t, direct, subB, "users") })
	// A: its view, its freshness and its service's resolver.
	waitFor(t, time.Minute, "A's view", func() bool { return equalsEtcd(t, direct, subA, "orders") })
	if f := subA.Freshness(); f.Revision < lastA || !f.Connected {
		t.Fatalf("A's freshness %+v while its OnChange is blocked, want revision %d, connected", f, lastA)
	}
	waitFor(t, time.Minute, "A's resolver", func() bool {
		st := fc.state()
		return client.StateRevision(st) >= lastA && len(st.Addresses) == len(subA.Instances("orders"))
	})
	// All of that while A's callback was still blocked, and called no more.
	if n := len(a.seen()); n != calls {
		t.Fatalf("A's OnChange was called %d times while one call was blocked", n-calls)
	}

	close(a.release)
	waitFor(t, time.Minute, "A's OnChange to catch up", func() bool { return a.lastRevision() >= lastA })
	seen := a.seen()
	var after []int64 // A's changes from the blocked one on, heartbeats aside
	for _, ch := range seen[calls-1:] {
		if ch.Snapshot {
			t.Fatalf("A got a snapshot (%+v) after a backlog of %d changes, within the default bound", ch.Diff, len(wantA))
		}
		if !ch.Progress {
			after = append(after, ch.Revision)
		}
	}
	if want := append([]int64{blockedAt}, wantA...); !slices.Equal(after, want) {
		t.Fatalf("A's changes from the blocked one on at revisions %v, want %v", after, want)
	}
	a.mu.Lock()
	overlap := a.overlap
	a.mu.Unlock()
	if overlap {
		t.Fatal("A's OnChange ran concurrently with itself")
	}
	if st := subA.Stats(); st.Coalesced != 0 {
		t.Fatalf("A coalesced %d times within its bound", st.Coalesced)
	}
	recB.assertMonotonic(t)
}

// OnConnection runs where OnChange does: one blocked in its first call
// (connected) holds back neither the stream nor its own view.
func TestBlockedOnConnectionDelaysOnlyItsOwnSubscription(t *testing.T) {
	rn := regnodetest.Start(t)
	direct := rn.Etcd
	c := newClient(t, rn.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	blocked, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	var once sync.Once
	subA, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{OnConnection: func(client.Freshness) {
		once.Do(func() { close(blocked); <-release })
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer subA.Close()
	subB, err := c.Subscribe(ctx, "users", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer subB.Close()
	select {
	case <-blocked:
	case <-ctx.Done():
		t.Fatal("OnConnection never called")
	}
	put(t, direct, "orders", "o-1", "1")
	put(t, direct, "users", "u-1", "1")
	waitFor(t, time.Minute, "A's view", func() bool { return equalsEtcd(t, direct, subA, "orders") })
	waitFor(t, time.Minute, "B's view", func() bool { return equalsEtcd(t, direct, subB, "users") })
}

// An OnChange blocked while more changes than its CallbackBacklog come
// has them coalesced: released, its next change is a Snapshot (a Reset)
// of the view as it is then, and nothing more until the view moves; the
// coalescing is counted once, in Stats and in registry_client_*.
func TestBlockedOnChangeGetsASnapshotPastItsBacklog(t *testing.T) {
	const backlog, writes = 4, 10
	rn := regnodetest.Start(t)
	direct := rn.Etcd
	c := newClient(t, rn.Addr)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c.Metrics()); err != nil {
		t.Fatal(err)
	}
	first := put(t, direct, "orders", "o-0", "1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := newGate()
	sub, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{OnChange: a.on, CallbackBacklog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	a.arm(t, first)
	put(t, direct, "orders", "o-1", "1")
	a.waitBlocked(t)
	calls := len(a.seen())
	var last int64
	for i := range writes {
		last = put(t, direct, "orders", fmt.Sprint("o-", i%3), fmt.Sprint(i+2)) // updates as well as adds
	}
	waitFor(t, time.Minute, "the view", func() bool { return equalsEtcd(t, direct, sub, "orders") })
	if n := sub.Stats().Coalesced; n != 1 {
		t.Fatalf("coalesced %d times while blocked past its backlog, want 1", n)
	}

	close(a.release)
	waitFor(t, time.Minute, "OnChange to catch up", func() bool { return a.lastRevision() >= last })
	seen := a.seen()[calls:]
	snap := seen[0]
	if !snap.Snapshot || !snap.Reset || snap.Revision < last {
		t.Fatalf("first change after the backlog: snapshot %t reset %t at %d, want a reset snapshot at %d or later",
			snap.Snapshot, snap.Reset, snap.Revision, last)
	}
	if got, want := ids(snap.Instances), ids(sub.Instances("orders")); !slices.Equal(got, want) {
		t.Fatalf("the snapshot holds %v, the view %v", got, want)
	}
	for _, ch := range seen[1:] {
		if !ch.Progress {
			t.Fatalf("after the snapshot a change at %d (snapshot %t), with nothing written", ch.Revision, ch.Snapshot)
		}
	}
	if n := sub.Stats().Coalesced; n != 1 {
		t.Fatalf("coalesced %d times, want 1", n)
	}
	if n := c.Metrics().Counts().CallbacksCoalesced["orders"]; n != 1 {
		t.Fatalf("Metrics counts %d coalescings of orders, want 1", n)
	}
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP registry_client_callbacks_coalesced_total Times a subscription's callbacks fell too far behind and the changes waiting for them were replaced by one snapshot.
# TYPE registry_client_callbacks_coalesced_total counter
registry_client_callbacks_coalesced_total{service="orders"} 1
`), "registry_client_callbacks_coalesced_total")
	if err != nil {
		t.Fatal(err)
	}
}

// Subscription.Close, and Client.Close, while an OnChange is blocked
// (with changes waiting behind it) both return: the one of "orders" is
// closed by Subscription.Close, the one of "users" only by Client.Close.
// No callback starts after the Close that stopped it returned, Done is
// closed only once the blocked call returns, and then nothing of the
// Client is left running.
func TestCloseWhileOnChangeBlocks(t *testing.T) {
	rn := regnodetest.Start(t)
	direct := rn.Etcd
	api := newClient(t, rn.Addr).API()
	waitFor(t, time.Minute, "the regnode to lead", func() bool {
		resp, err := api.Status(context.Background(), &registryv1.StatusRequest{})
		return err == nil && resp.GetLeader() != ""
	})
	before := goleak.IgnoreCurrent()

	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, WatchPerSubscription: watchPerSubscription,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gates := map[string]*gate{}
	subs := map[string]*client.Subscription{}
	for _, svc := range []string{"orders", "users"} {
		g := newGate()
		defer func() {
			select {
			case <-g.release:
			default:
				close(g.release) // a failure before the release: let the callback end
			}
		}()
		sub, err := c.Subscribe(ctx, svc, client.SubscribeOptions{OnChange: g.on})
		if err != nil {
			t.Fatal(err)
		}
		if err := sub.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		g.arm(t, 0)
		put(t, direct, svc, "x-1", "1")
		g.waitBlocked(t)
		var last int64
		for i := range 3 {
			last = put(t, direct, svc, fmt.Sprint("x-", i+2), "1") // waiting behind the blocked call
		}
		waitFor(t, time.Minute, svc+"'s view", func() bool { return sub.Revision() >= last })
		gates[svc], subs[svc] = g, sub
	}

	bounded := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		select {
		case <-done:
		case <-time.After(time.Minute): // only a Close that waits on the callback fails this
			t.Fatalf("%s did not return while an OnChange was blocked", what)
		}
	}
	bounded("Subscription.Close", subs["orders"].Close)
	calls := map[string]int{"orders": len(gates["orders"].seen())}
	bounded("Client.Close", func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	calls["users"] = len(gates["users"].seen())
	for svc, sub := range subs {
		select {
		case <-sub.Done():
			t.Fatalf("%s: Done closed while its OnChange is still running", svc)
		default:
		}
	}

	for svc, sub := range subs {
		close(gates[svc].release)
		select {
		case <-sub.Done():
		case <-time.After(time.Minute):
			t.Fatalf("%s: Done not closed once the blocked OnChange returned", svc)
		}
		if n := len(gates[svc].seen()); n != calls[svc] {
			t.Fatalf("%s: OnChange was called %d times after Close returned (3 changes were waiting)", svc, n-calls[svc])
		}
	}
	noLeaks(t, before)
}

// An OnChange may close its own Subscription (and it then gets no other
// call); with callbacks on the stream's goroutine this deadlocked.
func TestOnChangeClosesItsSubscription(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	put(t, rn.Etcd, "orders", "o-0", "1")
	var (
		mu    sync.Mutex
		calls int
		sub   *client.Subscription
	)
	closed := make(chan struct{})
	ready := make(chan struct{})
	s, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{OnChange: func(client.Change) {
		<-ready
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			sub.Close()
			close(closed)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	sub = s
	close(ready)
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close called from OnChange did not return")
	}
	select {
	case <-sub.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed after the OnChange that closed it returned")
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Fatalf("OnChange called %d times, want once: none after Close", calls)
	}
}

// A Subscription whose callbacks have all run holds no goroutine for
// them: fifty idle subscriptions with OnChange leave no goroutine in the
// callbacks' loop (one each, parked, was about 8 KiB of stack per
// subscription).
func TestIdleCallbacksHoldNoGoroutine(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	const n = 50
	var mu sync.Mutex
	told := 0
	for range n {
		// Not bounded by a context: a subscription ends with its own.
		s, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{OnChange: func(ch client.Change) {
			if ch.Snapshot {
				mu.Lock()
				told++
				mu.Unlock()
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	waitFor(t, time.Minute, "every OnChange told its snapshot", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return told == n
	})
	// The callbacks' goroutines, from the stacks of every goroutine.
	delivering := func() int {
		var b strings.Builder
		if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
			t.Fatal(err)
		}
		// With debug=1 each distinct stack is a block "N @ ..." and its
		// frames: count N for the stacks through delivery.run.
		n := 0
		for _, blk := range strings.Split(b.String(), "\n\n") {
			if !strings.Contains(blk, "client.(*delivery).run") {
				continue
			}
			for _, line := range strings.Split(blk, "\n") { // the first block starts with the profile's title
				var k int
				if _, err := fmt.Sscanf(line, "%d @", &k); err == nil {
					n += k
					break
				}
			}
		}
		return n
	}
	waitFor(t, time.Minute, "no goroutine left in the callbacks' loop", func() bool { return delivering() == 0 })
}
