package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/chunk"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The Client's one subscription stream (docs/architecture.md, "Watch protocol"):
// every Subscription of a Client, and every resolver's (they share
// Subscriptions), rides one Subscribe stream to one regnode. Each service
// followed is a feed: the view of that service as the stream tells it
// (its cache, epoch and resume point), units joined and decoded once, and
// the same decoded batch applied by every Subscription of the service (the
// instances are shared; each Subscription keeps its own index of them, its
// listeners, disk file and freshness). A Subscription that joins a feed
// already known starts from a snapshot of the feed's view.
//
// The stream follows what one Watch stream did for one Subscription:
// resume points (epoch, revision) per service, REVISION_AHEAD counted per
// service (the stream moves to another regnode; once every regnode said so
// the service subscribes afresh), the receive deadline (the shortest of
// the Subscriptions': any message on the stream confirms the regnode, and
// regnode sends every service progress each interval), chunks joined per
// service. When the stream breaks every service moves, with its own resume
// point, to the next regnode. After applying a snapshot or events the feed
// acknowledges the revision, so that a drain can wait for it.

// mux is a Client's Subscribe stream and its feeds.
type mux struct {
	c *Client

	mu struct {
		sync.Mutex
		feeds   map[string]*feed
		cur     *muxConn // the open stream, or nil
		gen     int      // counts streams
		running bool     // run's goroutine is started
		closed  bool
	}
	wake  chan struct{} // a feed came, or a resync: cut waits short
	ready chan struct{} // a regnode connection turned ready: cut a retry's wait short
	done  chan struct{} // closed when run returns (if it ever ran)
	// stalled is the regnode whose stream last stalled or said
	// REVISION_AHEAD (run's goroutine only): the next stream avoids it.
	stalled string
}

// muxConn is one open Subscribe stream. Only its sender goroutine sends:
// the goroutine that reads the stream, and whoever adds or removes a
// service, never wait on the network. (Were the reader to block on a
// send, a regnode blocked sending to it would stop reading too, and
// neither side would move again.)
type muxConn struct {
	gen    int
	cancel context.CancelFunc
	stream registryv1.Registry_SubscribeClient

	mu   sync.Mutex
	ctl  []*registryv1.SubscribeRequest // adds and removes, in order
	acks map[*feed]int64                // the latest revision applied, per feed
	wake chan struct{}

	// onRequest: the regnode asks for acks (its header says so, see
	// server.AckHeader), so a feed acknowledges only what was asked.
	// Otherwise every unit applied is acknowledged. Set by the stream's
	// reading goroutine at its first message, read only by it.
	onRequest bool
}

func newMuxConn(cancel context.CancelFunc, st registryv1.Registry_SubscribeClient) *muxConn {
	return &muxConn{cancel: cancel, stream: st, acks: map[*feed]int64{}, wake: make(chan struct{}, 1)}
}

func (mc *muxConn) kick() {
	select {
	case mc.wake <- struct{}{}:
	default:
	}
}

// queue sends req after every add and remove queued before it.
func (mc *muxConn) queue(req *registryv1.SubscribeRequest) {
	mc.mu.Lock()
	mc.ctl = append(mc.ctl, req)
	mc.mu.Unlock()
	mc.kick()
}

// ack acknowledges rev of f; acks not yet sent are coalesced.
func (mc *muxConn) ack(f *feed, rev int64) {
	mc.mu.Lock()
	if rev > mc.acks[f] {
		mc.acks[f] = rev
	}
	mc.mu.Unlock()
	mc.kick()
}

// sendLoop sends what is queued until ctx ends or a send fails (which
// ends the stream). current says whether a feed is still on the stream:
// an ack of a feed that left is dropped.
func (mc *muxConn) sendLoop(ctx context.Context, current func(*feed) bool) {
	for {
		select {
		case <-mc.wake:
		case <-ctx.Done():
			return
		}
		mc.mu.Lock()
		ctl, acks := mc.ctl, mc.acks
		mc.ctl, mc.acks = nil, map[*feed]int64{}
		mc.mu.Unlock()
		for _, req := range ctl {
			if err := mc.stream.Send(req); err != nil {
				mc.cancel()
				return
			}
		}
		for f, rev := range acks {
			if !current(f) {
				continue
			}
			err := mc.stream.Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Ack{
				Ack: &registryv1.SubscribeAck{Service: f.service, Revision: rev}}})
			if err != nil {
				mc.cancel()
				return
			}
		}
	}
}

// feed is one service followed on the stream.
type feed struct {
	service string

	// mu serializes applying (the stream's goroutine, a Subscription
	// joining) and guards everything below.
	mu        sync.Mutex
	cache     *cache.Cache
	epoch     string
	known     bool // a snapshot was applied
	subs      map[*Subscription]struct{}
	joiner    chunk.Joiner
	gen       int   // the stream this feed was added on
	connected bool  // a message came on the current stream
	ahead     int   // REVISION_AHEAD answers in a row
	ackWant   int64 // the regnode asked for an ack once the view reaches this (0: not asked)
	afresh    bool  // the next add subscribes afresh
	freshOpen bool  // the current add was afresh and its snapshot not in
	failed    error
}

func newMux(c *Client) *mux {
	m := &mux{c: c, wake: make(chan struct{}, 1), ready: make(chan struct{}, 1), done: make(chan struct{})}
	m.mu.feeds = map[string]*feed{}
	return m
}

func (m *mux) kick() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// attach makes s a subscriber of its service's feed, starting the stream
// if needed; a feed already known gives s its view at once.
func (m *mux) attach(s *Subscription) error {
	m.mu.Lock()
	if m.mu.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	f := m.mu.feeds[s.service]
	if f == nil {
		f = &feed{service: s.service, cache: cache.New(), subs: map[*Subscription]struct{}{}}
		m.mu.feeds[s.service] = f
		if cur := m.mu.cur; cur != nil {
			// Sent under m.mu, as every add and remove: the regnode sees
			// them in the order the feeds came and went.
			f.gen = cur.gen
			cur.queue(addRequest(m.c.subscriber, f.service, 0, ""))
		}
	}
	if !m.mu.running {
		m.mu.running = true
		go m.run(m.c.ctx)
	}
	// Joined under f.mu before unlocking m.mu: a detach of the last
	// subscriber cannot drop the feed in between.
	f.mu.Lock()
	m.mu.Unlock()
	f.subs[s] = struct{}{}
	if f.known {
		f.seed(s)
	}
	connected, failed := f.connected, f.failed
	f.mu.Unlock()
	if connected {
		s.setConnected(true, nil)
	}
	if failed != nil {
		s.setConnected(false, failed)
	}
	m.kick()
	return nil
}

// seed gives s the feed's whole view as a snapshot; f.mu is held. A
// Subscription with no view yet takes the feed's own (cache.Seed), so the
// feed's later steps replay on it instead of being applied again.
func (f *feed) seed(s *Subscription) {
	b := cache.Batch{Revision: f.cache.Revision(), Snapshot: true, Epoch: f.epoch, Instances: f.instances()}
	fresh := s.cache.Revision() != 0 // a view that went its own way: replace it
	st := f.cache.Seed()
	if err := s.applyUnit(f.epoch, b, &fresh, &st); err != nil {
		s.c.log.Error("subscription refused its service's view", "service", f.service, "err", err)
	}
}

func (f *feed) instances() []*registryv1.Instance {
	snap := f.cache.Snapshot()
	if f.service == "" {
		return snap.All()
	}
	return snap.Instances(f.service)
}

// detach removes s from its feed; the last one out removes the service
// from the stream (and ends the stream if it was the last service).
func (m *mux) detach(s *Subscription) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.mu.feeds[s.service]
	if f == nil {
		return
	}
	f.mu.Lock()
	delete(f.subs, s)
	empty := len(f.subs) == 0
	f.mu.Unlock()
	if !empty {
		return
	}
	delete(m.mu.feeds, s.service)
	if cur := m.mu.cur; cur != nil {
		if len(m.mu.feeds) == 0 {
			cur.cancel() // nothing left to follow: give the regnode its stream back
		} else {
			cur.queue(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Remove{Remove: &registryv1.SubscribeRemove{Service: s.service}}})
		}
	}
}

// resync ends the current stream (or the wait before the next): every
// service resumes at once, on whichever regnode answers.
func (m *mux) resync() {
	m.mu.Lock()
	if m.mu.cur != nil {
		m.mu.cur.cancel()
	}
	m.mu.Unlock()
	m.kick()
}

// close stops run and waits for it. The Client's context has ended.
func (m *mux) close() {
	m.mu.Lock()
	m.mu.closed = true
	running := m.mu.running
	if m.mu.cur != nil {
		m.mu.cur.cancel()
	}
	m.mu.Unlock()
	if running {
		<-m.done
	}
}

func addRequest(subscriber, service string, from int64, ep string) *registryv1.SubscribeRequest {
	return &registryv1.SubscribeRequest{Subscriber: subscriber,
		Kind: &registryv1.SubscribeRequest_Add{Add: &registryv1.SubscribeAdd{Service: service, FromRevision: from, Epoch: ep}}}
}

// options are the liveness and backoff of the stream: the strictest of
// every Subscription on it.
func (m *mux) options() (deadline, minBackoff, maxBackoff time.Duration, empty bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := DefaultSubscribeOptions()
	deadline, minBackoff, maxBackoff = d.ReceiveDeadline, d.MinBackoff, d.MaxBackoff
	first := true
	for _, f := range m.mu.feeds {
		f.mu.Lock()
		for s := range f.subs {
			if first {
				deadline, minBackoff, maxBackoff, first = s.opts.ReceiveDeadline, s.opts.MinBackoff, s.opts.MaxBackoff, false
				continue
			}
			deadline, minBackoff, maxBackoff = min(deadline, s.opts.ReceiveDeadline), min(minBackoff, s.opts.MinBackoff), min(maxBackoff, s.opts.MaxBackoff)
		}
		f.mu.Unlock()
	}
	return deadline, minBackoff, maxBackoff, len(m.mu.feeds) == 0
}

// run keeps a stream open while there are feeds, until ctx ends.
func (m *mux) run(ctx context.Context) {
	defer close(m.done)
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); m.watchReady(wctx) }()
	defer func() { stopWatch(); <-watched }()
	for attempt := 0; ; attempt++ {
		_, minB, maxB, empty := m.options()
		if empty {
			attempt = 0
			select {
			case <-m.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		progressed, err := m.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		select { // only a connection ready from now on cuts the wait below
		case <-m.ready:
		default:
		}
		m.disconnected(err)
		var stall *stallError
		if errors.As(err, &stall) {
			m.c.log.Warn("subscription stream stalled; resuming on another regnode", "err", err)
			m.stalled = stall.peer
			attempt = -1
			continue
		}
		if progressed {
			attempt = 0
		}
		if errors.Is(err, errAhead) {
			// Worth seeing: a regnode behind its peers moves every
			// service of the stream, one REVISION_AHEAD at a time.
			m.c.log.Warn("subscription stream moved off a regnode behind one of its services", "err", err)
		} else {
			m.c.log.Debug("subscription stream ended; resuming", "err", err)
		}
		d := minB << min(attempt, 16)
		if d > maxB || d <= 0 {
			d = maxB
		}
		t := time.NewTimer(d/2 + rand.N(d/2+1))
		select {
		case <-t.C:
		case <-m.wake:
			t.Stop()
		case <-m.ready:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// watchReady signals m.ready each time the Client's channel turns ready,
// until ctx ends: a stream that failed while no regnode was up (not
// started yet, restarting) starts again as soon as one is, instead of
// after a backoff that grew while it was down; the first view of a fresh
// Client must come within its connect timeout.
func (m *mux) watchReady(ctx context.Context) {
	cc := m.c.cc
	for st := cc.GetState(); ; st = cc.GetState() {
		if st == connectivity.Ready {
			select {
			case m.ready <- struct{}{}:
			default:
			}
		}
		if !cc.WaitForStateChange(ctx, st) {
			return
		}
	}
}

// disconnected tells every Subscription the stream is gone.
func (m *mux) disconnected(err error) {
	for _, f := range m.feedList() {
		f.mu.Lock()
		f.connected = false
		f.joiner = chunk.Joiner{} // a unit cut short by the break is dropped
		if f.freshOpen {
			f.afresh, f.freshOpen = true, false // still due: no snapshot came
		}
		subs := f.subList()
		f.mu.Unlock()
		for _, s := range subs {
			s.mu.Lock()
			s.mu.reconnect++
			s.mu.Unlock()
			s.setConnected(false, err)
		}
	}
}

func (m *mux) feedList() []*feed {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*feed, 0, len(m.mu.feeds))
	for _, f := range m.mu.feeds {
		out = append(out, f)
	}
	return out
}

func (f *feed) subList() []*Subscription {
	out := make([]*Subscription, 0, len(f.subs))
	for s := range f.subs {
		out = append(out, s)
	}
	return out
}

// resume is the add request of f on a new stream; f.mu is held.
func (f *feed) resume(subscriber string) *registryv1.SubscribeRequest {
	f.freshOpen = false
	switch {
	case f.afresh:
		f.afresh, f.freshOpen = false, true
		return addRequest(subscriber, f.service, 0, "")
	case !f.known:
		return addRequest(subscriber, f.service, 0, "")
	}
	return addRequest(subscriber, f.service, f.cache.Revision(), f.epoch)
}

// The Subscribe stream's response header by which a regnode says it asks
// for acks (server.AckHeader and server.AckRequested; the SDK imports no
// server code).
const (
	ackHeader    = "registry-acks"
	ackRequested = "requested"
)

// errAhead moves the stream off a regnode behind one of its services.
var errAhead = errors.New("regnode is behind a service's revision")

// stream follows one Subscribe stream until it breaks, and says why;
// progressed means a message came before (so the retry starts with a
// short wait).
func (m *mux) stream(ctx context.Context) (progressed bool, err error) {
	deadlineD, _, _, _ := m.options()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	note := &pickNote{avoid: m.stalled}
	st, err := m.c.api.Subscribe(withPickNote(sctx, note))
	if err != nil {
		return false, err
	}
	at := note.Picked()
	mc := newMuxConn(cancel, st)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		mc.sendLoop(sctx, func(f *feed) bool { return m.feedOf(f.service) == f })
	}()
	defer func() { cancel(); <-sent }()
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		m.reportLoop(sctx, mc)
	}()
	defer func() { cancel(); <-reported }()
	defer func() {
		m.mu.Lock()
		if m.mu.cur == mc {
			m.mu.cur = nil
		}
		m.mu.Unlock()
	}()
	m.addAll(mc)
	deadline := newDeadline(deadlineD, cancel, m.c.conns.unreadOf(st.Context()))
	defer deadline.disarm()
	gotSome := false
	for {
		deadline.arm()
		resp, err := st.Recv()
		deadline.disarm()
		if err != nil {
			if stall := deadline.err(at); stall != nil {
				return gotSome, stall
			}
			if status.Code(err) == codes.Unimplemented {
				m.c.log.Error("regnode serves no Subscribe stream (an older regnode?): set Config.WatchPerSubscription", "regnode", at, "err", err)
			}
			return gotSome, err
		}
		if !gotSome {
			// Headers come before the first message: this is the regnode's.
			md, _ := st.Header()
			v := md.Get(ackHeader)
			mc.onRequest = len(v) > 0 && v[0] == ackRequested
		}
		gotSome = true
		m.stalled = ""
		f := m.feedOf(resp.Service)
		if f == nil {
			continue // removed meanwhile
		}
		if resp.Error != nil {
			if err := m.serviceError(f, resp.Error); err != nil {
				m.stalled = at // another regnode may have it
				return gotSome, err
			}
			continue
		}
		if resp.AckRequest != nil {
			f.askedAck(mc, resp.AckRequest.Revision)
			continue
		}
		if resp.Unit == nil {
			continue
		}
		if err := f.take(mc, resp.Unit); err != nil {
			return gotSome, err
		}
	}
}

// addAll makes mc the current stream and adds every feed to it, each
// from its resume point, under m.mu (see attach).
func (m *mux) addAll(mc *muxConn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.gen++
	mc.gen = m.mu.gen
	m.mu.cur = mc
	for _, f := range m.mu.feeds {
		f.mu.Lock()
		f.gen, f.ackWant = mc.gen, 0 // a new stream's regnode asks for itself
		req := f.resume(m.c.subscriber)
		f.mu.Unlock()
		mc.queue(req)
	}
}

func (m *mux) feedOf(service string) *feed {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.feeds[service]
}

// serviceError handles the end of one service on the stream; an error
// return moves the whole stream to another regnode.
func (m *mux) serviceError(f *feed, e *registryv1.SubscribeError) error {
	err := status.Error(codes.Code(e.Code), e.Message)
	f.mu.Lock()
	subs := f.subList()
	switch {
	case e.Reason == reasonRevisionAhead:
		// Counted as a Watch stream's answer was (unit.go): once as many
		// in a row as there are endpoints, none has the view's revision.
		f.ahead++
		if f.ahead >= max(m.c.endpoints, 2) {
			f.ahead, f.afresh = 0, true
			m.c.log.Warn("no regnode has this subscription's revision; subscribing afresh",
				"service", f.service, "revision", f.cache.Revision(), "epoch", f.epoch, "err", err)
		}
		f.mu.Unlock()
		for _, s := range subs {
			s.mu.Lock()
			s.mu.lastErr = err
			s.mu.Unlock()
		}
		return fmt.Errorf("%w: %q: %v", errAhead, f.service, err)
	case refusal(err):
		// Refused (an invalid name, a token that may not read it): another
		// regnode would say the same, and the stream's other services are
		// fine. The refusal stays the service's error (a resolver fails
		// its calls with it) until the service is added again.
		f.failed = err
		f.mu.Unlock()
		m.c.log.Error("subscription refused", "service", f.service, "err", err)
		for _, s := range subs {
			s.setConnected(false, err)
		}
		return nil
	}
	f.mu.Unlock()
	return fmt.Errorf("service %q on the subscription stream: %w", f.service, err)
}

// take joins one chunk of f's units and, once a unit is whole, applies it
// to the feed and to every Subscription of the feed, then acknowledges it.
func (f *feed) take(mc *muxConn, r *registryv1.WatchResponse) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != mc.gen {
		return nil // added on a later stream than this one: cannot happen, but never mix
	}
	first := !f.connected
	f.connected = true
	unit, err := f.joiner.Add(r)
	if err != nil || unit == nil {
		if first {
			f.tellConnected()
		}
		return err
	}
	b, ok := toBatch(unit)
	if !ok {
		return nil
	}
	if !f.known && !b.Snapshot {
		return nil // a fresh add starts with its snapshot: this is of an earlier one
	}
	fresh := f.freshOpen && b.Snapshot
	if fresh {
		f.freshOpen = false
		b.Reset, b.NewEpoch = f.cache.Revision() != 0, b.Revision < f.cache.Revision()
	}
	if ep := unit.Epoch; ep != "" && f.epoch != "" && ep != f.epoch && !(b.Snapshot && b.NewEpoch) {
		return fmt.Errorf("%w: %q on %q, revision %d of %q", errOtherEpoch, f.service, f.epoch, b.Revision, ep)
	}
	st, err := f.cache.ApplyStep(b)
	if err != nil {
		if errors.Is(err, cache.ErrStale) && !b.Snapshot && b.Revision <= f.cache.Revision() {
			return nil // a duplicate of what the feed holds
		}
		return fmt.Errorf("%w: %q: %v", errStaleStream, f.service, err)
	}
	if unit.Epoch != "" {
		f.epoch = unit.Epoch
	}
	f.known, f.ahead, f.failed = true, 0, nil
	if first {
		f.tellConnected()
	}
	for s := range f.subs {
		sfresh := fresh // each Subscription judges a fresh snapshot against its own view
		if err := s.applyUnit(unit.Epoch, b, &sfresh, &st); err != nil {
			// The Subscription's view left the feed's: give it the feed's.
			s.c.log.Warn("subscription refused a unit; replacing its view with the stream's", "service", f.service, "err", err)
			f.seed(s)
		}
	}
	switch {
	case !mc.onRequest:
		if b.Snapshot || len(b.Events) > 0 {
			mc.ack(f, b.Revision)
		}
	case f.ackWant > 0 && f.cache.Revision() >= f.ackWant:
		// Progress counts too: a view at a revision holds every change
		// up to it.
		f.ackWant = 0
		mc.ack(f, f.cache.Revision())
	}
	return nil
}

// askedAck is the regnode's request that f be acknowledged once applied
// up to rev: at once if it is.
func (f *feed) askedAck(mc *muxConn, rev int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != mc.gen {
		return
	}
	if f.known && f.cache.Revision() >= rev {
		mc.ack(f, f.cache.Revision())
		return
	}
	f.ackWant = max(f.ackWant, rev)
}

// tellConnected tells every Subscription of f that a regnode answers;
// f.mu is held.
func (f *feed) tellConnected() {
	for s := range f.subs {
		s.setConnected(true, nil)
	}
}

// subscriberName is name, or "<host>/<pid>".
func subscriberName(name string) string {
	if name != "" {
		return name
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}
