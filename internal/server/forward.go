package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"net"
	"net/netip"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Metadata of a call the regnode's own HTTP API makes for an HTTP caller:
// the caller's address, and the key that proves the call is the HTTP
// API's.
const (
	ForwardedForMD = "x-regnode-forwarded-for"
	ForwardKeyMD   = "x-regnode-forward-key"
)

// Forwarder lets the regnode's own HTTP API, which calls the gRPC API over
// a loopback (or in-memory) connection, have each call judged as its HTTP
// caller's: by the caller's address for the operator rule
// (LoopbackOperator), the per-peer limits and the audit line, not by the
// HTTP API's own loopback address.
//
// It cannot be forged: the key is 256 random bits made when the process
// starts, known only to this process's HTTP API, and the forwarded
// address is taken only from a connection of this host (a loopback peer
// or the in-memory listener); a call without the key, with another, or
// from elsewhere keeps its own peer, and the metadata gains it nothing.
// Tokens are not touched: the HTTP API forwards the caller's
// Authorization header as the call's own.
type Forwarder struct {
	key string
}

// NewForwarder returns a Forwarder with a fresh random key.
func NewForwarder() *Forwarder {
	return &Forwarder{key: rand.Text() + rand.Text()}
}

// Outgoing is ctx carrying the HTTP caller's address (an http.Request's
// RemoteAddr) to the gRPC call made with it.
func (f *Forwarder) Outgoing(ctx context.Context, remoteAddr string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, ForwardedForMD, remoteAddr, ForwardKeyMD, f.key)
}

// caller is ctx with its peer replaced by the forwarded HTTP caller when
// the call is the HTTP API's, else ctx itself.
func (f *Forwarder) caller(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	keys, addrs := md.Get(ForwardKeyMD), md.Get(ForwardedForMD)
	if len(keys) != 1 || len(addrs) != 1 || subtle.ConstantTimeCompare([]byte(keys[0]), []byte(f.key)) != 1 {
		return ctx
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil || !ownHost(p.Addr, p.LocalAddr) {
		return ctx
	}
	fp := *p
	fp.Addr = forwardedAddr(addrs[0])
	return peer.NewContext(ctx, &fp)
}

// ownHost reports whether a connection from remote to local is from this
// host: the regnode's in-memory listener (its HTTP API's way in when the
// API serves TLS), a loopback TCP peer, or a TCP peer of the very address
// it reached (the HTTP API dialing a --listen of this host's own
// non-loopback address).
func ownHost(remote, local net.Addr) bool {
	switch remote.Network() {
	case "bufconn":
		return true
	case "tcp", "tcp4", "tcp6":
		r, err := netip.ParseAddrPort(remote.String())
		if err != nil {
			return false
		}
		if r.Addr().IsLoopback() {
			return true
		}
		if local == nil {
			return false
		}
		l, err := netip.ParseAddrPort(local.String())
		return err == nil && l.Addr().Unmap() == r.Addr().Unmap()
	}
	return false
}

// forwardedAddr is the forwarded host:port as a TCP address; one that
// does not parse is kept as text, which no rule takes for loopback.
func forwardedAddr(s string) net.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	return textAddr(s)
}

type textAddr string

func (a textAddr) Network() string { return "forwarded" }
func (a textAddr) String() string  { return string(a) }

// Unary replaces a unary call's peer by its forwarded HTTP caller (see
// Forwarder). It must come first among the interceptors, before the
// token check and the limits.
func (f *Forwarder) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(f.caller(ctx), req)
	}
}

// Stream is Unary for streams (the HTTP API's KeepAlive and Watch).
func (f *Forwarder) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := f.caller(ss.Context())
		if ctx == ss.Context() {
			return handler(srv, ss)
		}
		return handler(srv, &callerStream{ServerStream: ss, ctx: ctx})
	}
}

type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *callerStream) Context() context.Context { return s.ctx }
