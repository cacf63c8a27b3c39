package client_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Every Subscription of a Client rides its one Subscribe stream: two of
// one service and one of another cost the regnode two fan-out
// subscriptions, not three streams; the two of one service share the
// decoded instances; a late one starts from the stream's view at once;
// they acknowledge what they applied.
func TestOneStreamPerClient(t *testing.T) {
	if watchPerSubscription {
		t.Skip("about the Subscribe stream")
	}
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	churn(t, direct, "orders", 10, 1)
	last := churn(t, direct, "users", 5, 2)
	c := newClient(t, rn.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var subs []*client.Subscription
	for _, svc := range []string{"orders", "orders", "users"} {
		s, err := c.Subscribe(ctx, svc, client.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	waitFor(t, time.Minute, "every view", func() bool {
		return subs[0].Revision() >= last && subs[1].Revision() >= last && subs[2].Revision() >= last
	})
	if n := rn.Node.Hub().Subscribers(); n != 2 {
		t.Fatalf("the regnode serves %d fan-out subscriptions, want 2 (orders and users on one stream)", n)
	}
	a, b := subs[0].Instances("orders"), subs[1].Instances("orders")
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("views of orders: %d and %d instances", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("instance %s decoded twice: each Subscription of a service must share the stream's", a[i].Id)
		}
	}
	// A change reaches both, and both acknowledge it (the regnode counts
	// this Client once per service).
	rev := churn(t, direct, "orders", 1, 3)
	waitFor(t, time.Minute, "the change in both views", func() bool { return subs[0].Revision() >= rev && subs[1].Revision() >= rev })
	api := c.API()
	waitFor(t, time.Minute, "the Client's ack", func() bool {
		r, err := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "orders", Revision: rev, Timeout: durationpb.New(0)})
		if err != nil {
			t.Fatal(err)
		}
		if r.Subscribers != 1 {
			t.Fatalf("the regnode counts %d subscribers of orders, want this Client once", r.Subscribers)
		}
		return r.Done
	})
	// Closing one of the two leaves the service followed; closing the
	// other removes it from the stream.
	subs[0].Close()
	rev = churn(t, direct, "orders", 1, 4)
	waitFor(t, time.Minute, "the change in the one left", func() bool { return subs[1].Revision() >= rev })
	subs[1].Close()
	waitFor(t, time.Minute, "orders off the stream", func() bool { return rn.Node.Hub().Subscribers() == 1 })
	// A late Subscription of users is ready from the stream's view.
	late, err := c.Subscribe(ctx, "users", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	select {
	case <-late.Ready():
	default:
		t.Fatal("a Subscription of a service already on the stream is not ready at once")
	}
	if got, want := len(late.Instances("users")), len(subs[2].Instances("users")); got != want || got == 0 {
		t.Fatalf("late view holds %d instances, the stream's %d", got, want)
	}
	if n := rn.Node.Hub().Subscribers(); n != 1 {
		t.Fatalf("the regnode serves %d fan-out subscriptions, want users once", n)
	}
}

// The regnode of the stream goes away: every service moves to another
// regnode, each from its own resume point (a replay, no reset), and the
// views never go back.
func TestStreamMovesEveryService(t *testing.T) {
	if watchPerSubscription {
		t.Skip("about the Subscribe stream")
	}
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	a := regnodetest.StartExternal(t, m.ClientURL)
	b := regnodetest.StartExternal(t, m.ClientURL)
	toA := etcdtest.NewProxy(t, a.Addr)
	toB := etcdtest.NewProxy(t, b.Addr)
	toB.Cut() // the stream starts on A
	churn(t, direct, "orders", 10, 1)
	churn(t, direct, "users", 10, 2)
	c := newClient(t, toA.Addr(), toB.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs := map[string]*recorder{}
	subs := map[string]*client.Subscription{}
	for _, svc := range []string{"orders", "users"} {
		recs[svc] = &recorder{}
		s, err := c.Subscribe(ctx, svc, client.SubscribeOptions{OnChange: recs[svc].on})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		subs[svc] = s
		waitFor(t, time.Minute, svc+"'s first view", func() bool { return equalsEtcd(t, direct, s, svc) })
	}
	if a.Node.Hub().Subscribers() != 2 {
		t.Fatalf("A serves %d subscriptions, want both services", a.Node.Hub().Subscribers())
	}
	toA.Cut()
	toB.Heal()
	churn(t, direct, "orders", 10, 3)
	churn(t, direct, "users", 10, 4)
	for svc, s := range subs {
		waitFor(t, time.Minute, svc+" on B", func() bool { return equalsEtcd(t, direct, s, svc) })
		recs[svc].assertMonotonic(t)
		recs[svc].mu.Lock()
		snaps := recs[svc].snaps
		recs[svc].mu.Unlock()
		if st := s.Stats(); st.Resets != 0 || st.Reconnects == 0 || snaps != 1 {
			t.Fatalf("%s moved with %d resets, %d snapshots after the first and %d reconnects, want a replay from its resume point", svc, st.Resets, snaps-1, st.Reconnects)
		}
	}
	if b.Node.Hub().Subscribers() != 2 {
		t.Fatalf("B serves %d subscriptions, want both services", b.Node.Hub().Subscribers())
	}
}

// Registration.Close waits, within its drain grace, until every live
// subscriber applied the drain: a subscriber that does not acknowledge it
// holds the delete back (while the regnode keeps confirming its view), and
// its acknowledgement lets Close delete at once.
func TestCloseWaitsForSubscribersToApplyTheDrain(t *testing.T) {
	if watchPerSubscription {
		t.Skip("about the Subscribe stream")
	}
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	acking, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer acking.Close()
	reg, err := c.Register(ctx, &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"},
		client.RegisterOptions{DrainGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// A subscriber that acknowledges only when the test says so.
	st, err := c.API().Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&registryv1.SubscribeRequest{Subscriber: "manual", Kind: &registryv1.SubscribeRequest_Add{Add: &registryv1.SubscribeAdd{Service: "orders"}}}); err != nil {
		t.Fatal(err)
	}
	for seen := false; !seen; { // o-1 in its view: in the snapshot, or after it (the hub follows etcd a moment behind)
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		seen = len(m.GetUnit().GetSnapshot().GetInstances()) == 1 || len(m.GetUnit().GetEvents().GetEvents()) == 1
	}
	closed := make(chan error, 1)
	go func() { closed <- reg.Close(ctx) }()
	var drainRev int64
	progress := 0
	for progress < 3 { // three heartbeats after the drain: the delete is held back
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		u := m.GetUnit()
		for _, e := range u.GetEvents().GetEvents() {
			switch {
			case e.Type == registryv1.Event_TYPE_DELETE:
				t.Fatal("deleted before the subscriber acknowledged the drain")
			case e.Instance.GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_DRAINING:
				drainRev = u.Revision
			}
		}
		if drainRev != 0 && u.GetProgress() != nil {
			progress++
		}
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before every subscriber applied the drain", err)
	default:
	}
	if err := st.Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Ack{Ack: &registryv1.SubscribeAck{Service: "orders", Revision: drainRev}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if evs := m.GetUnit().GetEvents().GetEvents(); len(evs) == 1 && evs[0].Type == registryv1.Event_TYPE_DELETE {
			break
		}
	}
	_ = st.CloseSend()
}
