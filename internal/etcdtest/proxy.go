package etcdtest

import (
	"fmt"
	"testing"

	"github.com/regcluster/registry/internal/netproxy"
)

// Proxy is a netproxy.Proxy whose failures fail the test and which is cut
// when the test ends.
type Proxy struct {
	*netproxy.Proxy
	t testing.TB
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port or http://host:port).
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	return NewProxyAt(t, fmt.Sprintf("127.0.0.1:%d", FreePort(t)), target)
}

// NewProxyAt is NewProxy listening on addr.
func NewProxyAt(t testing.TB, addr, target string) *Proxy {
	t.Helper()
	p, err := netproxy.New(addr, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Cut)
	return &Proxy{Proxy: p, t: t}
}

// Heal brings the link back up; failing to listen again fails the test.
func (p *Proxy) Heal() {
	p.t.Helper()
	if err := p.Proxy.Heal(); err != nil {
		p.t.Fatal(err)
	}
}
