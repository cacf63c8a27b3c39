package client

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A receive deadline that passes while the regnode's bytes wait unread
// in the socket (the process late to read them, not the regnode silent)
// is put off, as often as it passes so; once the socket is empty, it
// ends the stream as a stall. Over a real loopback TCP connection.
func TestDeadlineWaitsForUnreadBytes(t *testing.T) {
	if !canQueryUnread {
		t.Skip("unread bytes are not queried on this platform")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	regnode, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer regnode.Close()

	var table connTable
	key, ok := table.add(conn)
	if !ok {
		t.Fatal("a TCP connection was not recorded")
	}
	streamCtx := peer.NewContext(context.Background(), &peer.Peer{Addr: conn.RemoteAddr(), LocalAddr: conn.LocalAddr()})
	unread := table.unreadOf(streamCtx)
	if unread == nil {
		t.Fatal("no unread query for the stream's connection")
	}
	if unread() {
		t.Fatal("bytes unread before the regnode sent any")
	}
	if _, err := regnode.Write([]byte("progress")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the regnode's bytes in the socket", unread)

	var asked atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rd := newDeadline(10*time.Millisecond, cancel, func() bool { asked.Add(1); return unread() })
	rd.arm()
	waitUntil(t, "five expiries (or a stall)", func() bool { return asked.Load() >= 5 || ctx.Err() != nil })
	if ctx.Err() != nil || rd.err("rn") != nil {
		t.Fatalf("stalled with the regnode's bytes unread (%d expiries)", asked.Load())
	}
	if _, err := io.ReadFull(conn, make([]byte, len("progress"))); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the stall once the socket is read", func() bool { return ctx.Err() != nil })
	if err := rd.err("rn"); !errors.Is(err, ErrStalled) {
		t.Fatalf("the deadline ended the stream with %v, want a stall", err)
	}

	table.remove(key)
	if table.unreadOf(streamCtx) != nil {
		t.Fatal("a removed connection still answers")
	}
}

// Without the query (nil: another platform, a connection of the caller's
// own dialer) the deadline calls the stall when it passes, as before.
func TestDeadlineWithoutQuery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rd := newDeadline(10*time.Millisecond, cancel, nil)
	rd.arm()
	<-ctx.Done()
	if err := rd.err("rn"); !errors.Is(err, ErrStalled) {
		t.Fatalf("got %v, want a stall", err)
	}
	// Disarmed in time, it never fires.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	rd2 := newDeadline(time.Hour, cancel2, nil)
	rd2.arm()
	rd2.disarm()
	rd2.expire() // a firing that raced the disarm
	if ctx2.Err() != nil || rd2.err("rn") != nil {
		t.Fatal("a disarmed deadline fired")
	}
}

// A Client records the socket of each regnode connection under the
// addresses its streams see as their peer, and forgets it when the
// connection closes.
func TestClientTracksItsRegnodeConnections(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := New(Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var p peer.Peer
	if _, err := c.API().Status(context.Background(), &registryv1.StatusRequest{}, grpc.Peer(&p), grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if canQueryUnread && c.conns.unreadOf(peer.NewContext(context.Background(), &p)) == nil {
		t.Fatalf("the connection to %v (from %v) is not recorded", p.Addr, p.LocalAddr)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the closed Client's connections forgotten", func() bool {
		c.conns.mu.Lock()
		defer c.conns.mu.Unlock()
		return len(c.conns.by) == 0
	})
}
