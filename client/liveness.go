package client

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Liveness of a subscription (docs/architecture.md, "Watch protocol"): regnode
// sends a message (events, snapshot chunk or progress) to every subscriber
// at least once per progress interval (1s). A stream that carries nothing
// for the receive deadline belongs to a regnode that is paused, cut off
// from etcd, or behind a half-open connection: the subscription drops it,
// reports itself disconnected, and resumes at once on another regnode.
// gRPC keepalive (see clientKeepalive) would notice a dead transport too,
// but only after 13s and not a regnode that answers pings yet sends
// nothing.

// DefaultReceiveDeadline is how long a subscription waits for a message
// before it gives up on its regnode.
const DefaultReceiveDeadline = 3 * time.Second

// MinReceiveDeadline is the shortest deadline allowed: twice regnode's
// progress interval, so a quiet but healthy regnode is never left.
const MinReceiveDeadline = 2 * time.Second

// stallError says which regnode stalled, so the next stream avoids it
// (regnodePolicy, pick.go).
type stallError struct {
	peer     string
	deadline time.Duration
}

func (e *stallError) Error() string {
	return fmt.Sprintf("%v (%s) from %s", ErrStalled, e.deadline, e.peer)
}

func (e *stallError) Unwrap() error { return ErrStalled }

// receiveDeadline cancels a stream that waits longer than d for a
// message. It runs only while the stream waits in Recv: the time spent
// applying a unit is the subscriber's, not the regnode's (and never
// includes a callback's: those run on their own goroutine, deliver.go).
// When it passes while bytes from the regnode wait unread in the socket
// (unread, see unread.go), the process is late, not the regnode: it looks
// again every recheck instead of calling a stall. (Were those bytes never
// read, gRPC keepalive would still end the connection.)
type receiveDeadline struct {
	d      time.Duration
	unread func() bool // nil: unknown
	cancel context.CancelFunc
	t      *time.Timer
	fired  atomic.Bool

	mu      sync.Mutex
	armed   bool
	armedAt time.Time
}

// recheck is how soon a deadline put off by unread bytes looks again.
const recheck = 100 * time.Millisecond

// newDeadline returns a disarmed deadline that calls cancel when it
// passes; unread (nil: unknown) says whether the regnode's bytes wait
// unread.
func newDeadline(d time.Duration, cancel context.CancelFunc, unread func() bool) *receiveDeadline {
	rd := &receiveDeadline{d: d, unread: unread, cancel: cancel}
	rd.t = time.AfterFunc(time.Hour, rd.expire)
	rd.t.Stop()
	return rd
}

func (rd *receiveDeadline) expire() {
	rd.mu.Lock()
	if !rd.armed {
		rd.mu.Unlock()
		return
	}
	if time.Since(rd.armedAt) < rd.d {
		// Disarmed and armed again while this firing waited for the lock:
		// that arm has set the timer anew.
		rd.mu.Unlock()
		return
	}
	if rd.unread != nil && rd.unread() {
		rd.t.Reset(recheck)
		rd.mu.Unlock()
		return
	}
	rd.armed = false
	rd.fired.Store(true)
	rd.mu.Unlock()
	rd.cancel()
}

// arm starts the wait for the next message.
func (rd *receiveDeadline) arm() {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.armed, rd.armedAt = true, time.Now()
	rd.t.Reset(rd.d)
}

// disarm ends it: a message (or an error) came.
func (rd *receiveDeadline) disarm() {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.armed = false
	rd.t.Stop()
}

// err is the stall error if the deadline ended the stream, else nil.
func (rd *receiveDeadline) err(peer string) error {
	if !rd.fired.Load() {
		return nil
	}
	return &stallError{peer: peer, deadline: rd.d}
}

// setConnected records a change of Connected and queues it for
// OnConnection (deliver.go), under s.mu: in the order the changes were
// recorded, whichever goroutine records them.
func (s *Subscription) setConnected(connected bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := s.mu.fresh.Connected != connected
	s.mu.fresh.Connected = connected
	switch {
	case connected:
		s.mu.lastErr = nil
	case err != nil: // else the stream already recorded why it ended
		s.mu.lastErr = err
	}
	if changed && s.deliver != nil {
		f := s.mu.fresh
		f.Err = s.mu.lastErr
		s.deliver.connection(f)
	}
}

// unhealthy is true when the view is not being confirmed: no stream, or
// none of its messages for longer than the receive deadline (a stall the
// deadline is about to act on).
func (s *Subscription) unhealthy(now time.Time) bool {
	f := s.Freshness()
	return !f.Connected || now.Sub(f.ConfirmedAt) > s.opts.ReceiveDeadline
}
