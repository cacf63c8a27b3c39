package server_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/metrics"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/server"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

func fromPeer(ip string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 5000}})
}

// Every write (Register, Deregister, Drain, Undrain) of a key that has
// MaxWritesInFlight running waits its turn in the regnode, and goes
// through once one ends; another key's writes do not wait.
func TestWritesWaitTheirTurn(t *testing.T) {
	m := etcdtest.Start(t, false)
	st, err := store.New(store.Config{Client: m.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := peerlimit.DefaultConfig()
	cfg.MaxWritesInFlight = 1
	lim, err := peerlimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Store: st, Metrics: metrics.New(), Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	const busy = "127.0.0.9"
	ctx := fromPeer(busy)
	reg, err := srv.Register(ctx, &registryv1.RegisterRequest{Instance: inst("turns", "t-1")})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		name string
		call func(context.Context) error
	}{
		{"Register", func(ctx context.Context) error {
			_, err := srv.Register(ctx, &registryv1.RegisterRequest{Instance: inst("turns", "t-2")})
			return err
		}},
		{"Drain", func(ctx context.Context) error {
			_, err := srv.Drain(ctx, &registryv1.DrainRequest{Service: "turns", Id: "t-1", Reason: "test"})
			return err
		}},
		{"Undrain", func(ctx context.Context) error {
			_, err := srv.Undrain(ctx, &registryv1.UndrainRequest{Service: "turns", Id: "t-1"})
			return err
		}},
		{"Deregister", func(ctx context.Context) error {
			_, err := srv.Deregister(ctx, &registryv1.DeregisterRequest{Service: "turns", Id: "t-1", Secret: reg.Secret})
			return err
		}},
	} {
		done, err := lim.EnterWrite(ctx, busy) // the key's one write in flight
		if err != nil {
			t.Fatal(err)
		}
		result := make(chan error, 1)
		go func() { result <- w.call(ctx) }()
		waitFor(t, 30*time.Second, w.name+" to wait its turn", func() bool { return lim.Waiting(busy) == 1 })
		if _, err := srv.Register(fromPeer("127.0.0.10"), &registryv1.RegisterRequest{Instance: inst("turns", "other-"+w.name)}); err != nil {
			t.Fatalf("another key's Register while %s waits: %v", w.name, err)
		}
		select {
		case err := <-result:
			t.Fatalf("%s returned (%v) while its key's write was in flight", w.name, err)
		default:
		}
		done()
		if err := <-result; err != nil {
			t.Fatalf("%s after its turn came: %v", w.name, err)
		}
	}
}
