package node

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// selfListener carries this regnode's own calls to its gRPC API (the HTTP
// API's, web.go) in memory when the API serves TLS: they never leave the
// process, so there is nothing to encrypt and no certificate to present
// (with --client-cert-auth the regnode holds no client certificate of the
// trusted CA). Only connections accepted here skip TLS: selfCreds tells
// them by their type, which no network connection has.
type selfListener struct{ *bufconn.Listener }

// selfConn marks a connection accepted by selfListener.
type selfConn struct{ net.Conn }

func newSelfListener() *selfListener { return &selfListener{bufconn.Listen(1 << 20)} }

// Accept marks what it accepts as the regnode's own.
func (l *selfListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &selfConn{c}, nil
}

// dial is the gRPC client's dialer to the listener.
func (l *selfListener) dial(ctx context.Context, _ string) (net.Conn, error) {
	return l.DialContext(ctx)
}

// selfCreds is the API's TLS, except for the regnode's own in-memory
// connections.
type selfCreds struct {
	credentials.TransportCredentials
}

func (c selfCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if _, ok := conn.(*selfConn); ok {
		return insecure.NewCredentials().ServerHandshake(conn)
	}
	return c.TransportCredentials.ServerHandshake(conn)
}

func (c selfCreds) Clone() credentials.TransportCredentials {
	return selfCreds{c.TransportCredentials.Clone()}
}
