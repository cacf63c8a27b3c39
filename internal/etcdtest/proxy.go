package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of an address, for cutting, pausing and
// healing one link in a test.
//
// It is written here rather than taken from etcd's pkg/v3/proxy because
// that proxy's Close waits for every copying goroutine to notice on its
// next read: an idle stream (a subscriber between changes) keeps it from
// ever returning, so a link cannot be cut on demand. This one closes the
// connections themselves.
type Proxy struct {
	t    testing.TB
	from string
	to   string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	paused chan struct{} // closed while traffic flows; open while paused
	delay  time.Duration
	wg     sync.WaitGroup
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
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		target = u.Host
	}
	flowing := make(chan struct{})
	close(flowing)
	p := &Proxy{t: t, from: addr, to: target, conns: map[net.Conn]struct{}{}, paused: flowing}
	p.Heal()
	t.Cleanup(p.Cut)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.from }

// URL is the proxy's address as an etcd endpoint.
func (p *Proxy) URL() string { return "http://" + p.from }

// Cut closes the listener and every connection through it: the link is
// down (connections are refused) until Heal. It also ends a Pause.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	p.Resume() // release copies held by Pause so they see their conns closed
	p.wg.Wait()
}

// Heal brings the link back up on the same address.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	ln, err := net.Listen("tcp", p.from)
	if err != nil {
		p.t.Fatalf("proxy listen on %s: %v", p.from, err)
	}
	p.ln = ln
	p.wg.Add(1)
	go p.accept(ln)
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.to)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln { // cut while dialing
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.copy(out, in)
		go p.copy(in, out)
	}
}

func (p *Proxy) copy(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate, delay := p.paused, p.delay
			p.mu.Unlock()
			<-gate // held while paused; Cut closes the conns, not the gate
			if delay > 0 {
				time.Sleep(delay)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, reset or closed by Cut: the link is gone either way
		}
	}
}

// Delay adds d of latency to every chunk of data, both ways (0 removes it).
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Pause holds traffic both ways (the link is up but silent) until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.paused:
		p.paused = make(chan struct{})
	default:
	}
}

// Resume releases paused traffic.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.paused:
	default:
		close(p.paused)
	}
}
