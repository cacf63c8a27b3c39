package client

import (
	"sync"
	"time"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/lastresort"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The last resort of a subscription of one service (package lastresort):
// when most of the service's routable instances vanish by lease expiry at
// once, its resolvers offer them, while nothing else is routable, for
// Config.LastResort.Grace. The subscription's own view (Instances,
// Snapshot, OnChange, the disk cache) never holds them: it is what the
// registry holds, and a last resort is the data plane's choice on top of
// it, so nothing ever saves a vanished instance as if it were registered.

// lastResort is a subscription's last-resort state. Its tracker is fed
// under applyMu; the rest is guarded by mu.
type lastResort struct {
	tr *lastresort.Tracker

	// The timer that ends a grace when no change comes: armed under
	// applyMu, waited for by stop (wg counts a timer armed and not yet
	// done).
	timer  *time.Timer
	wg     sync.WaitGroup
	closed bool

	mu struct {
		sync.Mutex
		offer []*registryv1.Instance // offered to the balancer now
		until time.Time
		seq   uint64 // counts changes of offer: orders resolver views at one revision
	}
}

// newLastResort returns the last-resort state of a subscription of
// service, logging and counting its starts and ends; nil for a
// subscription of every service (no resolver uses one).
func newLastResort(c *Client, service string) *lastResort {
	if service == "" {
		return nil
	}
	cfg := c.lastResort
	cfg.OnStart = func(service string, kept []*registryv1.Instance, until time.Time) {
		ids := make([]string, len(kept))
		for i, in := range kept {
			ids[i] = in.Id
		}
		c.log.Warn("most of the service vanished by lease expiry at once (not deregistered): keeping its instances as a last resort, called only while nothing else is routable",
			"service", service, "instances", ids, "until", until)
		c.metrics.LastResortStarted(service, len(kept))
	}
	cfg.OnEnd = func(service string, why lastresort.EndReason) {
		c.log.Info("last resort ended", "service", service, "why", why.String())
		c.metrics.LastResortHolds(service, 0)
	}
	tr, err := lastresort.New(cfg)
	if err != nil {
		// Config.Validate refused it already: New never gets here.
		c.log.Error("last resort disabled", "err", err)
		return nil
	}
	return &lastResort{tr: tr}
}

// observeLastResort feeds the change b made to the view (prev is the
// service's list before it, diff its effect) to the tracker at now, and
// updates what is offered. A disk view, and the live view that replaces
// one, are no news of what vanished: the tracker forgets the service. The
// caller holds applyMu. It reports whether the offer changed.
func (s *Subscription) observeLastResort(b cache.Batch, prev []*registryv1.Instance, diff cache.Diff, fromDisk bool, now time.Time) bool {
	lr := s.lr
	if fromDisk {
		lr.tr.Forget(s.service)
	} else {
		// A batch may fold a deregistration's DRAINING mark and its
		// delete into one diff: the mark is the record last seen.
		var seen []*registryv1.Instance
		if len(diff.Removed) > 0 {
			removed := make(map[string]bool, len(diff.Removed))
			for _, k := range diff.Removed {
				removed[k.ID] = true
			}
			for _, ev := range b.Events {
				if ev.Type == cache.Put && ev.Instance.GetService() == s.service && removed[ev.Instance.GetId()] {
					seen = append(seen, ev.Instance)
				}
			}
		}
		lr.tr.Observe(s.service, lastresort.LastSeen(prev, seen), s.cache.Instances(s.service), now)
	}
	return s.offerLastResort(now)
}

// offerLastResort sets what is offered from the tracker at now, and arms
// the timer for the next grace end. The caller holds applyMu. It reports
// whether the offer changed.
func (s *Subscription) offerLastResort(now time.Time) bool {
	lr := s.lr
	offer := lr.tr.Offer(s.service, s.cache.Instances(s.service), now)
	n, until := lr.tr.Held(s.service)
	s.c.metrics.LastResortHolds(s.service, n)
	if len(offer) == 0 {
		until = time.Time{}
	}
	lr.mu.Lock()
	changed := len(offer) != len(lr.mu.offer) || !until.Equal(lr.mu.until)
	for i := 0; !changed && i < len(offer); i++ {
		changed = offer[i] != lr.mu.offer[i]
	}
	if changed {
		lr.mu.offer, lr.mu.until = offer, until
		lr.mu.seq++
	}
	lr.mu.Unlock()
	if changed {
		s.mu.Lock()
		s.mu.fresh.LastResort, s.mu.fresh.LastResortUntil = len(offer), until
		s.mu.Unlock()
	}
	s.armLastResort(now)
	return changed
}

// armLastResort (re)arms the timer for the tracker's next grace end. The
// caller holds applyMu.
func (s *Subscription) armLastResort(now time.Time) {
	lr := s.lr
	if lr.closed {
		return
	}
	if lr.timer != nil && lr.timer.Stop() {
		lr.wg.Done()
	}
	lr.timer = nil
	next := lr.tr.Next()
	if next.IsZero() {
		return
	}
	lr.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(next.Sub(now), func() {
		defer lr.wg.Done()
		s.applyMu.Lock()
		defer s.applyMu.Unlock()
		if lr.closed {
			return
		}
		if lr.timer == t {
			lr.timer = nil // fired: nothing to stop
		}
		now := time.Now()
		lr.tr.Expire(now)
		if s.offerLastResort(now) {
			s.tellListeners(Change{Diff: cache.Diff{Revision: s.cache.Revision()}})
		}
	})
	lr.timer = t
}

// stopLastResort stops the timer and waits for a run of it already
// started; nothing is offered or armed after it returns. Called as the
// subscription stops, without applyMu.
func (s *Subscription) stopLastResort() {
	lr := s.lr
	if lr == nil {
		return
	}
	s.applyMu.Lock()
	lr.closed = true
	if lr.timer != nil && lr.timer.Stop() {
		lr.wg.Done()
	}
	n, _ := lr.tr.Held(s.service)
	s.applyMu.Unlock()
	lr.wg.Wait()
	if n > 0 {
		s.c.metrics.LastResortHolds(s.service, 0) // no longer this subscription's to hold
	}
}

// lastResortOffer is what a resolver offers as the last resort now (nil
// when nothing), and the count of its changes, which orders the views of
// one revision.
func (s *Subscription) lastResortOffer() ([]*registryv1.Instance, uint64) {
	if s.lr == nil {
		return nil, 0
	}
	s.lr.mu.Lock()
	defer s.lr.mu.Unlock()
	return s.lr.mu.offer, s.lr.mu.seq
}
