package fanout

import (
	"context"
	"sync"
)

// Sub is one subscriber. Next is called by one goroutine (the stream that
// sends to the subscriber); the hub pushes to it without ever blocking.
//
// A stream that multiplexes several services holds one Sub per service,
// each read by its own goroutine, and sends their units' Chunks: a
// unit's chunks in order and, for one service, one unit after the other
// (its subscriber joins them back with chunk.Joiner, which refuses a
// chunk of another unit inside one).
type Sub struct {
	h      *Hub
	f      *feed
	notify chan struct{} // a unit is queued, a reset is due, or closed
	done   chan struct{}

	// Owned by the goroutine calling Next.
	first    *Unit
	sent     int64  // revision of the last unit returned by Next
	epoch    string // epoch of the last unit returned by Next
	confirms uint64 // the hub's confirmations covered by the last progress sent

	mu struct {
		sync.Mutex
		queue     []*Unit // units from head on are still to send
		head      int
		needReset bool
		newEpoch  bool
		err       error
	}
	closeOnce sync.Once
}

// Service is the service the subscriber follows ("" for all).
func (s *Sub) Service() string { return s.f.service }

// push queues one transaction's unit. Called with s.f.mu held.
func (s *Sub) push(u *Unit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.needReset || s.mu.err != nil {
		return // the reset snapshot will cover it
	}
	if len(s.mu.queue)-s.mu.head >= s.h.cfg.QueueSize {
		s.drop()
		s.mu.needReset = true
		s.h.resetSent("slow-subscriber")
		s.wake()
		return
	}
	s.mu.queue = append(s.mu.queue, u)
	s.wake()
}

// reset discards what is queued and makes the next unit a reset
// snapshot. Called with s.f.mu held.
func (s *Sub) reset(reason string, newEpoch bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.needReset {
		s.h.resetSent(reason)
	}
	s.drop()
	s.mu.needReset = true
	s.mu.newEpoch = s.mu.newEpoch || newEpoch
	s.wake()
}

// drop discards the queue. Called with s.mu held.
func (s *Sub) drop() {
	clear(s.mu.queue)
	s.mu.queue, s.mu.head = nil, 0
}

func (s *Sub) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Sub) close(err error) {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.mu.err = err
		s.mu.Unlock()
		close(s.done)
	})
}

// Next returns the next unit for the subscriber, waiting for one: its
// queued transactions in order, a reset snapshot when one is due, and
// when it has nothing queued, progress at the hub's revision whenever that
// moved past the last unit or etcd confirmed it. The revision of
// successive units never decreases except across a NewEpoch snapshot. The
// unit is shared with other subscribers: send its Chunks, modify nothing.
func (s *Sub) Next(ctx context.Context) (*Unit, error) {
	if u := s.first; u != nil {
		s.first = nil
		return u, nil
	}
	for {
		// The beat before the queue: once a tick is published, every unit
		// up to its revision is queued, so progress at a beat's tick (a
		// tick published earlier) skips nothing.
		b := s.h.beats.load()
		t := b.t
		s.mu.Lock()
		if s.mu.err != nil {
			err := s.mu.err
			s.mu.Unlock()
			return nil, err
		}
		if s.mu.needReset {
			newEpoch := s.mu.newEpoch
			s.mu.needReset, s.mu.newEpoch = false, false
			s.drop()
			s.mu.Unlock()
			// Taken after clearing the flag: every transaction the hub
			// applies from now on is either in this snapshot or queued
			// after it (and skipped below if already in it).
			snap, ep := s.h.current()
			u, err := s.f.snapshot(snap, ep, true, newEpoch)
			if err != nil {
				return nil, err
			}
			s.sent, s.epoch = u.b.Revision, ep
			return u, nil
		}
		for s.mu.head < len(s.mu.queue) {
			u := s.mu.queue[s.mu.head]
			s.mu.queue[s.mu.head] = nil
			s.mu.head++
			if s.mu.head == len(s.mu.queue) {
				// Drained: refill the same array from its start.
				s.mu.queue, s.mu.head = s.mu.queue[:0], 0
			}
			// Skip what the last unit already covered.
			if u.b.Revision <= s.sent {
				continue
			}
			s.mu.Unlock()
			s.sent, s.epoch = u.b.Revision, u.b.Epoch
			return u, nil
		}
		s.mu.Unlock()
		// Nothing queued: progress, when the beat moved on (transactions
		// of other services) or etcd confirmed the view; a progress at
		// the same revision still goes out: it confirms the view.
		if t.epoch == s.epoch && (t.rev > s.sent || t.rev == s.sent && t.confirms > s.confirms) {
			s.sent, s.confirms = t.rev, t.confirms
			return t.progress, nil
		}
		select {
		case <-s.notify:
		case <-s.done:
		case <-b.changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close unregisters the subscriber.
func (s *Sub) Close() {
	s.close(ErrClosed)
	s.h.remove(s)
}
