package server_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/server"
)

// A call carries its HTTP caller's address only when it holds this
// process's key and comes from this host; otherwise the metadata changes
// nothing: a stranger cannot pass for a loopback caller, nor the HTTP
// API's own connection for anyone else.
func TestForwarderJudgesTheHTTPCaller(t *testing.T) {
	f := server.NewForwarder()
	other := server.NewForwarder()
	loop := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}
	remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 9), Port: 5000}
	// self is the API's own non-loopback address, which the HTTP API
	// dials when --listen is one.
	self := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 7400}
	selfPeer := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	// incoming is the server side of a call from p, with the metadata of
	// an outgoing context out.
	incoming := func(p net.Addr, out context.Context) context.Context {
		md, _ := metadata.FromOutgoingContext(out)
		return metadata.NewIncomingContext(peer.NewContext(context.Background(), &peer.Peer{Addr: p, LocalAddr: self}), md)
	}
	seen := func(ctx context.Context) (string, bool) {
		var got context.Context
		_, err := f.Unary()(ctx, nil, &grpc.UnaryServerInfo{}, func(ctx context.Context, _ any) (any, error) { got = ctx; return nil, nil })
		if err != nil {
			t.Fatal(err)
		}
		return peerlimit.Peer(got), peerlimit.Loopback(got)
	}
	bg := context.Background()
	for _, c := range []struct {
		name     string
		ctx      context.Context
		peer     string
		loopback bool
	}{
		{"the HTTP API for a remote caller", incoming(loop, f.Outgoing(bg, "192.0.2.7:41000")), "192.0.2.7", false},
		{"the HTTP API for a loopback caller", incoming(loop, f.Outgoing(bg, "127.0.0.1:41000")), "127.0.0.1", true},
		{"the HTTP API for a caller that does not parse", incoming(loop, f.Outgoing(bg, "nonsense")), "nonsense", false},
		{"the HTTP API in memory (TLS on)", incoming(bufAddr{}, f.Outgoing(bg, "192.0.2.7:41000")), "192.0.2.7", false},
		{"the HTTP API over this host's own address", incoming(selfPeer, f.Outgoing(bg, "192.0.2.7:41000")), "192.0.2.7", false},
		{"a remote client with the right key", incoming(remote, f.Outgoing(bg, "127.0.0.1:1")), "192.0.2.9", false},
		{"a remote client with another key", incoming(remote, other.Outgoing(bg, "127.0.0.1:1")), "192.0.2.9", false},
		{"a local client with another key", incoming(loop, other.Outgoing(bg, "192.0.2.7:1")), "127.0.0.1", true},
		{"a remote client with the address alone", incoming(remote, metadata.AppendToOutgoingContext(bg, server.ForwardedForMD, "127.0.0.1:1")), "192.0.2.9", false},
		{"a remote client, no metadata", incoming(remote, bg), "192.0.2.9", false},
	} {
		p, lb := seen(c.ctx)
		if p != c.peer || lb != c.loopback {
			t.Errorf("%s: peer %s loopback %v, want %s %v", c.name, p, lb, c.peer, c.loopback)
		}
	}
}

type bufAddr struct{}

func (bufAddr) Network() string { return "bufconn" }
func (bufAddr) String() string  { return "bufconn" }
