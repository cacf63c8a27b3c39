package peerlimit_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"

	"google.golang.org/grpc/peer"

	"github.com/regcluster/registry/internal/peerlimit"
)

func TestConfigValidate(t *testing.T) {
	if err := peerlimit.DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, bad := range []func(*peerlimit.Config){
		func(c *peerlimit.Config) { c.WriteRate = 0 },
		func(c *peerlimit.Config) { c.WriteBurst = 0 },
		func(c *peerlimit.Config) { c.KeepAliveRate = -1 },
		func(c *peerlimit.Config) { c.KeepAliveBurst = 0 },
		func(c *peerlimit.Config) { c.MaxStreams = 0 },
		func(c *peerlimit.Config) { c.MaxRegistrations = 0 },
		func(c *peerlimit.Config) { c.MaxWritesInFlight = 0 },
	} {
		c := peerlimit.DefaultConfig()
		bad(&c)
		if c.Validate() == nil {
			t.Errorf("%+v validates", c)
		}
		if _, err := peerlimit.New(c); err == nil {
			t.Errorf("New(%+v) succeeds", c)
		}
	}
}

// One peer's flood is refused past its burst, with a retry hint and the
// limit's name; another peer's bucket is its own.
func TestWritesPerPeer(t *testing.T) {
	l, err := peerlimit.New(peerlimit.Config{WriteRate: 0.001, WriteBurst: 3, KeepAliveRate: 1, KeepAliveBurst: 1, MaxStreams: 1, MaxRegistrations: 1, MaxWritesInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := l.Write("10.0.0.1"); err != nil {
			t.Fatalf("write %d within the burst: %v", i, err)
		}
	}
	for range 5 {
		err := l.Write("10.0.0.1")
		var le *peerlimit.Error
		if !errors.As(err, &le) || !errors.Is(err, peerlimit.ErrLimited) || le.Limit != peerlimit.WriteRate || le.RetryAfter <= 0 || le.Peer != "10.0.0.1" {
			t.Fatalf("write past the burst: %v", err)
		}
	}
	if err := l.Write("10.0.0.2"); err != nil {
		t.Fatalf("another peer is limited by the first one's flood: %v", err)
	}
	// Renewals are a bucket of their own.
	if err := l.KeepAlive("10.0.0.1"); err != nil {
		t.Fatalf("renewal after writes ran out: %v", err)
	}
	var le *peerlimit.Error
	if err := l.KeepAlive("10.0.0.1"); !errors.As(err, &le) || le.Limit != peerlimit.KeepAliveRate {
		t.Fatalf("renewal past its burst: %v", err)
	}
}

func TestStreamsPerPeer(t *testing.T) {
	l, err := peerlimit.New(peerlimit.Config{WriteRate: 1, WriteBurst: 1, KeepAliveRate: 1, KeepAliveBurst: 1, MaxStreams: 2, MaxRegistrations: 1, MaxWritesInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	r1, err := l.OpenStream("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.OpenStream("a"); err != nil {
		t.Fatal(err)
	}
	var le *peerlimit.Error
	if _, err := l.OpenStream("a"); !errors.As(err, &le) || le.Limit != peerlimit.Streams {
		t.Fatalf("third stream of a capped peer: %v", err)
	}
	if _, err := l.OpenStream("b"); err != nil {
		t.Fatalf("another peer's stream: %v", err)
	}
	r1()
	r1() // idempotent: frees one slot, not two
	if _, err := l.OpenStream("a"); err != nil {
		t.Fatalf("stream after one closed: %v", err)
	}
	if _, err := l.OpenStream("a"); err == nil {
		t.Fatal("a repeated release freed a second slot")
	}
}

func TestUnlimited(t *testing.T) {
	l, err := peerlimit.New(peerlimit.Unlimited())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		if err := l.Write("a"); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if _, err := l.OpenStream("a"); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if _, err := l.Reserve("a", peerlimit.Instance{Service: "s", ID: strconv.Itoa(i)}); err != nil {
			t.Fatalf("registration %d: %v", i, err)
		}
	}
}

func TestPeerAndLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr     net.Addr
		peer     string
		loopback bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 5000}, "127.0.0.1", true},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 6000}, "127.0.0.1", true}, // every port one peer
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 5000}, "::1", true},
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5000}, "10.1.2.3", false},
		{&net.UnixAddr{Name: "/run/regnode.sock", Net: "unix"}, "/run/regnode.sock", true},
	} {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tc.addr})
		if got := peerlimit.Peer(ctx); got != tc.peer {
			t.Errorf("Peer(%v) = %q, want %q", tc.addr, got, tc.peer)
		}
		if got := peerlimit.Loopback(ctx); got != tc.loopback {
			t.Errorf("Loopback(%v) = %v", tc.addr, got)
		}
	}
	if peerlimit.Loopback(context.Background()) || peerlimit.Peer(context.Background()) != "unknown" {
		t.Error("a call without a peer is loopback or has a peer")
	}
}
