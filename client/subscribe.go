package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/backoff"
	"github.com/regcluster/registry/internal/chunk"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Change is what a subscription delivers, in revision order. Its Reset is
// true only for a snapshot that replaced a view already shown (not for the
// first one).
type Change struct {
	cache.Diff
	// Snapshot is true when the subscription (re)started from a complete
	// state; Instances then holds all of it. A consumer that folds diffs
	// replaces its state with Instances.
	Snapshot  bool
	NewEpoch  bool
	Instances []*registryv1.Instance
	// Progress is true when nothing changed but the revision moved.
	Progress bool
}

// SubscribeOptions tune a subscription. A zero field takes the default
// its comment states (DefaultSubscribeOptions has them all); Subscribe
// refuses what Validate refuses.
type SubscribeOptions struct {
	// OnChange, if set, is called with every change, in order, on a
	// goroutine of this subscription's own (the stream's goroutine only
	// queues the change): never concurrently with itself or with
	// OnConnection. A slow or blocked OnChange delays only this
	// subscription's callbacks: its view (Instances, Snapshot, Revision,
	// Freshness), the Client's other subscriptions, the resolvers (of
	// this service too) and the stream go on. A change is handed over
	// once it is in the view, which may by then be newer still.
	//
	// Changes wait for it in a queue of at most CallbackBacklog. When one
	// more does not fit, every change waiting is dropped and the next one
	// OnChange gets is a Snapshot of the view at that moment (Reset, and
	// NewEpoch if a dropped change was), as the Changes channel does;
	// Stats().Coalesced and registry_client_callbacks_coalesced_total
	// count these, and the first of an episode (until OnChange catches
	// up) is logged at warn. Consecutive Progress changes still waiting
	// are merged into the latest: heartbeats alone never overflow it.
	// After Close returns no call starts (see Close).
	OnChange func(Change)
	// CallbackBacklog is how many changes (and connection changes) may
	// wait for OnChange and OnConnection before they are coalesced into a
	// snapshot (0: DefaultCallbackBacklog; negative is refused).
	CallbackBacklog int
	// Changes, if > 0, makes Changes() a channel with this buffer (0: no
	// channel; negative is refused). A reader
	// that falls behind is not allowed to stall the subscription: changes
	// that do not fit are dropped and the next one delivered is a Snapshot
	// of the whole current state.
	Changes int
	// MinBackoff and MaxBackoff bound the wait between reconnects (0: 50ms
	// and 2s, or MinBackoff if larger: a subscriber is back within seconds
	// of a regnode's return), jittered. MaxBackoff must be at least
	// MinBackoff.
	MinBackoff, MaxBackoff time.Duration

	// Liveness (liveness.go).

	// ReceiveDeadline: a stream that brings no message for this long is
	// given up (Connected turns false) and the subscription resumes at
	// once on another regnode if one answers (default
	// DefaultReceiveDeadline; at least MinReceiveDeadline).
	ReceiveDeadline time.Duration
	// OnConnection, if set, is called each time Freshness().Connected
	// changes, with the new freshness, in order with OnChange and on the
	// same goroutine (see OnChange: never concurrently with it, never on
	// the stream's goroutine). Connection changes dropped by a coalescing
	// leave one call after the snapshot, with the latest, if Connected
	// then differs from what OnConnection was last told.
	OnConnection func(Freshness)
}

// Freshness says how current a subscription's view is.
type Freshness struct {
	// Known is false until the first snapshot: an unknown list, not an
	// empty one.
	Known bool
	// Revision is the etcd revision the view is confirmed at.
	Revision int64
	// ConfirmedAt is when a regnode last confirmed Revision (an event,
	// snapshot or progress message).
	ConfirmedAt time.Time
	// Connected is true while the stream (the Client's Subscribe stream,
	// or the Subscription's Watch stream) is open and has delivered a
	// message within the receive deadline.
	Connected bool
	// FromDisk is true while the view is the last-known-good one loaded
	// from Config.CacheDir because no regnode had answered yet; the first
	// live snapshot replaces it (a Reset change) and turns it false.
	FromDisk bool
	// DiskSavedAt is when the disk view was saved (its age is
	// time.Since(DiskSavedAt)); zero unless FromDisk. ConfirmedAt is the
	// same time while FromDisk.
	DiskSavedAt time.Time
	// Err is LastError as it was at this freshness: in the one
	// OnConnection gets, why the stream was lost (nil while Connected).
	// OnConnection runs behind the stream, which may have moved on by
	// then: Err, not a call to LastError, tells why this change happened.
	Err error
	// LastResort is how many instances the service's registry:///
	// channels call as a last resort now: instances that vanished by
	// lease expiry, most of the service at once (an etcd stall, restore
	// or partition; never a deregistration or a drain), offered because
	// nothing else is routable (Config.LastResort). They are not in the
	// view (Instances). 0 for a subscription of every service.
	LastResort int
	// LastResortUntil is when that last resort ends at the latest (its
	// grace); zero while LastResort is 0. A re-registration of the
	// vanished instances ends it at once.
	LastResortUntil time.Time
}

// Subscription follows the instances of one service (or all) through any
// regnode of the client's list, in a local cache whose revision never goes
// back: it resumes from its last revision after a disconnect, takes reset
// snapshots, and refuses anything older than what it has shown.
type Subscription struct {
	c       *Client
	service string
	started time.Time // when Subscribe made it: a resolver's connect timeout runs from here
	opts    SubscribeOptions
	cache   *cache.Cache
	ready   chan struct{}
	changes chan Change
	cancel  context.CancelFunc
	// halted is closed when nothing is applied and no callback starts any
	// more (what Close waits for); done, once the last callback returned
	// too (Done): by the last of stopped and the callbacks' goroutine to
	// end (unfinished counts them).
	halted     chan struct{}
	done       chan struct{}
	unfinished atomic.Int32
	deliver    *delivery // the callbacks' queue and goroutine (deliver.go); nil without callbacks

	// applyMu serializes applying to the cache and telling listeners: the
	// stream's goroutine and the disk loader (diskcache.go) both apply;
	// the callbacks' goroutine takes it to snapshot a coalescing
	// (deliver.go).
	applyMu sync.Mutex
	disk    *diskCache     // nil without Config.CacheDir or for all services
	lr      *lastResort    // nil for all services (lastresort.go)
	aux     sync.WaitGroup // the disk loader and writer, waited for by run

	mu struct {
		sync.Mutex
		fresh     Freshness
		listeners map[int]func(Change)
		next      int
		overflow  bool // the Changes channel dropped a change: the next is a snapshot
		overEpoch bool // one it dropped was NewEpoch: so is that snapshot
		lastErr   error
		resets    int
		reconnect int
		resyncs   int
		stream    context.CancelFunc // cancels the current Watch stream

		// The resume token's epoch and the REVISION_AHEAD answers (unit.go).
		epoch  string
		ahead  int  // REVISION_AHEAD answers in a row
		afresh bool // the next stream subscribes afresh

		// The view is the disk one (diskcache.go), saved on diskEpoch.
		fromDisk  bool
		diskEpoch string
	}
	// live is the liveness state, owned by the subscription's goroutine.
	live struct {
		stalled string // the regnode whose stream last stalled: the next avoids it
	}
	wake chan struct{} // resync: cut the wait before the next stream short
}

// resync ends the current stream, or the wait before the next one; the
// subscription resumes at once from its revision, on whichever regnode
// answers.
func (s *Subscription) resync() {
	if s.c.mux != nil {
		s.mu.Lock()
		s.mu.resyncs++
		s.mu.Unlock()
		s.c.mux.resync()
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.resyncs++
	if s.mu.stream != nil {
		s.mu.stream()
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Subscribe starts following service ("" for every service) and returns at
// once; Ready tells when the first snapshot is in. The subscription lives
// until its Close, the Client's Close, or until ctx ends; after the
// Client's Close it returns ErrClosed.
func (c *Client) Subscribe(ctx context.Context, service string, opts SubscribeOptions) (*Subscription, error) {
	if service != "" {
		if err := record.ValidService(service); err != nil {
			return nil, err
		}
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	s := &Subscription{c: c, service: service, started: time.Now(), opts: opts, cache: cache.New(), ready: make(chan struct{}),
		halted: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1)}
	s.mu.listeners = map[int]func(Change){}
	s.lr = newLastResort(c, service)
	s.unfinished.Store(1)
	if s.deliver = newDelivery(s); s.deliver != nil {
		s.unfinished.Add(1)
	}
	if opts.Changes > 0 {
		s.changes = make(chan Change, opts.Changes)
	}
	if c.cacheDir != "" && service != "" {
		d, err := newDiskCache(c.cacheDir, service, c.cacheMaxAge)
		if err != nil {
			return nil, err
		}
		s.disk = d
	}
	ctx, s.cancel = context.WithCancel(ctx)
	if err := c.adoptSubscription(s); err != nil { // Client.Close stops it
		s.cancel()
		return nil, err
	}
	if c.mux != nil {
		// On the Client's one stream (mux.go): no goroutine of its own.
		if err := c.mux.attach(s); err != nil {
			s.cancel()
			c.forgetSubscription(s)
			return nil, err
		}
	}
	if s.disk != nil {
		s.aux.Add(2) // before anything that waits for them, even if ctx already ended
	}
	if c.mux != nil {
		context.AfterFunc(ctx, func() {
			c.mux.detach(s)
			s.stopped()
		})
	} else {
		go s.run(ctx) // subscribing starts now, whatever the disk holds
	}
	if s.disk != nil {
		go func() { defer s.aux.Done(); s.loadDisk() }()
		go func() { defer s.aux.Done(); s.disk.run(s) }()
	}
	return s, nil
}

// Service is the service followed ("" for all).
func (s *Subscription) Service() string { return s.service }

// Ready is closed when the first snapshot has been applied: a live one,
// or the last-known-good view from Config.CacheDir (Freshness.FromDisk).
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// WaitReady waits for the first snapshot or ctx.
func (s *Subscription) WaitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the first snapshot of %q: %w (last error: %v)", s.service, ctx.Err(), s.LastError())
	}
}

// Instances returns the instances of service in the local view, sorted by
// id; lock-free, and allocation-free but for the first read after a batch
// changed a large service (see cache.Snapshot.Instances); the slice is
// shared and must not be modified. For a subscription of one service, Instances(Service()).
func (s *Subscription) Instances(service string) []*registryv1.Instance {
	return s.cache.Instances(service)
}

// Snapshot is the whole local view at one revision.
func (s *Subscription) Snapshot() *cache.Snapshot { return s.cache.Snapshot() }

// Revision is the revision of the local view; it never decreases (except
// across a NewEpoch change, when etcd itself was restored).
func (s *Subscription) Revision() int64 { return s.cache.Revision() }

// Freshness says whether the view is known and when it was last confirmed.
func (s *Subscription) Freshness() Freshness {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.mu.fresh
	f.Err = s.mu.lastErr
	return f
}

// LastError is the last stream failure, nil while connected.
func (s *Subscription) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.lastErr
}

// Changes is the channel of changes (nil unless SubscribeOptions.Changes).
// It is never closed; stop reading after Close.
func (s *Subscription) Changes() <-chan Change { return s.changes }

// Stats counts what the subscription went through.
type Stats struct {
	Resets, Reconnects int
	// Resyncs counts the resyncs asked of it (by a resolver's ResolveNow).
	Resyncs int
	// Coalesced counts the times OnChange (or OnConnection) fell more
	// than CallbackBacklog changes behind and what waited for it was
	// replaced by one snapshot.
	Coalesced int
	Cache     cache.Stats
}

// Stats returns the subscription's counters.
func (s *Subscription) Stats() Stats {
	coalesced := s.deliver.coalescings()
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Resets: s.mu.resets, Reconnects: s.mu.reconnect, Resyncs: s.mu.resyncs, Coalesced: coalesced, Cache: s.cache.Stats()}
}

// listen adds a listener of changes, called on the goroutine that
// applies, under applyMu, right after each change is applied (the
// resolvers': they must follow the view whatever a user callback does,
// and they never block; see deliver.go); the returned func removes it.
func (s *Subscription) listen(f func(Change)) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.mu.next
	s.mu.next++
	s.mu.listeners[id] = f
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.mu.listeners, id)
	}
}

// Close stops the subscription: when it returns nothing is applied to
// the view any more, the changes still waiting for OnChange are dropped,
// no callback (OnChange, OnConnection) starts again, and its goroutines
// are stopped and waited for, except a callback already running, if one
// is: that one (the last) may be blocked for good, and Close must neither
// hang on it nor deadlock when a callback calls Close itself. Done is
// closed once that callback has returned; to know that none runs any
// more, wait on Done after Close (not from a callback, and with the bound
// of your choosing).
func (s *Subscription) Close() {
	s.cancel()
	<-s.halted
}

// Done is closed when the subscription has stopped (as Close does) and no
// callback of it is running: none will ever be called again.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// finished is called by stopped and by the callbacks' goroutine as they
// end: the last closes done.
func (s *Subscription) finished() {
	if s.unfinished.Add(-1) == 0 {
		close(s.done)
	}
}

// stopped ends a subscription that no longer applies anything: its
// callbacks stop, the disk writer makes its last write, then done (unless
// a callback still runs: the callbacks' goroutine closes it as it ends)
// and halted.
func (s *Subscription) stopped() {
	if s.deliver != nil {
		s.deliver.stop()
	}
	s.stopLastResort()
	if s.disk != nil {
		close(s.disk.stop) // nothing is applied any more: the writer's last write
		s.aux.Wait()
		s.c.metrics.DiskCacheReplaced(s.service)
	}
	s.c.forgetSubscription(s) // before halted: Client.Close waits on halted
	s.finished()              // before halted: once Close returns, Done is closed unless a callback runs
	close(s.halted)
}

// run follows the subscription on Watch streams of its own
// (Config.WatchPerSubscription).
func (s *Subscription) run(ctx context.Context) {
	defer s.stopped()
	for attempt := 0; ; attempt++ {
		err := s.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		s.setConnected(false, err)
		s.mu.Lock()
		s.mu.reconnect++
		s.mu.Unlock()
		var stall *stallError
		if errors.As(err, &stall) {
			// A stalled regnode is not overloaded, just gone: resume on
			// another at once.
			s.c.log.Warn("subscription stalled; resuming on another regnode", "service", s.service, "revision", s.cache.Revision(), "err", err)
			s.live.stalled = stall.peer
			attempt = -1
			continue
		}
		if err == nil {
			attempt = 0
		}
		s.c.log.Debug("subscription stream ended; resuming", "service", s.service, "revision", s.cache.Revision(), "err", err)
		t := time.NewTimer(backoff.Exponential{Min: s.opts.MinBackoff, Max: s.opts.MaxBackoff}.Delay(attempt))
		select {
		case <-t.C:
		case <-s.wake:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

var errStaleStream = errors.New("regnode sent a revision older than this subscription's view")

// stream follows one Watch stream until it breaks; nil means it made
// progress before breaking (so the retry starts with a short wait).
func (s *Subscription) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.mu.stream = cancel
	s.mu.Unlock()
	// The resume token is (epoch, revision); after every regnode said it
	// is ahead of them, subscribe afresh (unit.go).
	from, ep, fresh := s.cache.Revision(), s.Epoch(), s.takeFresh()
	if s.Freshness().FromDisk {
		from, ep = 0, "" // a disk view is no resume token: its snapshot replaces it
	}
	if fresh {
		from, ep = 0, ""
		defer func() { s.keepFresh(fresh) }() // still due if no snapshot came
	}
	note := &pickNote{avoid: s.live.stalled}
	ws, err := s.c.api.Watch(withPickNote(sctx, note), &registryv1.WatchRequest{Service: s.service, FromRevision: from, Epoch: ep})
	if err != nil {
		return err
	}
	at := note.Picked()
	deadline := newDeadline(s.opts.ReceiveDeadline, cancel, s.c.conns.unreadOf(ws.Context()))
	defer deadline.disarm()
	var (
		units   chunk.Joiner // joins chunks: a unit is applied whole
		gotSome bool
	)
	for {
		deadline.arm()
		resp, err := ws.Recv()
		deadline.disarm()
		if err != nil {
			if stall := deadline.err(at); stall != nil {
				return stall
			}
			s.noteAhead(err)
			if status.Code(err) == codes.InvalidArgument {
				s.c.log.Error("subscription refused", "service", s.service, "err", err)
			}
			if gotSome {
				s.mu.Lock()
				s.mu.lastErr = err
				s.mu.Unlock()
				return nil
			}
			return err
		}
		if !gotSome {
			s.live.stalled = "" // a regnode answers
			s.setConnected(true, nil)
		}
		gotSome = true
		unit, err := units.Add(resp)
		if err != nil {
			return err
		}
		if unit == nil {
			continue // more chunks of this unit follow
		}
		b, ok := toBatch(unit)
		if !ok {
			continue
		}
		if err := s.applyUnit(unit.Epoch, b, &fresh, nil); err != nil {
			return err
		}
	}
}

// applyUnit applies one live unit of epoch ep. st, if set, is the step
// the feed's cache took for b: taken as it is (cache.Replay) when this
// view is where the feed's was and b is applied unchanged, since a
// Subscription of the feed is then its copy; else b is applied.
func (s *Subscription) applyUnit(ep string, b cache.Batch, fresh *bool, st *cache.Step) error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if *fresh && b.Snapshot {
		// Replaces a view no regnode has: a new epoch for this view.
		b.Reset, b.NewEpoch, *fresh = s.cache.Revision() != 0, b.Revision < s.cache.Revision(), false
		st = nil
	}
	asGiven := b
	b, ok := s.fromDiskSnapshot(ep, b)
	if !ok {
		return nil
	}
	if b.Reset != asGiven.Reset || b.NewEpoch != asGiven.NewEpoch {
		st = nil
	}
	if err := s.checkEpoch(ep, b); err != nil {
		return err
	}
	if err := s.apply(b, nil, st); err != nil {
		return err
	}
	s.setEpoch(ep)
	if s.disk != nil {
		s.disk.mark(s.cache.Snapshot(), s.Epoch(), time.Now())
	}
	return nil
}

// apply applies b to the cache (or replays st, the step another cache
// took for b, if this view is where it started) and tells the listeners;
// disk is the view b was loaded from, nil for a live unit. The caller
// holds applyMu.
func (s *Subscription) apply(b cache.Batch, disk *diskView, st *cache.Step) error {
	var (
		diff cache.Diff
		err  error
		prev []*registryv1.Instance
	)
	if s.lr != nil {
		prev = s.cache.Instances(s.service) // immutable: the cache copies on write
	}
	if st != nil && s.cache.Replay(*st) {
		diff = st.Diff
	} else {
		diff, err = s.cache.Apply(b)
	}
	if err != nil {
		if errors.Is(err, cache.ErrStale) && !b.Snapshot && len(b.Events) > 0 && b.Revision <= s.cache.Revision() {
			// Duplicates of what we hold cannot hurt; anything else stale
			// means this stream is not following us: drop it.
			return nil
		}
		return fmt.Errorf("%w: %v", errStaleStream, err)
	}
	now := time.Now()
	s.mu.Lock()
	s.mu.fresh.Revision, s.mu.fresh.ConfirmedAt = s.cache.Revision(), now
	replaced := false
	switch {
	case disk != nil:
		s.mu.fresh.ConfirmedAt, s.mu.fresh.FromDisk, s.mu.fresh.DiskSavedAt = disk.saved, true, disk.saved
		s.mu.fromDisk, s.mu.diskEpoch = true, disk.epoch
	case b.Snapshot && s.mu.fromDisk:
		s.mu.fresh.FromDisk, s.mu.fresh.DiskSavedAt = false, time.Time{}
		s.mu.fromDisk, s.mu.diskEpoch, replaced = false, "", true
	}
	if b.Snapshot {
		s.mu.fresh.Known = true
		if b.Reset {
			s.mu.resets++
		}
	}
	s.mu.Unlock()
	if replaced {
		s.c.metrics.DiskCacheReplaced(s.service)
	}
	lrChanged := s.lr != nil && s.observeLastResort(b, prev, diff, disk != nil || replaced, now)
	if b.Snapshot {
		select {
		case <-s.ready:
		default:
			close(s.ready)
		}
	}
	ch := Change{Diff: diff, Snapshot: b.Snapshot, NewEpoch: b.NewEpoch, Progress: !b.Snapshot && diff.Empty()}
	ch.Reset = b.Reset // the regnode's flag: a snapshot that replaced a view already shown
	if b.Snapshot {
		ch.Instances = s.snapshotInstances()
	}
	tell := ch
	if lrChanged {
		tell.Progress = false // the resolvers' offer changed: a new view
	}
	s.tellListeners(tell)
	if s.deliver != nil {
		s.deliver.change(ch)
	}
	s.offer(ch)
	return nil
}

// tellListeners calls the listeners (listen) with ch. The caller holds
// applyMu.
func (s *Subscription) tellListeners(ch Change) {
	s.mu.Lock()
	listeners := make([]func(Change), 0, len(s.mu.listeners))
	for _, f := range s.mu.listeners {
		listeners = append(listeners, f)
	}
	s.mu.Unlock()
	for _, f := range listeners {
		f(ch)
	}
}

func (s *Subscription) snapshotInstances() []*registryv1.Instance {
	if s.service != "" {
		return s.cache.Instances(s.service)
	}
	return s.cache.Snapshot().All()
}

// offer puts ch on the Changes channel without ever blocking; after an
// overflow the next change delivered is a snapshot of the current state.
func (s *Subscription) offer(ch Change) {
	if s.changes == nil {
		return
	}
	s.mu.Lock()
	overflow, overEpoch := s.mu.overflow, s.mu.overEpoch
	s.mu.Unlock()
	if overflow {
		ch = Change{Diff: cache.Diff{Revision: s.cache.Revision(), Reset: true}, Snapshot: true, NewEpoch: ch.NewEpoch || overEpoch,
			Instances: s.snapshotInstances()}
	}
	select {
	case s.changes <- ch:
		overflow, overEpoch = false, false
	default:
		overflow, overEpoch = true, overEpoch || ch.NewEpoch
	}
	s.mu.Lock()
	s.mu.overflow, s.mu.overEpoch = overflow, overEpoch
	s.mu.Unlock()
}
