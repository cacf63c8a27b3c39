package server_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// rawWatch is a Watch stream on a connection of its own, with HTTP/2
// windows fixed at their 64 KiB minimum (a fixed window turns grpc-go's
// BDP growth off): until the test reads it, the regnode can hand its
// transport only about that much plus its write quota, then its sends
// block, as they do for any client that stops reading.
type rawWatch struct {
	stream registryv1.Registry_WatchClient
	local  string // the client's address, as the regnode sees it
	cancel context.CancelFunc
}

func openRawWatch(t *testing.T, ctx context.Context, addr string, req *registryv1.WatchRequest) *rawWatch {
	t.Helper()
	var (
		mu    sync.Mutex
		local string
	)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
			if err == nil {
				mu.Lock()
				local = c.LocalAddr().String()
				mu.Unlock()
			}
			return c, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	st, err := registryv1.NewRegistryClient(cc).Watch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// The stream is open once its headers came (the regnode subscribed it).
	if _, err := st.Header(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return &rawWatch{stream: st, local: local, cancel: cancel}
}

// until reads the stream until a message at rev or later.
func (w *rawWatch) until(t *testing.T, rev int64) {
	t.Helper()
	for {
		m, err := w.stream.Recv()
		if err != nil {
			t.Fatalf("Watch stream ended before revision %d: %v", rev, err)
		}
		if m.Revision >= rev {
			return
		}
	}
}

// A Watch stream is a live subscriber that cannot acknowledge: WaitApplied
// counts the Watch streams of the service (and of every service) apart
// from the acknowledging ones, each done once the regnode has handed the
// revision to its transport. One whose client does not read (its sends
// block on flow control) holds the wait and is named with its peer
// address; once it reads, a wait in progress ends; a stream that ends
// leaves the count.
func TestWaitAppliedCountsWatchStreams(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	api := newClient(t, rn.Addr).API()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("alpha", "a-1")}); err != nil {
		t.Fatal(err)
	}
	stuck := openRawWatch(t, ctx, rn.Addr, &registryv1.WatchRequest{Service: "alpha", Subscriber: "stuck"})
	live := openRawWatch(t, ctx, rn.Addr, &registryv1.WatchRequest{Service: "alpha", Subscriber: "live"})
	every := openRawWatch(t, ctx, rn.Addr, &registryv1.WatchRequest{})
	openRawWatch(t, ctx, rn.Addr, &registryv1.WatchRequest{Service: "beta"}) // not a subscriber of alpha
	// About 420 KiB of alpha that stuck never reads: far past its window
	// and the regnode's write quota, within the fan-out's queue (1024
	// units), so it is not reset either.
	big := putBig(t, rn.Etcd, rn.Prefix, "alpha", 0, 30)
	waitFor(t, 30*time.Second, "the regnode's view", func() bool { return rn.Node.Hub().Revision() >= big })
	d, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "alpha", Id: "a-1"})
	if err != nil {
		t.Fatal(err)
	}
	live.until(t, d.Revision)
	every.until(t, d.Revision)
	ask := func(timeout time.Duration) *registryv1.WaitAppliedResponse {
		t.Helper()
		resp, err := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "alpha", Revision: d.Revision, Timeout: durationpb.New(timeout)})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// live and every were sent it (they read it); the regnode stores the
	// revision after the send returns, a moment after the client may read.
	waitFor(t, 30*time.Second, "the two Watch streams that read to be counted as sent it", func() bool { return ask(0).WatchPending == 1 })
	resp := ask(500 * time.Millisecond) // ends at its timeout: stuck is behind
	n := resp.Nodes[0]
	if resp.Done || resp.WatchStreams != 3 || resp.WatchPending != 1 || resp.Subscribers != 0 || resp.Pending != 0 ||
		n.WatchStreams != 3 || n.WatchPending != 1 || len(n.WatchLaggards) != 1 || len(n.Laggards) != 0 {
		t.Fatalf("three Watch streams of alpha, one not reading: %v", resp)
	}
	if l := n.WatchLaggards[0]; l.Subscriber != "stuck" || l.Peer != stuck.local || l.Revision >= d.Revision || l.Revision <= 0 {
		t.Fatalf("the laggard is stuck at %s, sent less than revision %d: %v", stuck.local, d.Revision, l)
	}

	// A wait (likely, not surely, in progress: TestWatchSendWakesWaiter
	// is sure) ends once stuck reads and the regnode sends it the drain.
	done := make(chan *registryv1.WaitAppliedResponse, 1)
	go func() {
		r, _ := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "alpha", Revision: d.Revision, Timeout: durationpb.New(time.Minute)})
		done <- r
	}()
	stuck.until(t, d.Revision)
	if r := <-done; !r.GetDone() || r.WatchStreams != 3 || r.WatchPending != 0 {
		t.Fatalf("after stuck read the drain: %v", r)
	}
	// A Watch stream that ends is no longer a live subscriber.
	live.cancel()
	waitFor(t, 30*time.Second, "the ended stream to leave the count", func() bool { return ask(0).WatchStreams == 2 })
}
