// Package fanout serves every subscriber of a regnode from ONE etcd watch:
// the watch feeds a local cache and a ring of recent transactions, and each
// subscriber is served from memory. A subscriber resuming from a revision
// still in the ring gets the missed transactions; an older one gets a reset
// snapshot; one of another epoch (etcd was restored since, see
// internal/epoch) gets a new-epoch reset snapshot; one ahead of this regnode
// on its epoch waits for it to catch up, or is told to try another. A
// subscriber too slow to keep up with its bounded queue is reset (never
// silently skipped), and never blocks the others. When the watch must
// relist (etcd compacted past it), subscribers get what the relist
// changed, as one transaction at its revision; only a relist onto another
// etcd history (a new epoch) resets them.
//
// Encoded once: what a subscriber receives is a *Unit, shared by every
// subscriber of the same service (a transaction's events for that
// service, a snapshot at one revision, progress), whose Chunks are the
// encoded WatchResponse messages, built once for all of them; a stream
// sends those bytes as they are. Records are never encoded again: the
// watcher forwards each one's stored bytes with etcd's revisions appended
// (record.Element), the hub keeps one such element per instance for every
// feed (see store), and snapshots and events are framed from them.
//
// The hub's lock covers O(1) work per transaction and per service it
// touches: subscribers are indexed by service, the transaction's unit is
// pushed to the subscribers of the services it touches only (outside the
// hub's lock, under that service's), subscribers of other services learn
// the new revision from one shared progress, paced (at most one per
// Config.ProgressGap, see beat.go), and a resume finds its place in the
// ring by binary search and reads it outside the lock.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/epoch"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/watch"
)

// Sentinel errors of Subscribe.
var (
	// ErrBehind: the subscriber has seen a revision (or epoch) this
	// regnode has not reached within CatchUpTimeout; it should try another
	// regnode.
	ErrBehind = errors.New("this regnode is behind the requested revision")
	// ErrClosed: the hub is stopping.
	ErrClosed = errors.New("fan-out hub closed")
)

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
// of New (see package configerr).
var ErrInvalidConfig = errors.New("fanout: invalid config")

// Config configures a Hub. A zero field takes the default its comment
// states (DefaultConfig has them all); a negative one is refused.
type Config struct {
	// Client is the etcd client (required).
	Client *clientv3.Client
	// Prefix is the registry key prefix ("": record.DefaultPrefix).
	Prefix string
	// RingSize bounds the recent events kept for resuming subscribers
	// (0: 10000, a rollout of a few thousand instances; a subscriber
	// that resumes from before the ring gets a reset snapshot).
	RingSize int
	// QueueSize bounds each subscriber's queue: the transactions of its
	// service not yet sent (progress is never queued); a subscriber that
	// falls further behind is reset (0: 1024).
	QueueSize int
	// CatchUpTimeout bounds how long a subscriber ahead of this regnode
	// waits for it (0: 2s, below the SDK's 3s receive deadline).
	CatchUpTimeout time.Duration
	// ProgressInterval is the watcher's (watch.Config.ProgressInterval;
	// 0: its default, 1s).
	ProgressInterval time.Duration
	// ProgressGap is the least time between two progress messages a
	// subscriber gets because other services changed (0: 1s, the
	// watcher's heartbeat; see beat.go). It bounds how stale a quiet
	// service's revision is while the registry moves; it never delays a
	// change of the service itself. At 10,000 subscribers each message a
	// second per quiet service is 10,000 sends and receives a second, so
	// it is no shorter than a quiet service gets while the registry idles.
	ProgressGap time.Duration
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
	// Hooks for metrics; any may be nil.
	OnJunk         func(key string, err error)
	OnWatchRestart func(reason string, err error)
	OnReset        func(reason string) // a subscriber is due a reset snapshot
	OnStale        func()              // a batch the cache refused
	// OnSubscribers is told the number of subscribers at every change,
	// in the order of the changes: it is called with the hub's lock held,
	// so it must be quick and must not call the Hub.
	OnSubscribers func(n int)
}

// DefaultConfig is a Config with every default but the client.
func DefaultConfig() Config {
	return Config{Prefix: record.DefaultPrefix, RingSize: 10000, QueueSize: 1024, CatchUpTimeout: 2 * time.Second,
		ProgressInterval: watch.DefaultConfig().ProgressInterval, ProgressGap: time.Second}
}

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.RingSize == 0 {
		c.RingSize = d.RingSize
	}
	if c.QueueSize == 0 {
		c.QueueSize = d.QueueSize
	}
	if c.CatchUpTimeout == 0 {
		c.CatchUpTimeout = d.CatchUpTimeout
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = d.ProgressInterval
	}
	if c.ProgressGap == 0 {
		c.ProgressGap = d.ProgressGap
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as a *configerr.Error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(field string, v any) error {
		return configerr.New(ErrInvalidConfig, "fanout", field, v, "must be >= 0 (0: the default)")
	}
	switch {
	case c.Client == nil:
		return configerr.Required(ErrInvalidConfig, "fanout", "Client")
	case c.RingSize < 0:
		return bad("RingSize", c.RingSize)
	case c.QueueSize < 0:
		return bad("QueueSize", c.QueueSize)
	case c.CatchUpTimeout < 0:
		return bad("CatchUpTimeout", c.CatchUpTimeout)
	case c.ProgressInterval < 0:
		return bad("ProgressInterval", c.ProgressInterval)
	case c.ProgressGap < 0:
		return bad("ProgressGap", c.ProgressGap)
	}
	return nil
}

// Hub is the fan-out. Run it once; Subscribe from any goroutine.
type Hub struct {
	cfg   Config
	log   *slog.Logger
	keys  record.Keys
	cache *cache.Cache
	w     *watch.Watcher
	// store is the one encoded element per instance that every feed's
	// snapshots are framed from (see store).
	store *store
	// epochKey is where etcd keeps the epoch (see internal/epoch).
	epochKey string

	ready     chan struct{}
	readyOnce sync.Once

	// tick is what every subscriber may send as progress: published by
	// apply after the transaction's units are queued, so a subscriber
	// that sees it has every unit up to its revision queued.
	tick atomic.Pointer[tick]
	// beats paces the tick for the subscribers of services a transaction
	// did not touch (beat.go).
	beats *beater

	mu struct {
		sync.Mutex
		ring      []cache.Batch // transactions after ringStart, oldest first
		ringStart int64         // the ring holds every transaction after this revision
		// gaps are the relists the ring spans: each took the view from one
		// revision to another in one step (their differences are in the
		// ring), so no resume from between the two can be continued.
		gaps   []gap
		events int    // events in ring
		rev    int64  // revision of the cache
		epoch  string // epoch of the cache
		feeds  map[string]*feed
		subs   int
		closed bool
	}
}

// tick is the hub's progress: its revision and epoch, how many progress
// notifications from etcd it has applied (each confirms the view even at
// an unchanged revision), the progress unit every subscriber shares, and a
// channel closed when the next tick replaces it.
type tick struct {
	rev      int64
	epoch    string
	confirms uint64
	progress *Unit
	changed  chan struct{}
}

// New returns a Hub; call Run to start it. It fails only if cfg does not
// Validate.
func New(cfg Config) (*Hub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	key := epoch.Key(cfg.Prefix)
	h := newHub(cfg)
	w, err := watch.New(watch.Config{Client: cfg.Client, Prefix: cfg.Prefix, Logger: cfg.Logger, EpochKey: key,
		ProgressInterval: cfg.ProgressInterval, OnJunk: cfg.OnJunk, OnRestart: cfg.OnWatchRestart, Known: h.known})
	if err != nil {
		return nil, fmt.Errorf("fanout: %w", err)
	}
	h.w, h.epochKey = w, key
	return h, nil
}

// known is the watcher's Config.Known: the cache's instance for key, if
// it is the record at exactly these revisions. A relist of the same
// history then decodes only the records that changed, and keeps the
// cache's pointers for the rest (so the cache finds them unchanged by
// identity).
func (h *Hub) known(key string, modRev, createRev int64) *registryv1.Instance {
	svc, id, ok := h.keys.Parse(key)
	if !ok || modRev == 0 {
		return nil
	}
	in, ok := h.cache.Get(svc, id)
	if !ok || in.ModRevision != modRev || in.CreateRevision != createRev {
		return nil
	}
	return in
}

// newHub is a Hub without its watcher: tests drive apply themselves.
func newHub(cfg Config) *Hub {
	h := &Hub{cfg: cfg, log: cfg.Logger, keys: record.NewKeys(cfg.withDefaults().Prefix), cache: cache.New(), store: newStore(), ready: make(chan struct{})}
	h.mu.feeds = map[string]*feed{}
	h.tick.Store(&tick{progress: &Unit{}, changed: make(chan struct{})})
	h.beats = newBeater(cfg.withDefaults().ProgressGap, h.tick.Load)
	return h
}

// Cache is the hub's view; read it freely, never apply to it.
func (h *Hub) Cache() *cache.Cache { return h.cache }

// Ready is closed once the first snapshot is in the cache.
func (h *Hub) Ready() <-chan struct{} { return h.ready }

// Run follows etcd until ctx ends, then disconnects every subscriber.
func (h *Hub) Run(ctx context.Context) error {
	err := h.w.Run(ctx, h.apply)
	h.mu.Lock()
	h.mu.closed = true
	feeds := h.mu.feeds
	h.mu.feeds, h.mu.subs = map[string]*feed{}, 0
	h.subscribersChanged()
	h.mu.Unlock()
	for _, f := range feeds {
		f.mu.Lock()
		for s := range f.subs {
			s.close(ErrClosed)
		}
		clear(f.subs)
		f.mu.Unlock()
	}
	t := h.tick.Load()
	h.publish(t.rev, t.epoch, t.confirms) // wakes Subscribe's waiters: closed
	h.beats.close()
	return err
}

// publish replaces the tick and wakes everyone waiting on the old one.
// Only apply (and Run, once apply can no longer run) calls it.
func (h *Hub) publish(rev int64, ep string, confirms uint64) {
	next := &tick{rev: rev, epoch: ep, confirms: confirms, changed: make(chan struct{}),
		progress: &Unit{b: cache.Batch{Revision: rev, Epoch: ep}}}
	old := h.tick.Swap(next)
	close(old.changed)
	h.beats.offer()
}

// apply is the watcher's delivery. Under h.mu: the cache, the ring, and
// locking the feeds the batch concerns (so that a new subscriber, which
// joins its feed under h.mu, sees no gap and no duplicate); then, outside
// h.mu, the batch's unit for each feed goes to that feed's subscribers;
// then the new tick, from which every other subscriber sends progress.
func (h *Hub) apply(b cache.Batch) error {
	h.mu.Lock()
	prevRev := h.mu.rev
	d, err := h.cache.Apply(b)
	if err != nil {
		h.mu.Unlock()
		h.log.Error("cache refused a batch from etcd", "revision", b.Revision, "cache", h.cache.Revision(), "err", err)
		if h.cfg.OnStale != nil {
			h.cfg.OnStale()
		}
		return nil
	}
	h.mu.rev = h.cache.Revision()
	if b.Snapshot {
		h.mu.epoch = b.Epoch
	}
	rev, ep, confirms := h.mu.rev, h.mu.epoch, h.tick.Load().confirms
	switch {
	case b.Snapshot:
		// O(instances), as the cache's own Apply of a snapshot is: under
		// h.mu, so every snapshot of the new cache finds its elements.
		h.store.reset(h.cache.Snapshot(), b)
		first := false
		h.readyOnce.Do(func() { close(h.ready); first = true })
		if first || b.NewEpoch {
			h.mu.ring, h.mu.events, h.mu.ringStart, h.mu.gaps = nil, 0, b.Revision, nil
		}
		if first {
			h.mu.Unlock()
			break
		}
		if !b.NewEpoch {
			// A relist of the same history: every subscriber holds (or has
			// queued) the view before it, so the differences take it to
			// the relist's, as one transaction at its revision, and a
			// relist costs subscribers what changed, not everything. The
			// ring keeps them too, so that a subscriber resuming from
			// before the relist (its stream stalled while etcd was away)
			// gets them, not a reset; only a resume from between the two
			// revisions cannot be continued (see Subscribe).
			evs := relistEvents(d, b)
			h.mu.gaps = append(h.mu.gaps, gap{from: prevRev, to: b.Revision})
			var units map[*feed]*Unit
			if len(evs) > 0 {
				tx := cache.Batch{Revision: b.Revision, Events: evs}
				h.ringAppend(tx)
				units = h.unitsOf(tx, ep)
			}
			h.mu.Unlock()
			h.log.Info("etcd relist: subscribers sent the differences", "revision", b.Revision,
				"added", len(d.Added), "updated", len(d.Updated), "removed", len(d.Removed), "feeds", len(units))
			for f, u := range units {
				for s := range f.subs {
					s.push(u)
				}
				f.mu.Unlock()
			}
			break
		}
		// Another history: revisions of the old one mean nothing here, so
		// every subscriber is reset, feed by feed.
		feeds := make([]*feed, 0, len(h.mu.feeds))
		for _, f := range h.mu.feeds {
			f.mu.Lock()
			feeds = append(feeds, f)
		}
		h.mu.Unlock()
		for _, f := range feeds {
			for s := range f.subs {
				s.reset("new-epoch", true)
			}
			f.mu.Unlock()
		}
	case len(b.Events) > 0:
		h.ringAppend(cache.Batch{Revision: b.Revision, Events: b.Events})
		h.store.put(b)
		units := h.unitsOf(b, ep)
		h.mu.Unlock()
		for f, u := range units {
			for s := range f.subs {
				s.push(u)
			}
			f.mu.Unlock()
		}
	default:
		h.mu.Unlock()
		confirms++ // progress from etcd: every subscriber confirms its view
	}
	h.publish(rev, ep, confirms)
	return nil
}

// unitsOf returns, with each feed locked, the unit of b for every feed
// with a subscriber that b concerns. Called with h.mu held.
func (h *Hub) unitsOf(b cache.Batch, ep string) map[*feed]*Unit {
	units := map[*feed]*Unit{}
	if f := h.mu.feeds[""]; f != nil {
		f.mu.Lock()
		units[f] = &Unit{b: cache.Batch{Revision: b.Revision, Epoch: ep, Events: b.Events}}
	}
	for i, e := range b.Events {
		f := h.mu.feeds[e.Service]
		if f == nil || e.Service == "" {
			continue
		}
		if _, ok := units[f]; ok {
			continue // its events were gathered at its first one
		}
		f.mu.Lock()
		var evs []cache.Event
		for _, o := range b.Events[i:] {
			if o.Service == e.Service {
				evs = append(evs, o)
			}
		}
		units[f] = &Unit{b: cache.Batch{Revision: b.Revision, Epoch: ep, Events: evs}}
	}
	return units
}

// gap is a relist that took the hub's view from revision from to
// revision to in one step.
type gap struct{ from, to int64 }

// ringAppend adds one transaction to the ring, dropping the oldest while
// it holds more than RingSize events (it always keeps the newest), and
// the gaps it no longer spans. Called with h.mu held.
func (h *Hub) ringAppend(b cache.Batch) {
	h.mu.ring = append(h.mu.ring, b)
	h.mu.events += len(b.Events)
	for h.mu.events > h.cfg.RingSize && len(h.mu.ring) > 1 {
		// No zeroing: a resume may be reading this entry outside
		// h.mu (see Subscribe); the backing array is dropped when
		// append next reallocates it.
		h.mu.ringStart = h.mu.ring[0].Revision
		h.mu.events -= len(h.mu.ring[0].Events)
		h.mu.ring = h.mu.ring[1:]
	}
	for len(h.mu.gaps) > 0 && h.mu.gaps[0].to <= h.mu.ringStart {
		h.mu.gaps = h.mu.gaps[1:]
	}
}

// inGap reports whether from lies strictly inside a relist the ring
// spans: a revision this hub never held, whose view the relist's
// differences may not take to the next (a record created and deleted
// between the two would stay). Called with h.mu held.
func (h *Hub) inGap(from int64) bool {
	for _, g := range h.mu.gaps {
		if from > g.from && from < g.to {
			return true
		}
	}
	return false
}

// relistEvents returns the changes d (what a relist b changed in the
// cache) as events: puts carrying the relist's stored bytes, then
// deletes.
func relistEvents(d cache.Diff, b cache.Batch) []cache.Event {
	changed := len(d.Added) + len(d.Updated)
	if changed+len(d.Removed) == 0 {
		return nil
	}
	elems := make(map[*registryv1.Instance][]byte, changed)
	for _, in := range d.Added {
		elems[in] = nil
	}
	for _, in := range d.Updated {
		elems[in] = nil
	}
	if len(b.Encoded) == len(b.Instances) {
		for i, in := range b.Instances {
			if _, ok := elems[in]; ok {
				elems[in] = b.Encoded[i]
			}
		}
	}
	evs := make([]cache.Event, 0, changed+len(d.Removed))
	for _, l := range [][]*registryv1.Instance{d.Added, d.Updated} {
		for _, in := range l {
			evs = append(evs, cache.Event{Type: cache.Put, Service: in.Service, ID: in.Id, Instance: in, Encoded: elems[in]})
		}
	}
	for _, k := range d.Removed {
		evs = append(evs, cache.Event{Type: cache.Delete, Service: k.Service, ID: k.ID})
	}
	return evs
}

// Subscribe registers a subscriber of service ("" for all) that has seen
// everything up to from (0: nothing) of epoch ep ("": this hub's). Its
// first unit is a snapshot (from 0, or a reset when from is older than
// the ring, or a new-epoch reset when ep is an epoch etcd has left), or the
// missed transactions. A from ahead of this regnode, or an ep etcd has
// moved to and this regnode has not yet, waits up to CatchUpTimeout, then
// fails with ErrBehind.
func (h *Hub) Subscribe(ctx context.Context, service string, from int64, ep string) (*Sub, error) {
	if service != "" {
		if err := record.ValidService(service); err != nil {
			return nil, err
		}
	}
	if from < 0 {
		return nil, &record.FieldError{Field: "from_revision", Reason: fmt.Sprintf("%d is negative", from)}
	}
	select {
	case <-h.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	deadline := time.NewTimer(h.cfg.CatchUpTimeout)
	defer deadline.Stop()
	gone := false // ep is an epoch etcd has left
	for {
		changed := h.tick.Load().changed // before h.mu: a change after it closes this
		h.mu.Lock()
		if h.mu.closed {
			h.mu.Unlock()
			return nil, ErrClosed
		}
		if ep == "" || ep == h.mu.epoch {
			if from <= h.mu.rev {
				break // still holding h.mu
			}
		} else {
			// Which of the two epochs is etcd's? Ask it: a subscriber
			// may come from a regnode that saw the restore first.
			mine := h.mu.epoch
			h.mu.Unlock()
			cur, _, err := epoch.Read(clientv3.WithRequireLeader(ctx), h.cfg.Client, h.epochKey)
			if err != nil {
				return nil, err
			}
			h.mu.Lock()
			if h.mu.epoch == mine && cur == mine {
				gone = true
				break // still holding h.mu
			}
			if h.mu.epoch != mine {
				h.mu.Unlock()
				continue // the hub moved meanwhile: look again
			}
			// etcd is on an epoch this hub has not reached: wait for it.
		}
		rev, mine := h.mu.rev, h.mu.epoch
		h.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			if ep != "" && ep != mine {
				return nil, fmt.Errorf("%w: asked for epoch %s, at epoch %s after %s", ErrBehind, ep, mine, h.cfg.CatchUpTimeout)
			}
			return nil, fmt.Errorf("%w: asked for %d, at %d after %s", ErrBehind, from, rev, h.cfg.CatchUpTimeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// Holding h.mu: decide the first unit from what is O(1) to read
	// (the cache's snapshot, or where the ring resumes), join the feed,
	// and build the unit after letting go.
	f := h.mu.feeds[service]
	if f == nil {
		f = newFeed(service, h.store)
		h.mu.feeds[service] = f
	}
	s := &Sub{h: h, f: f, notify: make(chan struct{}, 1), done: make(chan struct{}), confirms: h.tick.Load().confirms}
	snap, cur, rev := h.cache.Snapshot(), h.mu.epoch, h.mu.rev
	var (
		tail            []cache.Batch
		snapshot        = true
		reset, newEpoch bool
	)
	switch {
	case from == 0:
	case gone:
		reset, newEpoch = true, true
		h.resetSent("new-epoch")
	case from >= h.mu.ringStart && !h.inGap(from):
		snapshot = false
		ring := h.mu.ring
		tail = ring[sort.Search(len(ring), func(i int) bool { return ring[i].Revision > from }):]
	default:
		reset = true
		h.resetSent("ring")
	}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	h.mu.subs++
	h.subscribersChanged()
	h.mu.Unlock()

	if snapshot {
		u, err := f.snapshot(snap, cur, reset, newEpoch)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.first = u
	} else {
		var evs []cache.Event
		for _, b := range tail {
			evs = append(evs, filter(service, b.Events)...)
		}
		s.first = &Unit{b: cache.Batch{Revision: rev, Epoch: cur, Events: evs}}
	}
	s.sent, s.epoch = rev, cur
	return s, nil
}

func (h *Hub) resetSent(reason string) {
	if h.cfg.OnReset != nil {
		h.cfg.OnReset(reason)
	}
}

// current is the cache's snapshot and its epoch, read together.
func (h *Hub) current() (*cache.Snapshot, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cache.Snapshot(), h.mu.epoch
}

func filter(service string, evs []cache.Event) []cache.Event {
	if service == "" {
		return evs
	}
	var out []cache.Event
	for _, e := range evs {
		if e.Service == service {
			out = append(out, e)
		}
	}
	return out
}

// Epoch is the epoch of the hub's cache ("" before the first snapshot).
func (h *Hub) Epoch() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.epoch
}

// Revision is the revision of the hub's cache.
func (h *Hub) Revision() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.rev
}

// WaitRevision waits until the hub's cache is at rev or later, and
// returns the cache's snapshot then with its epoch. It fails with
// ctx's error, or ErrClosed once the hub stopped.
func (h *Hub) WaitRevision(ctx context.Context, rev int64) (*cache.Snapshot, string, error) {
	for {
		changed := h.tick.Load().changed
		h.mu.Lock()
		snap, ep, closed := h.cache.Snapshot(), h.mu.epoch, h.mu.closed
		h.mu.Unlock()
		switch {
		case closed:
			return nil, "", ErrClosed
		case snap.Revision() >= rev:
			return snap, ep, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, "", fmt.Errorf("wait for revision %d, at %d: %w", rev, snap.Revision(), ctx.Err())
		}
	}
}

// Snapshot is the hub's cache as it is now.
func (h *Hub) Snapshot() *cache.Snapshot { return h.cache.Snapshot() }

// Changed returns a channel closed when the hub next publishes a tick:
// a transaction applied to its cache, or etcd's progress. A consumer that
// reads the cache as a whole (the xDS server) waits on it instead of
// subscribing: it is no subscriber, so it is not counted as one.
func (h *Hub) Changed() <-chan struct{} { return h.tick.Load().changed }

// Subscribers is the number of subscribers.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.subs
}

func (h *Hub) remove(s *Sub) {
	h.mu.Lock()
	f := s.f
	f.mu.Lock()
	_, ok := f.subs[s]
	delete(f.subs, s)
	if ok && len(f.subs) == 0 && h.mu.feeds[f.service] == f {
		delete(h.mu.feeds, f.service)
	}
	f.mu.Unlock()
	if ok {
		h.mu.subs--
		h.subscribersChanged()
	}
	h.mu.Unlock()
}

// subscribersChanged tells OnSubscribers the count; h.mu is held, so that
// the calls come in the order of the changes. Called after h.mu is
// released, two Subscribes racing could report 2 and then 1, and the
// gauge would show 1 of 2 subscribers until the next change.
func (h *Hub) subscribersChanged() {
	if h.cfg.OnSubscribers != nil {
		h.cfg.OnSubscribers(h.mu.subs)
	}
}

// PutsSince returns, by service, the records put after revision from up
// to the hub's current revision, in order, from the ring; complete is
// false when the ring no longer holds them all (from is older than the
// ring, or inside a relist). A consumer that follows whole snapshots
// (the xDS server) reads from it what it folded: a record put and then
// deleted between two of its snapshots (a deregistration's DRAINING mark).
func (h *Hub) PutsSince(from int64) (puts map[string][]*registryv1.Instance, complete bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	complete = from >= h.mu.ringStart && !h.inGap(from)
	i := sort.Search(len(h.mu.ring), func(i int) bool { return h.mu.ring[i].Revision > from })
	for _, b := range h.mu.ring[i:] {
		for _, ev := range b.Events {
			if ev.Type != cache.Put || ev.Instance == nil {
				continue
			}
			if puts == nil {
				puts = map[string][]*registryv1.Instance{}
			}
			puts[ev.Service] = append(puts[ev.Service], ev.Instance)
		}
	}
	return puts, complete
}
