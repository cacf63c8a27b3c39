package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
)

// regnodePolicy is the balancing policy of a Client's connection to its
// regnodes. It connects lazily: to one regnode, chosen at random, and to
// another only when it must: the connected ones all failed, or a call
// asks to avoid the only one ready (the regnode whose stream just
// stalled: paused, or cut off from etcd), or none is ready
// ConnectDelay after it began connecting (a regnode that does not answer
// at all: pick_first's "happy eyeballs" rule). A regnode that drops or
// fails while another is ready is let go, so a Client comes back to one
// connection. Calls go round robin over the ready ones, skipping the one
// to avoid, and learn which one they went to.
//
// Why not base's round robin over all of them, as before: every Client
// then held a connection to every regnode, so each regnode paid for
// every client of the cluster, whichever regnode its stream was on
// (regbench scale: 10,000 clients of three regnodes held 30,000
// connections). Why not grpc's pick_first: its one connection cannot
// avoid a regnode that is connected but silent.
const regnodePolicy = "registry_regnodes"

// ConnectDelay is how long regnodePolicy waits for a regnode to connect
// before it connects the next one too (grpc's pick_first waits 250ms).
const ConnectDelay = 250 * time.Millisecond

func init() {
	balancer.Register(regnodeBuilder{})
}

type regnodeBuilder struct{}

func (regnodeBuilder) Name() string { return regnodePolicy }

func (regnodeBuilder) Build(cc balancer.ClientConn, _ balancer.BuildOptions) balancer.Balancer {
	return &regnodeBalancer{cc: cc, scs: map[string]*regnodeConn{}}
}

// regnodeBalancer is regnodePolicy. Its methods and the SubConns' state
// listeners run one at a time (grpc serializes them); mu guards what the
// picker reaches too (wanting another regnode, from a pick).
type regnodeBalancer struct {
	cc balancer.ClientConn

	mu      sync.Mutex
	order   []string // the regnodes, in the random order they are tried
	scs     map[string]*regnodeConn
	lastErr error
	closed  bool
	timer   *time.Timer // armed while nothing is ready and a regnode connects
	// racing: the connect delay passed with nothing ready and another
	// regnode was connected beside the first; the first of them ready
	// wins, and the others, still connecting, are let go.
	racing bool
}

// regnodeConn is one regnode's SubConn. wanted: the balancer keeps it
// connected (it reconnects it when it goes idle). failed: its last
// attempt failed, and it has not been ready since (a call avoiding
// another regnode does not wait for it).
type regnodeConn struct {
	addr   string
	ra     resolver.Address // as the resolver gave it
	sc     balancer.SubConn
	state  connectivity.State
	wanted bool
	failed bool
}

func (b *regnodeBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	addrs := s.ResolverState.Addresses
	if len(addrs) == 0 {
		for _, e := range s.ResolverState.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
	}
	if len(addrs) == 0 {
		b.ResolverError(errors.New("no regnode address"))
		return balancer.ErrBadResolverState
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range addrs {
		seen[a.Addr] = true
		if _, ok := b.scs[a.Addr]; ok {
			continue
		}
		rc := &regnodeConn{addr: a.Addr, ra: a, state: connectivity.Idle}
		sc, err := b.cc.NewSubConn([]resolver.Address{a}, balancer.NewSubConnOptions{
			StateListener: func(st balancer.SubConnState) { b.changed(rc, st) }})
		if err != nil {
			continue
		}
		rc.sc = sc
		b.scs[a.Addr] = rc
		// A random place in the order, so that Clients spread.
		b.order = append(b.order, a.Addr)
		i := rand.IntN(len(b.order))
		b.order[i], b.order[len(b.order)-1] = b.order[len(b.order)-1], b.order[i]
	}
	for addr, rc := range b.scs {
		if !seen[addr] {
			rc.sc.Shutdown()
			delete(b.scs, addr)
		}
	}
	kept := b.order[:0]
	for _, a := range b.order {
		if seen[a] {
			kept = append(kept, a)
		}
	}
	b.order = kept
	if !b.anyLive() && !b.wantNext(false) {
		b.wantNext(true)
	}
	b.publish()
	return nil
}

// anyLive reports whether a wanted regnode is ready or on its way; b.mu
// is held.
func (b *regnodeBalancer) anyLive() bool {
	for _, rc := range b.scs {
		if rc.wanted && rc.state != connectivity.TransientFailure && rc.state != connectivity.Shutdown {
			return true
		}
	}
	return false
}

// wantNext connects the first regnode of the order not wanted yet (and,
// unless failedToo, not failed), and reports whether there was one; b.mu
// is held.
func (b *regnodeBalancer) wantNext(failedToo bool) bool {
	for _, a := range b.order {
		if rc := b.scs[a]; !rc.wanted && (failedToo || !rc.failed) {
			rc.wanted = true
			rc.sc.Connect()
			return true
		}
	}
	return false
}

// changed is a SubConn's state listener.
func (b *regnodeBalancer) changed(rc *regnodeConn, st balancer.SubConnState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.scs[rc.addr] != rc {
		return
	}
	rc.state = st.ConnectivityState
	switch rc.state {
	case connectivity.Ready:
		rc.failed = false
		if b.racing {
			b.racing = false
			b.dropRacers(rc)
		}
	case connectivity.Idle:
		switch {
		case !rc.wanted:
		case b.otherReady(rc):
			rc.wanted = false // dropped while another serves: let it go
		default:
			rc.sc.Connect()
		}
	case connectivity.TransientFailure:
		b.lastErr, rc.failed = st.ConnectionError, true
		switch {
		case b.otherReady(rc):
			rc.wanted = false
		case !b.anyLive():
			// Every regnode tried is down: try one more (one not failed
			// first); the wanted ones keep retrying (grpc backs off).
			if !b.wantNext(false) {
				b.wantNext(true)
			}
		}
	}
	b.publish()
}

// otherReady reports whether a regnode other than rc is ready; b.mu is
// held.
func (b *regnodeBalancer) otherReady(rc *regnodeConn) bool {
	for _, o := range b.scs {
		if o != rc && o.state == connectivity.Ready {
			return true
		}
	}
	return false
}

// waited is the connect delay's end: nothing ready yet, so one more
// regnode is connected.
func (b *regnodeBalancer) waited() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.timer = nil
	if b.closed {
		return
	}
	for _, rc := range b.scs {
		if rc.state == connectivity.Ready {
			return
		}
	}
	if b.wantNext(false) {
		b.racing = true
		b.publish()
	}
}

// dropRacers lets go of the regnodes connecting beside won, the first
// ready of a race: each is shut down (no call or stream is on it yet)
// and replaced by a fresh SubConn that is not connected, so that a
// Client that raced under a slow start does not keep two connections
// for good (regbench scale: 10,000 Clients starting at once raced, and
// each regnode held twice the connections and memory). b.mu is held.
func (b *regnodeBalancer) dropRacers(won *regnodeConn) {
	for addr, rc := range b.scs {
		if rc == won || !rc.wanted || rc.state == connectivity.Ready {
			continue
		}
		fresh := &regnodeConn{addr: addr, ra: rc.ra, state: connectivity.Idle, failed: rc.failed}
		sc, err := b.cc.NewSubConn([]resolver.Address{rc.ra}, balancer.NewSubConnOptions{
			StateListener: func(st balancer.SubConnState) { b.changed(fresh, st) }})
		if err != nil {
			continue // keep the racer: a connection too many beats none
		}
		rc.sc.Shutdown()
		fresh.sc = sc
		b.scs[addr] = fresh
	}
}

// publish gives grpc a picker of the ready regnodes; b.mu is held.
func (b *regnodeBalancer) publish() {
	p := &avoidingPicker{b: b}
	connecting, unwanted := false, false
	for _, a := range b.order {
		rc := b.scs[a]
		switch {
		case rc.state == connectivity.Ready:
			p.scs = append(p.scs, rc.sc)
			p.addrs = append(p.addrs, rc.addr)
		case rc.failed:
		case !rc.wanted || rc.state == connectivity.Connecting || rc.state == connectivity.Idle:
			p.spare = true // another regnode could still answer
			connecting = connecting || rc.wanted
			unwanted = unwanted || !rc.wanted
		}
	}
	switch {
	case len(p.scs) == 0 && connecting && unwanted && b.timer == nil:
		b.timer = time.AfterFunc(ConnectDelay, b.waited)
	case len(p.scs) > 0 && b.timer != nil:
		b.timer.Stop()
		b.timer = nil
	}
	switch {
	case len(p.scs) > 0:
		p.next.Store(rand.Uint32()) // so that new connections do not all start on the first
		b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.Ready, Picker: p})
	case connecting:
		b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.Connecting, Picker: base.NewErrPicker(balancer.ErrNoSubConnAvailable)})
	default:
		err := b.lastErr
		if err == nil {
			err = errors.New("no regnode reachable")
		}
		b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.TransientFailure, Picker: base.NewErrPicker(err)})
	}
}

// avoid is a pick's wish to go elsewhere than addr, the only regnode
// ready: connect another, if one is left to try, and report whether the
// pick should wait for it.
func (b *regnodeBalancer) avoid(addr string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	for _, rc := range b.scs {
		if rc.addr != addr && rc.wanted && !rc.failed && (rc.state == connectivity.Connecting || rc.state == connectivity.Idle) {
			return true // one is on its way already
		}
	}
	return b.wantNext(false)
}

func (b *regnodeBalancer) ResolverError(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.scs) == 0 {
		b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.TransientFailure, Picker: base.NewErrPicker(err)})
	}
}

// UpdateSubConnState is never called: every SubConn has a StateListener.
func (b *regnodeBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {}

// ExitIdle connects the wanted regnodes again.
func (b *regnodeBalancer) ExitIdle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, rc := range b.scs {
		if rc.wanted && rc.state == connectivity.Idle {
			rc.sc.Connect()
		}
	}
}

func (b *regnodeBalancer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.timer != nil {
		b.timer.Stop()
	}
	for _, rc := range b.scs {
		rc.sc.Shutdown()
	}
	clear(b.scs)
}

// pickNote rides in a call's context: the regnode to avoid (in), and the
// one the call went to (out).
type pickNote struct {
	avoid  string
	mu     sync.Mutex
	picked string
}

type pickNoteKey struct{}

// withPickNote returns ctx carrying n.
func withPickNote(ctx context.Context, n *pickNote) context.Context {
	return context.WithValue(ctx, pickNoteKey{}, n)
}

// Picked is the address of the regnode the call went to ("" if none yet).
func (n *pickNote) Picked() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.picked
}

// avoidingPicker is an immutable picker of the ready regnodes. spare:
// some regnode not ready could still be connected.
type avoidingPicker struct {
	b     *regnodeBalancer
	scs   []balancer.SubConn
	addrs []string
	spare bool
	next  atomic.Uint32
}

// Pick goes round robin, skipping the regnode the call asks to avoid if
// another is ready; if none is, and another can still be connected, it
// connects it and the call waits for it (the next picker).
func (p *avoidingPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	note, _ := info.Ctx.Value(pickNoteKey{}).(*pickNote)
	n := uint32(len(p.scs))
	i := p.next.Add(1) % n
	if note != nil && p.addrs[i] == note.avoid {
		switch {
		case n > 1:
			i = (i + 1 + rand.Uint32N(n-1)) % n // any other
		case p.spare && p.b.avoid(note.avoid):
			return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
		}
	}
	if note != nil {
		note.mu.Lock()
		note.picked = p.addrs[i]
		note.mu.Unlock()
	}
	return balancer.PickResult{SubConn: p.scs[i]}, nil
}
