package probe

import (
	"context"
	"net"
	"time"

	"github.com/regcluster/registry/health"
)

// probeTCP connects to address and closes the connection at once. It closes
// with a reset (SO_LINGER 0), as load balancers' TCP checks do, so that a
// prober connecting to thousands of instances every second does not leave
// a socket in TIME_WAIT for each probe.
func (p *Checker) probeTCP(ctx context.Context, address string, timeout time.Duration) (health.Outcome, string) {
	conn, err := p.dialer.DialContext(ctx, "tcp", address)
	if err != nil {
		return failure(ctx, err, timeout)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
	return health.OK, ""
}
