package fanout

import (
	"context"
	"sync"

	"github.com/regcluster/registry/cache"
)

// Sub is one subscriber. Next is called by one goroutine (the stream that
// sends to the subscriber); the hub pushes to it without ever blocking.
type Sub struct {
	h       *Hub
	service string
	notify  chan struct{} // a message is queued, a reset is due, or closed
	done    chan struct{}
	first   *Message
	sent    int64 // revision of the last message returned by Next

	mu struct {
		sync.Mutex
		queue     []Message
		needReset bool
		newEpoch  bool
		err       error
	}
	closeOnce sync.Once
}

// push queues one transaction (or progress, when evs is empty). Called
// with h.mu held.
func (s *Sub) push(rev int64, epoch string, evs []cache.Event) {
	evs = filter(s.service, evs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.needReset || s.mu.err != nil {
		return // the reset snapshot will cover it
	}
	q := s.mu.queue
	if len(evs) == 0 && len(q) > 0 && len(q[len(q)-1].Events) == 0 {
		q[len(q)-1].Revision = rev // coalesce progress
		return
	}
	if len(q) >= s.h.cfg.QueueSize {
		s.mu.queue, s.mu.needReset = nil, true
		s.h.resetSent("slow-subscriber")
		s.wake()
		return
	}
	s.mu.queue = append(q, Message{Revision: rev, Epoch: epoch, Events: evs})
	s.wake()
}

// reset discards what is queued and makes the next message a reset
// snapshot. Called with h.mu held.
func (s *Sub) reset(reason string, newEpoch bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.needReset {
		s.h.resetSent(reason)
	}
	s.mu.queue, s.mu.needReset = nil, true
	s.mu.newEpoch = s.mu.newEpoch || newEpoch
	s.wake()
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

// Next returns the next message for the subscriber, waiting for one. The
// revision of successive messages never decreases except across a
// NewEpoch snapshot.
func (s *Sub) Next(ctx context.Context) (Message, error) {
	if m := s.first; m != nil {
		s.first = nil
		return *m, nil
	}
	for {
		s.mu.Lock()
		if s.mu.err != nil {
			err := s.mu.err
			s.mu.Unlock()
			return Message{}, err
		}
		if s.mu.needReset {
			epoch := s.mu.newEpoch
			s.mu.needReset, s.mu.newEpoch, s.mu.queue = false, false, nil
			s.mu.Unlock()
			// Taken after clearing the flag: every transaction the hub
			// applies from now on is either in this snapshot or queued
			// after it (and skipped below if already in it).
			s.h.mu.Lock()
			m := s.h.snapshot(s.service, true, epoch)
			s.h.mu.Unlock()
			s.sent = m.Revision
			return *m, nil
		}
		for len(s.mu.queue) > 0 {
			m := s.mu.queue[0]
			s.mu.queue[0] = Message{}
			s.mu.queue = s.mu.queue[1:]
			// Skip what the last message already covered; a progress at
			// the same revision still goes out: it confirms the view.
			if m.Revision < s.sent || (m.Revision == s.sent && len(m.Events) > 0) {
				continue
			}
			s.mu.Unlock()
			s.sent = m.Revision
			return m, nil
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-s.done:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
}

// Close unregisters the subscriber.
func (s *Sub) Close() {
	s.close(ErrClosed)
	s.h.remove(s)
}
