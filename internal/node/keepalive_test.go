package node_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A subscriber whose link goes silent (a vanished machine, a half-open
// connection) and that sends no keepalive of its own is dropped by
// regnode's keepalive: its Watch stream ends and the fan-out forgets it,
// instead of holding its queue for good.
func TestKeepaliveDropsASilentSubscriber(t *testing.T) {
	t.Parallel()
	rn := regnodetest.Start(t)
	px := etcdtest.NewProxy(t, rn.Addr)
	cc, err := grpc.NewClient(px.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials())) // no client keepalive
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// The stream lives until the test ends: only regnode may end it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws, err := registryv1.NewRegistryClient(cc).Watch(ctx, &registryv1.WatchRequest{Service: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Recv(); err != nil {
		t.Fatal(err)
	}
	if n := rn.Node.Hub().Subscribers(); n != 1 {
		t.Fatalf("%d subscribers, want the stream's", n)
	}
	px.Pause()
	defer px.Resume()
	wait, stop := context.WithTimeout(context.Background(), 40*time.Second) // keepalive: 10s + 5s
	defer stop()
	for rn.Node.Hub().Subscribers() != 0 {
		if wait.Err() != nil {
			t.Fatal("regnode still holds the silent subscriber")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
