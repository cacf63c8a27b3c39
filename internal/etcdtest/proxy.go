package etcdtest

import (
	"fmt"
	"net/url"
	"sync"
	"testing"

	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// Proxy is a TCP proxy (etcd's pkg/v3/proxy) in front of an address, for
// cutting, pausing and healing one link in a test.
type Proxy struct {
	t        testing.TB
	from, to url.URL
	mu       sync.Mutex
	srv      proxy.Server
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port or http://host:port). It closes when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	return NewProxyAt(t, fmt.Sprintf("127.0.0.1:%d", FreePort(t)), target)
}

// NewProxyAt is NewProxy listening on addr.
func NewProxyAt(t testing.TB, addr, target string) *Proxy {
	t.Helper()
	to, err := url.Parse(target)
	if err != nil || to.Host == "" {
		to = &url.URL{Scheme: "tcp", Host: target}
	}
	to.Scheme = "tcp"
	p := &Proxy{t: t, from: url.URL{Scheme: "tcp", Host: addr}, to: *to}
	p.Heal()
	t.Cleanup(func() { p.Cut() })
	return p
}

// Addr is the proxy's host:port; URL is http://Addr.
func (p *Proxy) Addr() string { return p.from.Host }

// URL is the proxy's address as an etcd endpoint.
func (p *Proxy) URL() string { return "http://" + p.from.Host }

// Cut closes the listener and every connection through it: the link is
// down (connections are refused) until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		p.srv.Close()
		<-p.srv.Done()
		p.srv = nil
	}
}

// Heal brings the link back up on the same address.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		return
	}
	p.srv = proxy.NewServer(proxy.ServerConfig{From: p.from, To: p.to, Logger: zap.NewNop()})
	select {
	case <-p.srv.Ready():
	case err := <-p.srv.Error():
		p.t.Fatalf("proxy %s -> %s: %v", p.from.Host, p.to.Host, err)
	}
}

// Pause holds traffic both ways (the link is up but silent) until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.srv.PauseTx()
	p.srv.PauseRx()
}

// Resume releases paused traffic.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.srv.UnpauseTx()
	p.srv.UnpauseRx()
}
