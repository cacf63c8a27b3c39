package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/server"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// muxReader receives a Subscribe stream on its own goroutine, so a test
// can wait for a message with a deadline.
type muxReader struct {
	msgs chan *registryv1.SubscribeResponse
	errc chan error
}

func readMux(s registryv1.Registry_SubscribeClient) *muxReader {
	r := &muxReader{msgs: make(chan *registryv1.SubscribeResponse, 1024), errc: make(chan error, 1)}
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				r.errc <- err
				close(r.msgs)
				return
			}
			r.msgs <- m
		}
	}()
	return r
}

// until returns messages until one satisfies stop (included).
func (r *muxReader) until(t *testing.T, what string, stop func(*registryv1.SubscribeResponse) bool) []*registryv1.SubscribeResponse {
	t.Helper()
	var got []*registryv1.SubscribeResponse
	deadline := time.After(30 * time.Second)
	for {
		select {
		case m, ok := <-r.msgs:
			if !ok {
				t.Fatalf("stream ended waiting for %s: %v", what, <-r.errc)
			}
			got = append(got, m)
			if stop(m) {
				return got
			}
		case <-deadline:
			t.Fatalf("no %s within 30s; got %d messages", what, len(got))
		}
	}
}

func add(service string, from int64, ep string) *registryv1.SubscribeRequest {
	return &registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Add{Add: &registryv1.SubscribeAdd{Service: service, FromRevision: from, Epoch: ep}}}
}

func wholeSnapshot(service string) func(*registryv1.SubscribeResponse) bool {
	return func(m *registryv1.SubscribeResponse) bool {
		return m.Service == service && m.GetUnit().GetSnapshot() != nil && !m.GetUnit().GetSnapshot().More
	}
}

// One stream carries several services, each with its own resume point;
// a service's failure ends only that service; the stream takes one slot
// of the per-peer stream cap whatever it carries.
func TestSubscribeMultiplexes(t *testing.T) {
	m := etcdtest.Start(t, false)
	limits := peerlimit.DefaultConfig()
	limits.MaxStreams = 1
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Limits: limits}, m.ClientURL)
	api := newClient(t, rn.Addr).API()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, in := range []*registryv1.Instance{inst("alpha", "a-1"), inst("alpha", "a-2"), inst("beta", "b-1")} {
		if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: in}); err != nil {
			t.Fatal(err)
		}
	}
	last := putBig(t, rn.Etcd, rn.Prefix, "bigsvc", 0, 300)
	waitFor(t, 10*time.Second, "the regnode's view", func() bool { return rn.Node.Hub().Revision() >= last })
	ep := rn.Node.Hub().Epoch()

	st, err := api.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := readMux(st)
	for _, req := range []*registryv1.SubscribeRequest{add("alpha", 0, ""), add("beta", 0, ""), add("Not_A_Name", 0, ""),
		add("bigsvc", 0, ""), add("gamma", last+1000, ep)} {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	snaps := map[string]int{}
	var bigChunks int
	var badErr, aheadErr *registryv1.SubscribeError
	r.until(t, "both snapshots, the big one and both errors", func(m *registryv1.SubscribeResponse) bool {
		switch {
		case m.Error != nil && m.Service == "Not_A_Name":
			badErr = m.Error
		case m.Error != nil && m.Service == "gamma":
			aheadErr = m.Error
		case m.Error != nil:
			t.Fatalf("error for %q: %v", m.Service, m.Error)
		case m.GetUnit().GetSnapshot() != nil:
			if m.Service == "bigsvc" {
				bigChunks++
			}
			snaps[m.Service] += len(m.GetUnit().GetSnapshot().Instances)
		}
		return badErr != nil && aheadErr != nil && len(snaps) == 3 && snaps["bigsvc"] == 300
	})
	if snaps["alpha"] != 2 || snaps["beta"] != 1 {
		t.Fatalf("snapshots %v, want alpha 2 and beta 1", snaps)
	}
	if bigChunks < 4 {
		t.Fatalf("300 big instances in %d chunks, want them chunked as Watch chunks them (at least 4)", bigChunks)
	}
	if codes.Code(badErr.Code) != codes.InvalidArgument {
		t.Fatalf("bad service name: %v, want InvalidArgument", badErr)
	}
	if codes.Code(aheadErr.Code) != codes.OutOfRange || aheadErr.Reason != server.ReasonRevisionAhead {
		t.Fatalf("a service ahead of the regnode: %v, want OutOfRange %s", aheadErr, server.ReasonRevisionAhead)
	}
	// The stream holds the peer's only slot: a Watch is refused.
	if w, err := api.Watch(ctx, &registryv1.WatchRequest{}); err == nil {
		if _, err = w.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a Watch next to a Subscribe stream of a peer capped at 1: %v", err)
		}
	}

	// An event of alpha goes to alpha only, tagged so.
	reg, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("alpha", "a-3")})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.until(t, "the alpha event", func(m *registryv1.SubscribeResponse) bool {
		return m.Service == "alpha" && len(m.GetUnit().GetEvents().GetEvents()) > 0
	}) {
		if evs := m.GetUnit().GetEvents().GetEvents(); len(evs) > 0 {
			if m.Service != "alpha" || len(evs) != 1 || evs[0].Instance.Id != "a-3" || m.Unit.Revision != reg.Revision {
				t.Fatalf("event unit for %q: %v", m.Service, m.Unit)
			}
		}
	}

	// Remove beta; delta's snapshot, added after, is the barrier: nothing
	// of beta may follow it.
	if err := st.Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Remove{Remove: &registryv1.SubscribeRemove{Service: "beta"}}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(add("delta", 0, "")); err != nil {
		t.Fatal(err)
	}
	r.until(t, "delta's snapshot", wholeSnapshot("delta"))
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("beta", "b-2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("alpha", "a-4")}); err != nil {
		t.Fatal(err)
	}
	for _, m := range r.until(t, "the second alpha event", func(m *registryv1.SubscribeResponse) bool {
		return m.Service == "alpha" && len(m.GetUnit().GetEvents().GetEvents()) > 0
	}) {
		if m.Service == "beta" {
			t.Fatalf("beta after its removal: %v", m)
		}
	}
	// Re-adding alpha from its last revision resumes it from the ring.
	if err := st.Send(add("alpha", reg.Revision, ep)); err != nil {
		t.Fatal(err)
	}
	got := r.until(t, "alpha resumed", func(m *registryv1.SubscribeResponse) bool {
		return m.Service == "alpha" && m.GetUnit().GetEvents() != nil
	})
	if u := got[len(got)-1].Unit; len(u.GetEvents().Events) != 1 || u.GetEvents().Events[0].Instance.Id != "a-4" {
		t.Fatalf("alpha resumed after %d: %v, want the a-4 event only", reg.Revision, u)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.errc:
		if err.Error() != "EOF" {
			t.Fatalf("stream end after CloseSend: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end after CloseSend")
	}
	waitFor(t, 10*time.Second, "the stream's hub subscriptions to close", func() bool { return rn.Node.Hub().Subscribers() == 0 })
}

// openNamed opens a Subscribe stream as subscriber name, adds service
// from its start, and returns once its whole snapshot came.
func openNamed(ctx context.Context, t *testing.T, api registryv1.RegistryClient, name, service string) (registryv1.Registry_SubscribeClient, *muxReader) {
	t.Helper()
	st, err := api.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := add(service, 0, "")
	req.Subscriber = name
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	r := readMux(st)
	r.until(t, name+"'s snapshot", wholeSnapshot(service))
	return st, r
}

// WaitApplied counts this regnode's live subscribers of the service and
// the revision each acknowledged: it names those behind and ends at its
// timeout; once they ack it is done.
func TestWaitAppliedCountsAcks(t *testing.T) {
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
	one, _ := open("one", "alpha")
	two, _ := open("two", "alpha")
	every, _ := open("every", "")
	other, _ := open("other", "beta") // not a subscriber of alpha
	defer other.CloseSend()

	d, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "alpha", Id: "a-1"})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(timeout time.Duration) *registryv1.WaitAppliedResponse {
		t.Helper()
		resp, err := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "alpha", Revision: d.Revision, Timeout: durationpb.New(timeout)})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := ask(0)
	if resp.Done || resp.Subscribers != 3 || resp.Pending != 3 || len(resp.Nodes) != 1 || len(resp.Nodes[0].Laggards) != 3 ||
		resp.Nodes[0].Laggards[0].Subscriber != "every" || resp.Nodes[0].Node != rn.Node.Name() {
		t.Fatalf("before any ack: %v", resp)
	}
	ack := func(st registryv1.Registry_SubscribeClient, service string, rev int64) {
		t.Helper()
		if err := st.Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Ack{Ack: &registryv1.SubscribeAck{Service: service, Revision: rev}}}); err != nil {
			t.Fatal(err)
		}
	}
	ack(one, "alpha", d.Revision-1) // not yet the drain
	ack(two, "alpha", d.Revision)
	ack(every, "", d.Revision+5)
	waitFor(t, 30*time.Second, "two acks counted", func() bool { return ask(0).Pending == 1 })
	resp = ask(500 * time.Millisecond) // ends at its timeout: one is behind
	if resp.Done || resp.Pending != 1 || resp.Nodes[0].Laggards[0].Subscriber != "one" || resp.Nodes[0].Laggards[0].Revision != d.Revision-1 {
		t.Fatalf("with one behind: %v", resp)
	}
	// A wait in progress ends as soon as the last ack comes.
	done := make(chan *registryv1.WaitAppliedResponse, 1)
	go func() {
		r, _ := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "alpha", Revision: d.Revision, Timeout: durationpb.New(time.Minute)})
		done <- r
	}()
	ack(one, "alpha", d.Revision)
	if r := <-done; !r.GetDone() || r.Subscribers != 3 || r.Pending != 0 {
		t.Fatalf("after every ack: %v", r)
	}
	// A stream that ends is no longer a live subscriber.
	if err := one.CloseSend(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the closed stream to leave the count", func() bool { return ask(0).Subscribers == 2 })

	for _, bad := range []*registryv1.WaitAppliedRequest{{Service: "Bad_Name", Revision: 1}, {Service: "alpha"},
		{Service: "alpha", Revision: 1, Timeout: durationpb.New(-time.Second)}} {
		if _, err := api.WaitApplied(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("WaitApplied(%v): %v, want InvalidArgument", bad, err)
		}
	}
	_ = two.CloseSend()
	_ = every.CloseSend()
}

// WaitApplied through one regnode counts the subscribers of every regnode
// announced: a subscriber behind on another regnode is named with it; a
// regnode that stops leaves the count.
func TestWaitAppliedAsksEveryRegnode(t *testing.T) {
	m := etcdtest.Start(t, false)
	rns := []*regnodetest.Regnode{regnodetest.StartExternal(t, m.ClientURL), regnodetest.StartExternal(t, m.ClientURL),
		regnodetest.StartExternal(t, m.ClientURL)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := newClient(t, rns[0].Addr).API()
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("alpha", "a-1")}); err != nil {
		t.Fatal(err)
	}
	var streams []registryv1.Registry_SubscribeClient
	for i, rn := range rns {
		st, err := newClient(t, rn.Addr).API().Subscribe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		req := add("alpha", 0, "")
		req.Subscriber = fmt.Sprintf("sub-%d", i)
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		readMux(st).until(t, "a snapshot", wholeSnapshot("alpha"))
		streams = append(streams, st)
	}
	d, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "alpha", Id: "a-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range streams[:2] {
		if err := st.Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Ack{Ack: &registryv1.SubscribeAck{Service: "alpha", Revision: d.Revision}}}); err != nil {
			t.Fatal(err)
		}
	}
	ask := func() *registryv1.WaitAppliedResponse {
		t.Helper()
		resp, err := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "alpha", Revision: d.Revision, Timeout: durationpb.New(300 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	waitFor(t, 30*time.Second, "the two acks counted", func() bool { return ask().Pending == 1 })
	resp := ask()
	if resp.Done || len(resp.Nodes) != 3 || resp.Subscribers != 3 {
		t.Fatalf("three regnodes, one subscriber each, one behind: %v", resp)
	}
	for _, n := range resp.Nodes {
		if n.Error != "" {
			t.Fatalf("regnode %s not asked: %s", n.Node, n.Error)
		}
		if n.Pending != 0 && (n.Node != rns[2].Node.Name() || n.Address != rns[2].Addr || n.Laggards[0].Subscriber != "sub-2") {
			t.Fatalf("the one behind is sub-2 on %s (%s): %v", rns[2].Node.Name(), rns[2].Addr, n)
		}
	}
	if err := streams[2].Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Ack{Ack: &registryv1.SubscribeAck{Service: "alpha", Revision: d.Revision}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "every regnode's subscribers done", func() bool { return ask().Done })
	if err := rns[1].Node.Close(); err != nil {
		t.Fatal(err)
	}
	if resp := ask(); len(resp.Nodes) != 2 || !resp.Done {
		t.Fatalf("after a regnode stopped: %v, want the two left, done", resp)
	}
	for _, st := range streams {
		_ = st.CloseSend()
	}
}
