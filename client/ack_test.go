package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A Client acknowledges only what its regnode asks for: changes applied
// while no drain waits cost the regnode no ack at all (it was one message
// per subscriber per change), and a wait still completes, the Client
// answering the regnode's request.
func TestAcksOnlyWhenAsked(t *testing.T) {
	if watchPerSubscription {
		t.Skip("about the Subscribe stream")
	}
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	c := newClient(t, rn.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	acks := func() int { return int(testutil.ToFloat64(rn.Node.Metrics().Acks)) }
	last := churn(t, direct, "orders", 30, 7)
	waitFor(t, time.Minute, "the changes in the view", func() bool { return s.Revision() >= last })
	if n := acks(); n != 0 {
		t.Fatalf("the regnode received %d acks for 30 changes with no drain waiting, want 0", n)
	}
	r, err := c.API().WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "orders", Revision: last, Timeout: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Done || r.Subscribers != 1 {
		t.Fatalf("WaitApplied for a revision the Client holds: %v", r)
	}
	asked := acks()
	if asked < 1 {
		t.Fatalf("the wait completed with %d acks", asked)
	}
	// A wait for a revision still to come completes once it is applied.
	done := make(chan *registryv1.WaitAppliedResponse, 1)
	go func() {
		r, _ := c.API().WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "orders", Revision: last + 1, Timeout: durationpb.New(30 * time.Second)})
		done <- r
	}()
	waitFor(t, 30*time.Second, "the wait's request", func() bool {
		return testutil.ToFloat64(rn.Node.Metrics().AckRequests) >= 2
	})
	reg, err := c.API().Register(ctx, &registryv1.RegisterRequest{
		Instance: &registryv1.Instance{Service: "orders", Id: "o-next", Address: "10.0.0.9:80"}, Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if r := <-done; !r.GetDone() {
		t.Fatalf("WaitApplied for %d (the next change at %d): %v", last+1, reg.Revision, r)
	}
	// And once no wait is in progress, changes are not acknowledged again.
	before := acks()
	last = churn(t, direct, "orders", 20, 9)
	waitFor(t, time.Minute, "the later changes in the view", func() bool { return s.Revision() >= last })
	if n := acks(); n != before {
		t.Fatalf("%d acks for 20 changes after the waits ended, want none", n-before)
	}
}
