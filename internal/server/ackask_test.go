package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/server"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A regnode asks for acks instead of taking one per unit: its Subscribe
// stream says so in its header; a WaitApplied sends an AckRequest to each
// follower of the service behind its revision (a follower of every
// service included, another service's not), and a follower that starts
// while a wait is in progress is asked too.
func TestAckRequestsWhileWaiting(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	api := newClient(t, rn.Addr).API()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("alpha", "a-1")}); err != nil {
		t.Fatal(err)
	}
	open := func(name, service string) (registryv1.Registry_SubscribeClient, *muxReader) {
		return openNamed(ctx, t, api, name, service)
	}
	asked := func(service string, rev int64) func(*registryv1.SubscribeResponse) bool {
		return func(m *registryv1.SubscribeResponse) bool {
			return m.Service == service && m.AckRequest != nil && m.AckRequest.Revision >= rev
		}
	}
	one, r1 := open("one", "alpha")
	every, re := open("every", "")
	other, _ := open("other", "beta")
	defer other.CloseSend()
	md, err := one.Header()
	if err != nil {
		t.Fatal(err)
	}
	if v := md.Get(server.AckHeader); len(v) != 1 || v[0] != server.AckRequested {
		t.Fatalf("Subscribe header %s = %q, want %q", server.AckHeader, v, server.AckRequested)
	}
	requests := func() int { return int(testutil.ToFloat64(rn.Node.Metrics().AckRequests)) }
	if n := requests(); n != 0 {
		t.Fatalf("%d ack requests before any wait", n)
	}

	d, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "alpha", Id: "a-1"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *registryv1.WaitAppliedResponse, 1)
	go func() {
		r, _ := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "alpha", Revision: d.Revision, Timeout: durationpb.New(time.Minute)})
		done <- r
	}()
	r1.until(t, "one's ack request", asked("alpha", d.Revision))
	re.until(t, "every's ack request", asked("", d.Revision))
	for _, x := range []struct {
		st      registryv1.Registry_SubscribeClient
		service string
	}{{one, "alpha"}, {every, ""}} {
		if err := x.st.Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Ack{Ack: &registryv1.SubscribeAck{Service: x.service, Revision: d.Revision}}}); err != nil {
			t.Fatal(err)
		}
	}
	if r := <-done; !r.GetDone() || r.Subscribers != 2 {
		t.Fatalf("after both acks: %v", r)
	}
	if n := requests(); n != 2 {
		t.Fatalf("%d ack requests sent, want 2 (one, every; not other, of beta)", n)
	}

	// A follower that starts during a wait is asked as well.
	wctx, stop := context.WithCancel(ctx)
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		_, _ = api.WaitApplied(wctx, &registryv1.WaitAppliedRequest{Service: "alpha", Revision: d.Revision + 1000, Timeout: durationpb.New(time.Minute)})
	}()
	waitFor(t, 30*time.Second, "the second wait's requests", func() bool { return requests() == 4 })
	late, err := api.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.CloseSend()
	if err := late.Send(add("alpha", 0, "")); err != nil {
		t.Fatal(err)
	}
	readMux(late).until(t, "late's ack request", asked("alpha", d.Revision+1000)) // before or after its snapshot
	stop()
	<-waiting
	_ = one.CloseSend()
	_ = every.CloseSend()
}
