package server

import (
	"sort"
	"sync"
	"sync/atomic"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// subscribers is this regnode's table of its live subscribers, what
// WaitApplied counts: the services followed on its Subscribe streams
// (followers), each with the revision its client acknowledged, and its
// Watch streams (watchStreams), which acknowledge nothing, each with the
// highest revision handed to its transport. The zero value is ready.
//
// A follower's ack takes the table's lock (acks are one per applied unit
// of a client that chose to say so). A Watch stream's send does not: its
// revision is an atomic of its own, read only by WaitApplied, and a send
// takes the lock only to wake a WaitApplied in progress, once, when it
// crosses a revision one waits for (see sent).
type subscribers struct {
	mu      sync.Mutex
	all     map[*follower]struct{}
	watches map[*watchStream]struct{}
	changed chan struct{} // closed and replaced on every change a waiter may need
	waiting map[int64]int // the revisions WaitApplied calls wait for, and how many wait for each
	// lo and hi are the least and the greatest of waiting (0: none),
	// written under mu and read by sends without it.
	lo, hi atomic.Int64
}

// watchStream is one Watch stream: a live subscriber of its service (""
// for every service) that cannot acknowledge.
type watchStream struct {
	service, name, peer string
	// sent is the highest revision handed to the stream's transport
	// (initially the stream's resume point: what its client says it has).
	// Written only by the stream's own goroutine, read by WaitApplied.
	sent atomic.Int64
}

func (t *subscribers) add(f *follower) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.all == nil {
		t.all = map[*follower]struct{}{}
	}
	t.all[f] = struct{}{}
	// A wait in progress may be for this follower's service: ask it for
	// the highest revision waited for (an ack of a service nobody waits
	// for costs one message and counts for nothing).
	if hi := t.hi.Load(); hi > f.acked && f.stream.asks != nil {
		f.stream.asks.ask(f.service, hi)
	}
	t.notifyLocked()
}

func (t *subscribers) remove(f *follower) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.all, f)
	t.notifyLocked()
}

// ack records that f's client applied its service up to rev.
func (t *subscribers) ack(f *follower, rev int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rev > f.acked {
		f.acked = rev
		t.notifyLocked()
	}
}

func (t *subscribers) rename(ms *muxStream, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ms.name = name
}

// addWatch enters a Watch stream of service, resumed from from, into the
// table; removeWatch takes it out when the stream ends.
func (t *subscribers) addWatch(service, name, peer string, from int64) *watchStream {
	w := &watchStream{service: service, name: name, peer: peer}
	w.sent.Store(from)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.watches == nil {
		t.watches = map[*watchStream]struct{}{}
	}
	t.watches[w] = struct{}{}
	t.notifyLocked()
	return w
}

func (t *subscribers) removeWatch(w *watchStream) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.watches, w)
	t.notifyLocked()
}

// sent records that the unit at rev has been handed to w's transport; it
// is called by w's goroutine only, after each unit. A revision lower than
// the last comes only with a new epoch's reset, where the old revisions
// mean nothing, so it is stored as it is.
//
// It takes no lock unless a WaitApplied may be waiting for this very step:
// some waiter's revision W with prev < W <= rev needs prev < hi and
// rev >= lo. Why a waiter never misses it: a waiter publishes lo and hi
// (under mu) before it reads the streams' revisions, and a send stores its
// revision before it reads lo and hi; Go's atomics are sequentially
// consistent, so either the waiter reads the new revision or the send
// sees the waiter and wakes it (under mu, closing the channel the waiter
// took with its read).
func (t *subscribers) sent(w *watchStream, rev int64) {
	prev := w.sent.Load()
	if rev == prev {
		return
	}
	w.sent.Store(rev)
	if hi := t.hi.Load(); hi != 0 && prev < hi && rev >= t.lo.Load() {
		t.mu.Lock()
		t.notifyLocked()
		t.mu.Unlock()
	}
}

// wait enters a waiter for rev of service, until done is called, and
// asks every follower of it that has not acknowledged rev to do so (see
// ackask.go); a follower added later is asked by add.
func (t *subscribers) wait(service string, rev int64) (done func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waiting == nil {
		t.waiting = map[int64]int{}
	}
	t.waiting[rev]++
	t.boundsLocked()
	for f := range t.all {
		if (f.service == service || f.service == "") && f.acked < rev && f.stream.asks != nil {
			f.stream.asks.ask(f.service, rev)
		}
	}
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.waiting[rev]--; t.waiting[rev] == 0 {
			delete(t.waiting, rev)
		}
		t.boundsLocked()
	}
}

// boundsLocked publishes the least and greatest revision waited for.
func (t *subscribers) boundsLocked() {
	var lo, hi int64
	for rev := range t.waiting {
		if lo == 0 || rev < lo {
			lo = rev
		}
		hi = max(hi, rev)
	}
	t.lo.Store(lo)
	t.hi.Store(hi)
}

func (t *subscribers) notifyLocked() {
	if t.changed != nil {
		close(t.changed)
	}
	t.changed = make(chan struct{})
}

// pending is this regnode's part of a WaitApplied for rev of service (the
// subscribers of every service included): the followers and how many of
// them have not acknowledged rev, and the Watch streams and how many have
// not been sent it, each of those behind named; changed is closed at the
// next change of the table a waiter for rev may need (after wait(rev)).
func (t *subscribers) pending(service string, rev int64) (n *registryv1.NodeApplied, changed <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.changed == nil {
		t.changed = make(chan struct{})
	}
	n = &registryv1.NodeApplied{}
	for f := range t.all {
		if f.service != service && f.service != "" {
			continue
		}
		n.Subscribers++
		if f.acked < rev {
			n.Laggards = append(n.Laggards, &registryv1.Laggard{Subscriber: f.stream.name, Peer: f.stream.peer, Revision: f.acked})
		}
	}
	for w := range t.watches {
		if w.service != service && w.service != "" {
			continue
		}
		n.WatchStreams++
		if sent := w.sent.Load(); sent < rev {
			n.WatchLaggards = append(n.WatchLaggards, &registryv1.Laggard{Subscriber: w.name, Peer: w.peer, Revision: sent})
		}
	}
	n.Pending, n.WatchPending = int64(len(n.Laggards)), int64(len(n.WatchLaggards))
	sortLaggards(n.Laggards)
	sortLaggards(n.WatchLaggards)
	return n, t.changed
}

func sortLaggards(ls []*registryv1.Laggard) {
	sort.Slice(ls, func(i, j int) bool {
		if ls[i].Subscriber != ls[j].Subscriber {
			return ls[i].Subscriber < ls[j].Subscriber
		}
		return ls[i].Peer < ls[j].Peer
	})
}
