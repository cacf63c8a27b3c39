package client

import (
	"context"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/resolver"

	"github.com/regcluster/registry/cache"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Scheme is the gRPC target scheme of the registry's resolver:
// grpc.NewClient("registry:///orders", grpc.WithResolvers(c.ResolverBuilder())).
const Scheme = "registry"

// Address attribute keys set on every resolved address.
type attrKey string

const (
	// AttrWeight holds the instance's effective weight (uint32).
	AttrWeight attrKey = "registry.weight"
	// AttrZone holds the instance's zone (string).
	AttrZone attrKey = "registry.zone"
	// AttrHealth holds the instance's health state (registryv1.HealthState).
	AttrHealth attrKey = "registry.health"
	// AttrID holds the instance id (string).
	AttrID attrKey = "registry.id"
	// AttrRevision, on a resolver.State's Attributes, holds the etcd
	// revision of the view the state was made from (int64).
	AttrRevision attrKey = "registry.revision"
)

// StateRevision is the etcd revision of the view a resolver state of
// this package was made from (0 if it carries none). States reach grpc in
// revision order (across an etcd restore, a NewEpoch view starts over).
func StateRevision(s resolver.State) int64 {
	r, _ := s.Attributes.Value(AttrRevision).(int64)
	return r
}

// Weight returns the effective weight of a resolved address (0 if unset).
func Weight(a resolver.Address) uint32 {
	w, _ := a.BalancerAttributes.Value(AttrWeight).(uint32)
	return w
}

// Zone returns the zone of a resolved address.
func Zone(a resolver.Address) string {
	z, _ := a.BalancerAttributes.Value(AttrZone).(string)
	return z
}

// Health returns the health state of a resolved address.
func Health(a resolver.Address) registryv1.HealthState {
	h, _ := a.BalancerAttributes.Value(AttrHealth).(registryv1.HealthState)
	return h
}

// ResolverBuilder returns a gRPC resolver builder for Scheme that follows
// the routable instances of the service named by the target's path. Every
// resolver of one service shares one subscription of this Client, kept for
// a while after the last resolver closes, so grpc-go's idle mode can
// rebuild resolvers cheaply.
func (c *Client) ResolverBuilder() resolver.Builder { return &builder{c: c} }

type builder struct{ c *Client }

func (b *builder) Scheme() string { return Scheme }

func (b *builder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	service := strings.TrimPrefix(t.URL.Path, "/")
	if service == "" {
		service = t.URL.Opaque
	}
	if err := record.ValidService(service); err != nil {
		return nil, err
	}
	sub, limiter, release, err := b.c.acquire(service)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &regResolver{cc: cc, sub: sub, service: service, release: release, resync: limiter,
		kick: make(chan struct{}, 1), now: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	// Changes come in revision order on the subscription's goroutine;
	// each one's view is built there, from the cache it just updated.
	r.unlisten = sub.listen(func(ch Change) {
		if ch.NewEpoch {
			r.epoch++ // etcd restored: revisions start over, and are newer
		}
		if !ch.Progress {
			snap := sub.Snapshot() // the state this change made: only this goroutine applies
			r.offer(r.view(r.epoch, snap, waitState{}))
		}
	})
	select {
	case <-sub.Ready():
		// Read after listening, so no change falls between; if a change
		// beat this read, offer keeps the newer of the two.
		r.offer(r.view(0, sub.Snapshot(), waitState{}))
	default:
		// No view yet: say so (an unknown list, not an empty one). The
		// channel is CONNECTING and calls wait for the first snapshot,
		// whose listener call offers a newer view; run says when the
		// registry is unreached or refuses (firstview.go).
		r.waiting = true
		r.offerWaiting(r.waitingAt(time.Now()))
	}
	r.push() // at once, before the pusher starts: a rebuilt resolver is served without a wait
	go r.run(ctx)
	return r, nil
}

// regResolver feeds one gRPC ClientConn. Views of the subscription are
// offered from any goroutine and kept only if newer than the one waiting;
// one goroutine (run) owns UpdateState and pushes them in revision order,
// so grpc never gets an older list after a newer one.
type regResolver struct {
	cc       resolver.ClientConn
	sub      *Subscription
	service  string
	release  func()
	unlisten func()
	resync   *rate.Limiter // shared by the resolvers of the subscription
	epoch    int           // NewEpoch resets seen; only the listener touches it

	kick   chan struct{} // a view is waiting
	now    chan struct{} // grpc asked to re-resolve
	cancel context.CancelFunc
	done   chan struct{}

	mu struct {
		sync.Mutex
		next *view // the newest view offered and not yet pushed
	}
	pushed *view // the last view pushed; only the pushing goroutine touches it

	// Before the first view (firstview.go); Build, then run, touch these.
	waiting    bool      // Build found no view: run checks until one comes
	waitedOnce bool      // a waiting view was offered
	lastWait   waitState // the last one offered
	stage      int       // counts the waiting views offered
}

// view is the resolver state of the subscription at one revision.
// Epoch counts NewEpoch resets: a view of a later epoch is newer whatever
// its revision. A view of a snapshot (known) is newer than any view
// without one, which are ordered by stage: once known, a view is never
// replaced by "not known yet".
type view struct {
	known bool
	epoch int
	rev   int64
	lr    uint64 // the last resort's change count: at one revision, the later offer is newer
	stage int
	state resolver.State
}

func (v *view) newerThan(o *view) bool {
	switch {
	case o == nil:
		return true
	case v.known != o.known:
		return v.known
	case v.epoch != o.epoch:
		return v.epoch > o.epoch
	case v.rev != o.rev:
		return v.rev > o.rev
	case v.lr != o.lr:
		return v.lr > o.lr
	}
	return v.stage > o.stage
}

// view builds the state grpc gets for snap, tagged with its revision
// (StateRevision); snap is nil before the first snapshot, and w then says
// what the channel waits for.
func (r *regResolver) view(epoch int, snap *cache.Snapshot, w waitState) view {
	var insts []*registryv1.Instance
	var rev int64
	if snap != nil {
		insts, rev = snap.Instances(r.service), snap.Revision()
	}
	lastResort, lr := r.sub.lastResortOffer()
	st := resolverState(r.sub.c, r.service, insts, lastResort, snap != nil, w, r.cc)
	st.Attributes = st.Attributes.WithValue(AttrRevision, rev)
	return view{known: snap != nil, epoch: epoch, rev: rev, lr: lr, state: st}
}

// offer keeps v for the pusher unless a newer view is already waiting.
func (r *regResolver) offer(v view) {
	r.mu.Lock()
	if v.newerThan(r.mu.next) {
		r.mu.next = &v
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// push sends the waiting view to grpc if it is newer than the last one
// sent. Called by one goroutine at a time: Build before run starts, then
// run.
func (r *regResolver) push() {
	r.mu.Lock()
	v := r.mu.next
	r.mu.next = nil
	r.mu.Unlock()
	if v == nil || !v.newerThan(r.pushed) {
		return
	}
	r.pushed = v
	_ = r.cc.UpdateState(v.state)
}

// run owns UpdateState until Close.
func (r *regResolver) run(ctx context.Context) {
	defer close(r.done)
	var check <-chan time.Time // while no view: judge the wait again
	if r.waiting {
		t := time.NewTicker(firstViewCheck)
		defer t.Stop()
		check = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-check:
			if r.sub.Freshness().Known {
				check = nil // the listener offered it
				continue
			}
			r.offerWaiting(r.waitingAt(now))
		case <-r.kick:
			r.push()
		case <-r.now:
			// grpc calls ResolveNow whenever a subchannel fails: that is
			// news about a backend, not about the registry. Only a
			// subscription that is disconnected or unconfirmed for longer
			// than its deadline is made to resync, and at most once per
			// resolveNowEvery for all the resolvers sharing it.
			if r.sub.unhealthy(time.Now()) && r.resync.Allow() {
				r.sub.resync()
			}
		}
	}
}

// ResolveNow asks for a resync; it never blocks (grpc calls it on its
// serializer) and is acted on by the resolver's goroutine.
func (r *regResolver) ResolveNow(resolver.ResolveNowOptions) {
	select {
	case r.now <- struct{}{}:
	default:
	}
}

// Close stops the resolver's goroutine and waits for it: no UpdateState
// is made after Close returns.
func (r *regResolver) Close() {
	r.unlisten()
	r.cancel()
	<-r.done
	r.release()
}

// resolveNowEvery bounds how often ResolveNow may resync a subscription.
const resolveNowEvery = 5 * time.Second

// sharedLinger is how long a subscription with no resolver left is kept.
const sharedLinger = 30 * time.Second

type shared struct {
	sub    *Subscription
	resync *rate.Limiter // ResolveNow's resyncs of sub
	refs   int
	timer  *time.Timer
}

// acquire returns the Client's shared subscription of service, starting it
// if needed, and the limiter of its resyncs; release gives it back.
func (c *Client) acquire(service string) (*Subscription, *rate.Limiter, func(), error) {
	c.sharedMu.Lock()
	defer c.sharedMu.Unlock()
	if c.closed {
		return nil, nil, nil, ErrClosed
	}
	sh := c.shared[service]
	if sh == nil {
		// Stopped by the linger timer or by Client.Close, which stops
		// it only after the registrations drained.
		sub, err := c.Subscribe(context.Background(), service, SubscribeOptions{})
		if err != nil {
			return nil, nil, nil, err
		}
		sh = &shared{sub: sub, resync: rate.NewLimiter(rate.Every(resolveNowEvery), 1)}
		c.shared[service] = sh
	}
	if sh.timer != nil {
		if sh.timer.Stop() {
			c.own.lingers.Done() // it will not fire; one that fired sees refs > 0
		}
		sh.timer = nil
	}
	sh.refs++
	var once sync.Once
	return sh.sub, sh.resync, func() { once.Do(func() { c.releaseShared(service, sh) }) }, nil
}

func (c *Client) releaseShared(service string, sh *shared) {
	c.sharedMu.Lock()
	defer c.sharedMu.Unlock()
	sh.refs--
	if sh.refs > 0 || c.closed {
		return
	}
	// Close waits for the timer's function if it fired (and stops it if
	// not), so it never closes a subscription after Close returned.
	c.own.lingers.Add(1)
	sh.timer = time.AfterFunc(sharedLinger, func() {
		defer c.own.lingers.Done()
		c.sharedMu.Lock()
		if sh.refs > 0 || c.shared[service] != sh {
			c.sharedMu.Unlock()
			return
		}
		delete(c.shared, service)
		c.sharedMu.Unlock()
		sh.sub.Close()
	})
}
