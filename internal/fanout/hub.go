// Package fanout serves every subscriber of a regnode from ONE etcd watch:
// the watch feeds a local cache and a ring of recent transactions, and each
// subscriber is served from memory. A subscriber resuming from a revision
// still in the ring gets the missed transactions; an older one gets a reset
// snapshot; one of another epoch (etcd was restored since, see
// internal/epoch) gets a new-epoch reset snapshot; one ahead of this regnode
// on its epoch waits for it to catch up, or is told to try another. A subscriber too slow to keep up with its bounded queue is
// reset (never silently skipped), and never blocks the others.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/cache"
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

// Config configures a Hub. Zero fields take the defaults on each.
type Config struct {
	// Client is the etcd client (required).
	Client *clientv3.Client
	// Prefix is the registry key prefix (default record.DefaultPrefix).
	Prefix string
	// RingSize bounds the recent events kept for resuming subscribers
	// (default 10000).
	RingSize int
	// QueueSize bounds each subscriber's queue of messages; a subscriber
	// that falls further behind is reset (default 1024).
	QueueSize int
	// CatchUpTimeout bounds how long a subscriber ahead of this regnode
	// waits for it (default 2s: below the SDK's 3 s receive deadline).
	CatchUpTimeout time.Duration
	// ProgressInterval is passed to the watcher (default 1s).
	ProgressInterval time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Hooks for metrics; any may be nil.
	OnJunk         func(key string, err error)
	OnWatchRestart func(reason string, err error)
	OnReset        func(reason string) // a subscriber is due a reset snapshot
	OnStale        func()              // a batch the cache refused
	OnSubscribers  func(n int)         // the number of subscribers changed
}

// Hub is the fan-out. Run it once; Subscribe from any goroutine.
type Hub struct {
	cfg   Config
	log   *slog.Logger
	cache *cache.Cache
	w     *watch.Watcher
	// epochKey is where etcd keeps the epoch (see internal/epoch).
	epochKey string

	ready     chan struct{}
	readyOnce sync.Once

	mu struct {
		sync.Mutex
		ring      []entry // transactions after ringStart, oldest first
		ringStart int64   // the ring holds every transaction after this revision
		events    int     // events in ring
		rev       int64   // revision of the cache
		epoch     string  // epoch of the cache
		changed   chan struct{}
		subs      map[*Sub]struct{}
		closed    bool
	}
}

type entry struct {
	rev    int64
	events []cache.Event
}

// New returns a Hub; call Run to start it.
func New(cfg Config) (*Hub, error) {
	if cfg.RingSize <= 0 {
		cfg.RingSize = 10000
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1024
	}
	if cfg.CatchUpTimeout <= 0 {
		cfg.CatchUpTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	key := epoch.Key(cfg.Prefix)
	w, err := watch.New(watch.Config{Client: cfg.Client, Prefix: cfg.Prefix, Logger: cfg.Logger, EpochKey: key,
		ProgressInterval: cfg.ProgressInterval, OnJunk: cfg.OnJunk, OnRestart: cfg.OnWatchRestart})
	if err != nil {
		return nil, err
	}
	h := &Hub{cfg: cfg, log: cfg.Logger, cache: cache.New(), w: w, epochKey: key, ready: make(chan struct{})}
	h.mu.subs = map[*Sub]struct{}{}
	h.mu.changed = make(chan struct{})
	return h, nil
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
	subs := h.mu.subs
	h.mu.subs = map[*Sub]struct{}{}
	close(h.mu.changed)
	h.mu.Unlock()
	for s := range subs {
		s.close(ErrClosed)
	}
	if h.cfg.OnSubscribers != nil {
		h.cfg.OnSubscribers(0)
	}
	return err
}

// apply is the watcher's delivery: cache first, then the ring, then every
// subscriber's queue, all under h.mu so a new subscriber sees no gap.
func (h *Hub) apply(b cache.Batch) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := h.cache.Apply(b); err != nil {
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
	close(h.mu.changed)
	h.mu.changed = make(chan struct{})
	switch {
	case b.Snapshot:
		h.mu.ring, h.mu.events, h.mu.ringStart = nil, 0, b.Revision
		first := false
		h.readyOnce.Do(func() { close(h.ready); first = true })
		if !first {
			reason := "etcd-relist"
			if b.NewEpoch {
				reason = "new-epoch"
			}
			for s := range h.mu.subs {
				s.reset(reason, b.NewEpoch)
			}
		}
		return nil
	case len(b.Events) > 0:
		h.mu.ring = append(h.mu.ring, entry{rev: b.Revision, events: b.Events})
		h.mu.events += len(b.Events)
		for h.mu.events > h.cfg.RingSize && len(h.mu.ring) > 1 {
			h.mu.ringStart = h.mu.ring[0].rev
			h.mu.events -= len(h.mu.ring[0].events)
			h.mu.ring[0] = entry{}
			h.mu.ring = h.mu.ring[1:]
		}
	}
	for s := range h.mu.subs {
		s.push(b.Revision, h.mu.epoch, b.Events)
	}
	return nil
}

// Message is one thing to send a subscriber: a snapshot, a transaction's
// events, or progress, with the revision it brings the subscriber to.
type Message struct {
	Revision int64
	// Epoch names the etcd history Revision belongs to.
	Epoch string
	// Snapshot, when true, is the complete state at Revision; Instances
	// holds it.
	Snapshot  bool
	Reset     bool
	NewEpoch  bool
	Instances []*registryv1.Instance
	// Events of one or more transactions (empty with !Snapshot: progress).
	Events []cache.Event
}

// Subscribe registers a subscriber of service ("" for all) that has seen
// everything up to from (0: nothing) of epoch ep ("": this hub's). Its
// first message is a snapshot (from 0, or a reset when from is older than
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
		changed, rev, mine := h.mu.changed, h.mu.rev, h.mu.epoch
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
	defer h.mu.Unlock()
	s := &Sub{h: h, service: service, notify: make(chan struct{}, 1), done: make(chan struct{})}
	switch {
	case from == 0:
		s.first = h.snapshot(service, false, false)
	case gone:
		s.first = h.snapshot(service, true, true)
		h.resetSent("new-epoch")
	case from >= h.mu.ringStart:
		var evs []cache.Event
		for _, e := range h.mu.ring {
			if e.rev > from {
				evs = append(evs, filter(service, e.events)...)
			}
		}
		s.first = &Message{Revision: h.mu.rev, Epoch: h.mu.epoch, Events: evs}
	default:
		s.first = h.snapshot(service, true, false)
		h.resetSent("ring")
	}
	s.sent = s.first.Revision
	h.mu.subs[s] = struct{}{}
	if h.cfg.OnSubscribers != nil {
		h.cfg.OnSubscribers(len(h.mu.subs))
	}
	return s, nil
}

func (h *Hub) resetSent(reason string) {
	if h.cfg.OnReset != nil {
		h.cfg.OnReset(reason)
	}
}

// snapshot is the cache's state; called with h.mu held, so that the epoch
// is the one of the state.
func (h *Hub) snapshot(service string, reset, newEpoch bool) *Message {
	snap := h.cache.Snapshot()
	m := &Message{Revision: snap.Revision(), Epoch: h.mu.epoch, Snapshot: true, Reset: reset, NewEpoch: newEpoch}
	if service == "" {
		m.Instances = snap.All()
	} else {
		m.Instances = snap.Instances(service)
	}
	return m
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

// Subscribers is the number of subscribers.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.mu.subs)
}

func (h *Hub) remove(s *Sub) {
	h.mu.Lock()
	delete(h.mu.subs, s)
	n := len(h.mu.subs)
	h.mu.Unlock()
	if h.cfg.OnSubscribers != nil {
		h.cfg.OnSubscribers(n)
	}
}
