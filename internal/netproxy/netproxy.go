// Package netproxy is a TCP proxy for fault injection: cut, pause, delay and
// heal one link, on demand.
//
// It is written here rather than taken from etcd's pkg/v3/proxy because
// that proxy's Close waits for every copying goroutine to notice on its
// next read: an idle stream (a subscriber between changes) keeps it from
// ever returning, so a link cannot be cut on demand. This one closes the
// connections themselves.
package netproxy

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"
)

// Proxy is a TCP proxy in front of one address. Its methods are safe for
// concurrent use; Cut stops every goroutine it started.
type Proxy struct {
	from string
	to   string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	paused chan struct{} // closed while traffic flows; open while paused
	delay  time.Duration
	wg     sync.WaitGroup
}

// New listens on addr (host:port; port 0 picks one) and forwards every
// connection to target (host:port or http://host:port).
func New(addr, target string) (*Proxy, error) {
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		target = u.Host
	}
	flowing := make(chan struct{})
	close(flowing)
	p := &Proxy{from: addr, to: target, conns: map[net.Conn]struct{}{}, paused: flowing}
	if err := p.Heal(); err != nil {
		return nil, err
	}
	p.from = p.ln.Addr().String()
	return p, nil
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
func (p *Proxy) Heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.from)
	if err != nil {
		return fmt.Errorf("proxy listen on %s: %w", p.from, err)
	}
	p.ln = ln
	p.wg.Add(1)
	go p.accept(ln)
	return nil
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
