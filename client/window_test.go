package client_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
)

// frameCounter counts the HTTP/2 frames of one direction of a connection
// as its bytes pass: by type, and PINGs that are not acknowledgements.
type frameCounter struct {
	skip   int // bytes of the current frame's payload (or the preface) left
	head   []byte
	data   atomic.Int64 // DATA frames
	pings  atomic.Int64 // PING frames without the ACK flag
	frames atomic.Int64
}

func (fc *frameCounter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if fc.skip > 0 {
			k := min(fc.skip, len(p))
			fc.skip -= k
			p = p[k:]
			continue
		}
		k := min(9-len(fc.head), len(p))
		fc.head = append(fc.head, p[:k]...)
		p = p[k:]
		if len(fc.head) < 9 {
			continue
		}
		length := int(binary.BigEndian.Uint32(append([]byte{0}, fc.head[:3]...)))
		typ, flags := fc.head[3], fc.head[4]
		fc.frames.Add(1)
		switch {
		case typ == 0x0:
			fc.data.Add(1)
		case typ == 0x6 && flags&0x1 == 0:
			fc.pings.Add(1)
		}
		fc.head, fc.skip = fc.head[:0], length
	}
	return n, nil
}

// countingProxy forwards one loopback port to addr and counts the frames
// of every connection: up, the client's (after its 24-byte preface), and
// down, the regnode's.
type countingProxy struct {
	ln       net.Listener
	up, down frameCounter
	mu       sync.Mutex
	conns    []net.Conn
	wg       sync.WaitGroup
}

func countFrames(t *testing.T, addr string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln}
	p.up.skip = len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// One connection: a Client of one regnode holds one, and the
		// counters follow one byte stream each way.
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", addr)
		if err != nil {
			c.Close()
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(up, io.TeeReader(c, &p.up)); up.Close() }()
		go func() { defer p.wg.Done(); io.Copy(c, io.TeeReader(up, &p.down)); c.Close() }()
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// A subscription's messages do not each cost a PING. With grpc-go's
// dynamic flow control the client answers the first DATA frame after each
// acknowledged ping with a new PING (its bandwidth-delay estimate): on a
// stream of small messages apart, one PING and its ack per message. The
// Client's regnode connection has static windows: twenty changes and the
// progress between them bring no PING at all (at most one is allowed, a
// keepalive, which a connection busy every second never sends).
func TestSubscriptionSendsNoPingPerMessage(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}}, m.ClientURL)
	p := countFrames(t, rn.Addr)
	c := newClient(t, p.ln.Addr().String())
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	if err := sub.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	data0 := p.down.data.Load()
	for i := range 20 {
		rev := put(t, direct, "orders", "a", fmt.Sprint("v", i))
		waitFor(t, time.Minute, "the change in the view", func() bool { return sub.Revision() >= rev })
	}
	data, pings := p.down.data.Load()-data0, p.up.pings.Load()
	if data < 20 {
		t.Fatalf("%d DATA frames from the regnode for 20 changes seen: the counter is broken", data)
	}
	if pings > 1 {
		t.Fatalf("the client sent %d PINGs for %d DATA frames from the regnode: a bandwidth-delay estimate per message", pings, data)
	}
	t.Logf("%d DATA frames down, %d PINGs up, %d frames up", data, pings, p.up.frames.Load())
}
