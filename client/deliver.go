package client

import (
	"sync"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The user's callbacks of a Subscription (OnChange, OnConnection) run on
// a goroutine of that Subscription, never on the goroutine that applies
// (the Client's Subscribe stream, which every Subscription and resolver
// of the Client shares, or a Subscription's own Watch stream). Were they
// called there, one slow OnChange would stop the stream from reading: no
// other service of the Client would get its updates, the regnode would
// see a slow consumer, and the receive deadline, disarmed while a unit is
// applied, would notice nothing.
//
// The view is applied first, then the change is queued: a callback runs
// behind the view, never ahead of it. The queue is bounded by
// SubscribeOptions.CallbackBacklog. A callback that falls further behind
// has its pending changes coalesced, as the Changes channel's are (offer):
// they are dropped, and the next change delivered is a Snapshot of the
// view at the moment it is taken, taken under applyMu so that it holds
// exactly what was dropped and no change queued later is in it twice.
//
// The SDK's own listeners (the resolvers', listen) stay on the applying
// goroutine: they only build a resolver state and hand it to the
// resolver's own goroutine, which keeps the newest (regResolver.offer), so
// they never block; and they must follow the view as it is applied,
// whatever a user callback of the same service does.

// DefaultCallbackBacklog is SubscribeOptions.CallbackBacklog's default.
const DefaultCallbackBacklog = 1024

// delivery is the queue and goroutine of one Subscription's callbacks.
// The goroutine runs only while callbacks wait: a Subscription whose
// changes are all delivered holds none (a goroutine each would cost every
// subscription its stack, about 8 KiB, doubling an idle one's memory).
type delivery struct {
	s        *Subscription
	onChange func(Change)
	onConn   func(Freshness)
	max      int            // SubscribeOptions.CallbackBacklog
	wg       sync.WaitGroup // the goroutine, while it runs

	mu struct {
		sync.Mutex
		queue []callback
		// overflow: changes were dropped; the next one delivered is a
		// snapshot of the view (coalesce). newEpoch: one of them started
		// a new epoch, which the snapshot says. conn: the latest
		// connection change dropped meanwhile.
		overflow bool
		newEpoch bool
		conn     *Freshness

		shown     bool // a change was delivered: a coalesced snapshot is then a Reset
		connShown bool // the Connected last delivered to OnConnection
		episode   int  // coalescings since the queue was last empty
		coalesced int  // every coalescing (Stats.Coalesced)

		stopped bool // no callback starts any more
		busy    bool // a callback is running
		running bool // the goroutine runs (it delivers until nothing waits)
		// finish: stop found a callback running; the goroutine calls
		// the Subscription's finished as it ends.
		finish bool
	}
}

// callback is one call waiting: a change, or (conn) a connection change.
type callback struct {
	conn bool
	ch   Change
	f    Freshness
}

// newDelivery returns the delivery of s's callbacks, or nil if s has none.
func newDelivery(s *Subscription) *delivery {
	if s.opts.OnChange == nil && s.opts.OnConnection == nil {
		return nil
	}
	return &delivery{s: s, onChange: s.opts.OnChange, onConn: s.opts.OnConnection, max: s.opts.CallbackBacklog}
}

// startLocked starts the goroutine unless it runs; d.mu is held.
func (d *delivery) startLocked() {
	if d.mu.running || d.mu.stopped {
		return
	}
	d.mu.running = true
	d.wg.Add(1)
	go d.run()
}

// change queues ch for OnChange; never blocks. The caller holds applyMu
// (changes are queued in the order they were applied).
func (d *delivery) change(ch Change) {
	if d.onChange == nil {
		return
	}
	d.mu.Lock()
	if d.mu.stopped {
		d.mu.Unlock()
		return
	}
	if d.mu.overflow {
		// The snapshot due covers it.
		d.mu.newEpoch = d.mu.newEpoch || ch.NewEpoch
		d.startLocked()
		d.mu.Unlock()
		return
	}
	if n := len(d.mu.queue); ch.Progress && n > 0 && !d.mu.queue[n-1].conn && d.mu.queue[n-1].ch.Progress {
		// A heartbeat says only that the revision moved: the latest says
		// all of those still waiting (an idle service must not overflow a
		// stalled callback by heartbeats alone).
		d.mu.queue[n-1].ch = ch
		d.startLocked()
		d.mu.Unlock()
		return
	}
	dropped, first := d.push(callback{ch: ch})
	d.startLocked()
	d.mu.Unlock()
	d.noteCoalesced(dropped, first)
}

// connection queues f for OnConnection; never blocks. The caller holds
// s.mu (connection changes are queued in the order they happened).
func (d *delivery) connection(f Freshness) {
	if d.onConn == nil {
		return
	}
	d.mu.Lock()
	if d.mu.stopped {
		d.mu.Unlock()
		return
	}
	if d.mu.overflow {
		d.mu.conn = &f // delivered after the snapshot, if it still changes anything
		d.startLocked()
		d.mu.Unlock()
		return
	}
	dropped, first := d.push(callback{conn: true, f: f})
	d.startLocked()
	d.mu.Unlock()
	d.noteCoalesced(dropped, first)
}

// push queues c, or, if the queue is full, drops everything waiting and
// makes a snapshot due (dropped); first is true for the first coalescing
// since the queue was last empty. d.mu is held.
func (d *delivery) push(c callback) (dropped, first bool) {
	if len(d.mu.queue) < d.max {
		d.mu.queue = append(d.mu.queue, c)
		return false, false
	}
	d.mu.queue = append(d.mu.queue, c)
	for _, w := range d.mu.queue {
		if w.conn {
			d.mu.conn = &w.f
		} else {
			d.mu.newEpoch = d.mu.newEpoch || w.ch.NewEpoch
		}
	}
	clear(d.mu.queue) // the dropped changes' instances are not kept alive
	d.mu.queue = d.mu.queue[:0]
	d.mu.overflow = true
	d.mu.coalesced++
	d.mu.episode++
	return true, d.mu.episode == 1
}

// noteCoalesced counts a coalescing in the Client's metrics, and logs the
// first of an episode (until the callback catches up) at warn: once, not
// once per backlog of changes, for a callback that stays slow. Called
// without d.mu.
func (d *delivery) noteCoalesced(dropped, first bool) {
	if !dropped {
		return
	}
	s := d.s
	s.c.metrics.CallbacksCoalesced(s.service)
	if !first {
		return
	}
	s.c.log.Warn("subscription callback fell behind: its pending changes were coalesced into a snapshot of the current view",
		"service", s.service, "backlog", d.max, "revision", s.cache.Revision())
}

// run calls the callbacks in order until none waits, or stop.
func (d *delivery) run() {
	defer d.wg.Done()
	for {
		c, ok := d.next()
		if !ok {
			return
		}
		if c.conn {
			d.onConn(c.f)
		} else {
			d.onChange(c.ch)
		}
		d.mu.Lock()
		d.mu.busy = false
		d.mu.Unlock()
	}
}

// next takes the next callback and marks it running (busy); false when
// none waits or once stopped, and the goroutine ends.
func (d *delivery) next() (callback, bool) {
	for {
		d.mu.Lock()
		switch {
		case d.mu.stopped:
			finish := d.mu.finish
			d.mu.running, d.mu.finish = false, false
			d.mu.Unlock()
			if finish {
				d.s.finished()
			}
			return callback{}, false
		case !d.mu.overflow && len(d.mu.queue) == 0:
			caughtUp := 0
			if d.mu.episode > 0 {
				caughtUp, d.mu.episode = d.mu.episode, 0
			}
			d.mu.running = false
			d.mu.Unlock()
			if caughtUp > 0 {
				d.s.c.log.Info("subscription callback caught up", "service", d.s.service, "coalesced", caughtUp)
			}
			return callback{}, false
		case d.mu.overflow:
			d.mu.Unlock()
			d.snapshotDue()
			continue
		}
		c := d.mu.queue[0]
		d.mu.queue[0] = callback{}
		d.mu.queue = d.mu.queue[1:]
		if c.conn {
			d.mu.connShown = c.f.Connected
		} else {
			d.mu.shown = true
		}
		d.mu.busy = true
		d.mu.Unlock()
		return c, true
	}
}

// snapshotDue turns an overflow into the snapshot of the view (and the
// latest connection change dropped, if it changes what OnConnection was
// last told), at the head of the queue.
func (d *delivery) snapshotDue() {
	s := d.s
	// No apply in between: the snapshot holds every change dropped, and
	// none queued after it.
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	snap := s.cache.Snapshot()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.stopped || !d.mu.overflow {
		return
	}
	var head []callback
	if d.onChange != nil {
		head = append(head, callback{ch: Change{Diff: cache.Diff{Revision: snap.Revision(), Reset: d.mu.shown},
			Snapshot: true, NewEpoch: d.mu.newEpoch, Instances: snapshotOf(snap, s.service)}})
	}
	if c := d.mu.conn; c != nil && c.Connected != d.mu.connShown {
		head = append(head, callback{conn: true, f: *c})
	}
	d.mu.queue = append(head, d.mu.queue...)
	d.mu.overflow, d.mu.newEpoch, d.mu.conn = false, false, nil
}

// snapshotOf is what a Snapshot change of service holds ("" for all).
func snapshotOf(snap *cache.Snapshot, service string) []*registryv1.Instance {
	if service != "" {
		return snap.Instances(service)
	}
	return snap.All()
}

// stop makes sure no callback starts any more and drops what waits. It
// waits for the goroutine to end unless a callback is running: that one
// (the last) is not waited for, so that a callback blocked for good cannot
// hang Close, and one may call Close itself; the goroutine's end then
// closes Done. The Subscription's finished is called once, by stop or by
// that goroutine.
func (d *delivery) stop() {
	d.mu.Lock()
	if d.mu.stopped {
		d.mu.Unlock()
		return
	}
	d.mu.stopped = true
	clear(d.mu.queue)
	d.mu.queue, d.mu.conn = nil, nil
	busy := d.mu.busy
	d.mu.finish = busy
	d.mu.Unlock()
	if !busy {
		d.wg.Wait() // a goroutine between two callbacks ends at once
		d.s.finished()
	}
}

// coalescings is Stats.Coalesced.
func (d *delivery) coalescings() int {
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.coalesced
}
