package probe

import (
	"context"
	"net"
	"time"

	"github.com/regcluster/registry/health"
)

// probeTCP connects to address and closes the connection at once.
//
// It closes with a reset (SO_LINGER 0), as load balancers' TCP checks do.
// A normal close (FIN) by the side that closes first leaves that side's
// socket in TIME_WAIT for a minute (Linux's 2×MSL): a prober opening
// thousands of connections a second would pile up tens of thousands of
// TIME_WAIT sockets, each holding a local port, until connects to a busy
// target fail for want of ports (Kubernetes #89898, kubelet's TCP probes).
// A reset leaves no TIME_WAIT on either side, and the target, which only
// accepted, loses nothing: the probe never sent data it must receive.
func (p *Checker) probeTCP(ctx context.Context, address string, timeout time.Duration) (health.Outcome, string) {
	conn, err := p.dialer.DialContext(ctx, "tcp", address)
	if err != nil {
		return failure(ctx, err, timeout)
	}
	if tc, ok := conn.(*net.TCPConn); ok && !p.noLinger {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
	return health.OK, ""
}
