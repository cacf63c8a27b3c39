package prober

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// writerFixture is a writer whose store reaches etcd through a link the
// test can pause, a guard like the leader's fence, and a direct client to
// look behind its back.
type writerFixture struct {
	t      *testing.T
	link   *etcdtest.Proxy
	direct *clientv3.Client
	st     *store.Store // through the link
	lease  clientv3.LeaseID
	w      *writer
	landed chan health.Transition
}

func newWriterFixture(t *testing.T, workers int) *writerFixture {
	t.Helper()
	m := etcdtest.Start(t, false)
	fx := &writerFixture{t: t, direct: m.Client(t), link: etcdtest.NewProxy(t, m.ClientURL),
		landed: make(chan health.Transition, 64)}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{fx.link.URL()}, DialTimeout: 5 * time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	if fx.st, err = store.New(store.Config{Client: cli}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g, err := fx.direct.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	r, err := fx.direct.Put(ctx, "/test/leader", "me", clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatal(err)
	}
	fx.lease = g.ID
	guard := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision("/test/leader"), "=", r.Header.Revision)}
	fx.w = newWriter(fx.st, guard, workers, discardLogger(), func(tr health.Transition) { fx.landed <- tr })
	wctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { fx.w.run(wctx) })
	t.Cleanup(func() { cancel(); wg.Wait() }) // the writer stops with its owner
	return fx
}

func (fx *writerFixture) register(id string) *registryv1.Instance {
	fx.t.Helper()
	st, err := store.New(store.Config{Client: fx.direct})
	if err != nil {
		fx.t.Fatal(err)
	}
	reg, err := st.Register(context.Background(), &registryv1.Instance{Service: "orders", Id: id, Address: "127.0.0.1:1"}, time.Minute)
	if err != nil {
		fx.t.Fatal(err)
	}
	return reg.Instance
}

// transition is the n-th transition of a test, told apart by its reason.
func transition(n int, to registryv1.HealthState) (health.Transition, *registryv1.Health) {
	tr := health.Transition{To: to, At: time.Now(), Reason: fmt.Sprintf("t%d", n)}
	return tr, &registryv1.Health{State: to, Reason: tr.Reason, Observer: "test"}
}

// awaitLanded waits for the writer to report n more writes landed.
func (fx *writerFixture) awaitLanded(n int) []string {
	fx.t.Helper()
	var got []string
	deadline := time.After(60 * time.Second)
	for len(got) < n {
		select {
		case tr := <-fx.landed:
			got = append(got, tr.Reason)
		case <-deadline:
			fx.t.Fatalf("writes landed: %v, want %d", got, n)
		}
	}
	return got
}

// healthHistory reads every version of id's key from etcd's history: the
// reasons of the health each put carried, in order.
func (fx *writerFixture) healthHistory(id string) []string {
	fx.t.Helper()
	key := record.NewKeys("").Instance("orders", id)
	cur, err := fx.direct.Get(context.Background(), key)
	if err != nil || len(cur.Kvs) != 1 {
		fx.t.Fatalf("get %s: %v", key, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	for resp := range fx.direct.Watch(ctx, key, clientv3.WithRev(1)) {
		for _, ev := range resp.Events {
			in, err := record.NewKeys("").Decode(key, ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
			if err != nil {
				fx.t.Fatal(err)
			}
			if r := in.GetHealth().GetReason(); r != "" {
				out = append(out, r)
			}
			if ev.Kv.ModRevision >= cur.Kvs[0].ModRevision {
				return out
			}
		}
	}
	fx.t.Fatalf("history of %s ended early: %v", key, out)
	return nil
}

// awaitBusy waits until the latest transition submitted for id is in
// flight: a write is out and nothing waits behind it. (The write before it
// reports landing before its slot is free, so busy alone may be that one.)
func (fx *writerFixture) awaitBusy(id string) {
	fx.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		fx.w.mu.Lock()
		s := fx.w.slots[cache.Key{Service: "orders", ID: id}]
		busy := s != nil && s.busy && s.pending == nil
		fx.w.mu.Unlock()
		if busy {
			return
		}
		if time.Now().After(deadline) {
			fx.t.Fatalf("no write of %s ever went out", id)
		}
		time.Sleep(time.Millisecond)
	}
}

// While etcd is unreachable (the writer's link paused) transitions keep
// coming and submit never waits: the one in flight lands when the link is
// back, the latest lands after it, and one replaced unwritten never lands
// (nor anything after the latest).
func TestWriterCoalescesBehindSlowEtcd(t *testing.T) {
	fx := newWriterFixture(t, 2)
	in := fx.register("a")
	tr, h := transition(1, registryv1.HealthState_HEALTH_STATE_HEALTHY)
	fx.w.submit(in, tr, h)
	if got := fx.awaitLanded(1); !slices.Equal(got, []string{"t1"}) {
		t.Fatalf("landed %v", got)
	}

	fx.link.Pause()
	tr, h = transition(2, registryv1.HealthState_HEALTH_STATE_DEGRADED)
	fx.w.submit(in, tr, h)
	fx.awaitBusy("a") // t2 is in flight, held in the link
	// Probing goes on: these return with etcd out of reach.
	for n, to := range []registryv1.HealthState{registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, registryv1.HealthState_HEALTH_STATE_DEGRADED,
		registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, registryv1.HealthState_HEALTH_STATE_DEGRADED} {
		tr, h = transition(3+n, to)
		fx.w.submit(in, tr, h)
	}
	if _, coalesced := fx.w.stats(); coalesced != 3 {
		t.Fatalf("%d transitions replaced unwritten, want 3 (t3, t4, t5 by t6)", coalesced)
	}
	fx.link.Resume()
	// t2 lands (or, timed out in the link, is dropped for t6); t6 lands.
	var got []string
	for !slices.Contains(got, "t6") {
		got = append(got, fx.awaitLanded(1)...)
	}
	hist := fx.healthHistory("a")
	if hist[len(hist)-1] != "t6" || slices.ContainsFunc(hist, func(r string) bool { return r == "t3" || r == "t4" || r == "t5" }) {
		t.Fatalf("health written %v: want t6 last and none of t3..t5 (replaced unwritten)", hist)
	}
	if !slices.Equal(hist, []string{"t1", "t2", "t6"}) && !slices.Equal(hist, []string{"t1", "t6"}) {
		t.Fatalf("health written %v: want t1, t2, t6 (or t1, t6) in this order", hist)
	}
}

// A write racing an operator's drain (the record changed after the copy the
// writer holds): retried from the refusal, and the drain is kept.
func TestWriterKeepsRacingDrain(t *testing.T) {
	fx := newWriterFixture(t, 1)
	in := fx.register("a")
	st, err := store.New(store.Config{Client: fx.direct})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.SetLifecycle(context.Background(), "orders", "a", registryv1.Lifecycle_LIFECYCLE_DRAINING, "operator"); err != nil {
		t.Fatal(err)
	}
	tr, h := transition(1, registryv1.HealthState_HEALTH_STATE_HEALTHY)
	fx.w.submit(in, tr, h) // from the copy before the drain
	fx.awaitLanded(1)
	got, _, err := st.Get(context.Background(), "orders", "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || got.LifecycleReason != "operator" || got.GetHealth().GetReason() != "t1" {
		t.Fatalf("stored %v: want the drain kept and the health written", got)
	}
	// The next write, from the record as the view now holds it: still
	// DRAINING.
	tr, h = transition(2, registryv1.HealthState_HEALTH_STATE_DEGRADED)
	fx.w.submit(got, tr, h)
	fx.awaitLanded(1)
	if got, _, _ = st.Get(context.Background(), "orders", "a"); got.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || got.GetHealth().GetReason() != "t2" {
		t.Fatalf("stored %v after the second write", got)
	}
}

// A deposed leader's writer: the fence refuses its write, nothing lands,
// and the writer says it is fenced.
func TestWriterFenced(t *testing.T) {
	fx := newWriterFixture(t, 1)
	in := fx.register("a")
	if _, err := fx.direct.Revoke(context.Background(), fx.lease); err != nil {
		t.Fatal(err)
	}
	head, err := fx.direct.Get(context.Background(), "/none")
	if err != nil {
		t.Fatal(err)
	}
	tr, h := transition(1, registryv1.HealthState_HEALTH_STATE_HEALTHY)
	fx.w.submit(in, tr, h)
	select {
	case <-fx.w.Fenced():
	case tr := <-fx.landed:
		t.Fatalf("a deposed leader's write landed: %v", tr)
	case <-time.After(60 * time.Second):
		t.Fatal("the writer was never fenced")
	}
	now, err := fx.direct.Get(context.Background(), "/none")
	if err != nil {
		t.Fatal(err)
	}
	if now.Header.Revision != head.Header.Revision {
		t.Fatalf("etcd moved from %d to %d: a fenced write landed", head.Header.Revision, now.Header.Revision)
	}
}

// A transition for an instance the view dropped is not written, and its
// slot goes: memory follows the instances followed.
func TestWriterForgets(t *testing.T) {
	fx := newWriterFixture(t, 1)
	a, b := fx.register("a"), fx.register("b")
	fx.link.Pause()
	tr, h := transition(1, registryv1.HealthState_HEALTH_STATE_HEALTHY)
	fx.w.submit(a, tr, h) // in flight, held
	fx.awaitBusy("a")
	tr, h = transition(2, registryv1.HealthState_HEALTH_STATE_HEALTHY)
	fx.w.submit(b, tr, h) // waits: one worker
	fx.w.forget(cache.Key{Service: "orders", ID: "b"})
	fx.w.forget(cache.Key{Service: "orders", ID: "a"}) // while in flight
	fx.link.Resume()
	// a's write was already sent: it may land; b's was not: it never does.
	// Then both slots are gone.
	deadline := time.Now().Add(60 * time.Second)
	for {
		fx.w.mu.Lock()
		n := len(fx.w.slots)
		fx.w.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slots left after forgetting both instances", n)
		}
		time.Sleep(time.Millisecond)
	}
	if hist := fx.healthHistory("b"); len(hist) != 0 {
		t.Fatalf("a forgotten transition landed: %v", hist)
	}
}
