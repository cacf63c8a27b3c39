package client

import (
	"context"
	"net"
	"sync"
	"syscall"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// A receive deadline measures the regnode's silence, but it is the
// Client's own process that notices it. A process starved of CPU (a
// loaded host, a GC pause, thousands of Clients in one process) may run
// an expired timer before it has read what its sockets hold, so a stream
// whose regnode did speak can look silent: at 10,000 subscribers on two cores, tens of
// thousands of such stalls a minute moved every subscriber from regnode
// to regnode, each move adding load. So before a stall is called, the
// socket is asked whether bytes from the regnode wait in it unread; if so
// the regnode has not gone quiet, and the deadline looks again shortly.
// A regnode paused, cut off or behind a half-open connection sends
// nothing: its socket is empty and the stall is called as before.

// connTable holds the raw connections of a Client's regnode links, by
// their local and remote address, while they are open.
type connTable struct {
	mu sync.Mutex
	by map[connKey]syscall.RawConn
}

type connKey struct{ local, remote string }

func keyOf(local, remote net.Addr) connKey {
	var k connKey
	if local != nil {
		k.local = local.String()
	}
	if remote != nil {
		k.remote = remote.String()
	}
	return k
}

// add records raw (if it is a socket) and returns the key to remove it by.
func (t *connTable) add(raw net.Conn) (connKey, bool) {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return connKey{}, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return connKey{}, false
	}
	k := keyOf(raw.LocalAddr(), raw.RemoteAddr())
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = map[connKey]syscall.RawConn{}
	}
	t.by[k] = rc
	return k, true
}

func (t *connTable) remove(k connKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.by, k)
}

// unreadOf returns a function that says whether bytes wait unread on the
// connection a stream runs on (ctx: the stream's context, which carries
// its peer). It returns nil when that cannot be known: not a socket this
// table holds (a platform without the query records none).
func (t *connTable) unreadOf(ctx context.Context) func() bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	k := keyOf(p.LocalAddr, p.Addr)
	t.mu.Lock()
	rc := t.by[k]
	t.mu.Unlock()
	if rc == nil {
		return nil
	}
	return func() bool {
		n, err := unreadBytes(rc)
		return err == nil && n > 0
	}
}

// trackingCreds wraps a Client's transport credentials to record each
// regnode connection's raw socket in a connTable, after the proxy (if
// any) and before TLS, and to forget it when the connection closes.
type trackingCreds struct {
	credentials.TransportCredentials
	t *connTable
}

func (c trackingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	k, ok := c.t.add(raw)
	if !ok {
		return conn, info, nil
	}
	tc := &trackedConn{Conn: conn, forget: func() { c.t.remove(k) }}
	if sc, ok := conn.(syscall.Conn); ok {
		// grpc-go reads a connection that is a syscall.Conn only when it
		// is readable (its buffer-saving reader): keep that.
		return &trackedSyscallConn{trackedConn: tc, sc: sc}, info, nil
	}
	return tc, info, nil
}

func (c trackingCreds) Clone() credentials.TransportCredentials {
	return trackingCreds{TransportCredentials: c.TransportCredentials.Clone(), t: c.t}
}

// trackedConn is a regnode connection that leaves the table on Close.
type trackedConn struct {
	net.Conn
	once   sync.Once
	forget func()
}

func (c *trackedConn) Close() error {
	c.once.Do(c.forget)
	return c.Conn.Close()
}

type trackedSyscallConn struct {
	*trackedConn
	sc syscall.Conn
}

func (c *trackedSyscallConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }
