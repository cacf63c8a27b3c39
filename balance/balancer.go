package balance

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/experimental/balancer/weight"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Name is the policy's name in a service config's loadBalancingConfig.
const Name = "registry_weighted"

func init() { balancer.Register(builder{}) }

type builder struct{}

func (builder) Name() string { return Name }

// ParseConfig reads the policy's JSON entry over the defaults and
// validates it, so a bad config is refused when it is pushed (grpc-go
// then keeps the previous one, or falls to the next policy in the list).
func (builder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	p, err := ParsePolicy(js)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	return &lbConfig{Policy: p}, nil
}

func (builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &lb{
		ClientConn: cc,
		target:     opts.Target.Endpoint(),
		kick:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		loopDone:   make(chan struct{}),
		eps:        map[string]*endpoint{},
		log:        slog.Default(),
		metrics:    NewMetrics(),
	}
	b.sh = b.newShared(DefaultPolicy())
	// One pickfirst child per endpoint: grpc-go manages the connections,
	// we only choose among the children that are READY.
	b.child = endpointsharding.NewBalancer(b, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	go b.loop()
	return b
}

// lb is the balancer of one channel. It embeds the parent ClientConn to
// intercept the UpdateState calls of endpointsharding, and publishes an
// immutable picker built from the children's states, the registry's view
// and the outlier state.
type lb struct {
	balancer.ClientConn
	child  balancer.Balancer
	target string

	kick     chan struct{} // a change the loop must turn into a new picker
	stop     chan struct{}
	loopDone chan struct{}

	// mu guards what builds a picker. Never held while calling into the
	// child (endpointsharding calls back into UpdateState synchronously).
	mu       sync.Mutex
	closed   bool
	sh       *shared
	svc      *Service
	log      *slog.Logger
	metrics  *Metrics
	children []endpointsharding.ChildState
	panic    bool
	wakeAt   time.Time // next timed change (a ramp step, an ejection's end)

	// ejectMu guards the outlier state of every endpoint: it is taken on
	// a call's Done, so it must not be mu (held while publishing).
	ejectMu sync.Mutex
	eps     map[string]*endpoint // by address
	nInst   int                  // non-draining instances, for the ejection cap
}

// shared is what pickers and calls of one policy share.
type shared struct {
	policy  Policy
	budget  *budget
	metrics *Metrics
	service string
	log     *slog.Logger
}

func (b *lb) newShared(p Policy) *shared {
	return &shared{policy: p, budget: newBudget(p), metrics: b.metrics, service: b.target, log: b.log}
}

func (b *lb) UpdateClientConnState(ccs balancer.ClientConnState) error {
	p := DefaultPolicy()
	if ccs.BalancerConfig != nil {
		cfg, ok := ccs.BalancerConfig.(*lbConfig)
		if !ok {
			return fmt.Errorf("%s: config of type %T: %w", Name, ccs.BalancerConfig, balancer.ErrBadResolverState)
		}
		p = cfg.Policy
	}
	svc := ServiceOf(ccs.ResolverState)
	eps := append([]resolver.Endpoint(nil), ccs.ResolverState.Endpoints...)
	b.mu.Lock()
	if svc != nil {
		eps = append(eps, svc.Standby...)
		if svc.Metrics != nil {
			b.metrics = svc.Metrics
		}
		if svc.Logger != nil {
			b.log = svc.Logger
		}
		if svc.Name != "" {
			b.target = svc.Name
		}
	}
	b.svc = svc
	if !policyEqual(b.sh.policy, p) || b.sh.metrics != b.metrics || b.sh.service != b.target || b.sh.log != b.log {
		b.sh = b.newShared(p)
	}
	b.mu.Unlock()

	st := ccs.ResolverState
	st.Endpoints = eps
	err := b.child.UpdateClientConnState(balancer.ClientConnState{
		// The health listener lets pickfirst children report client-side
		// health checks when the service config asks for them.
		ResolverState: pickfirst.EnableHealthListener(st),
	})
	if len(eps) == 0 {
		// An empty list is an answer, not a resolver failure: the picker
		// says why (see nothingToCall). ErrBadResolverState would make
		// grpc-go re-resolve in a loop.
		return nil
	}
	return err
}

func policyEqual(a, b Policy) bool {
	aj, _ := json.Marshal(a)
	bj, _ := json.Marshal(b)
	return string(aj) == string(bj)
}

func (b *lb) ResolverError(err error) { b.child.ResolverError(err) }

func (b *lb) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {}

func (b *lb) ExitIdle() { b.child.ExitIdle() }

func (b *lb) Close() {
	b.child.Close()
	b.mu.Lock()
	b.closed = true
	if b.panic {
		b.metrics.panicking.Add(-1)
		b.panic = false
	}
	b.mu.Unlock()
	close(b.stop)
	<-b.loopDone
}

// UpdateState receives endpointsharding's aggregate; we build our own
// picker from its children's states.
func (b *lb) UpdateState(s balancer.State) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.children = endpointsharding.ChildStatesFromPicker(s.Picker)
	b.publishLocked(time.Now())
}

// loop rebuilds the picker when an ejection changes or a timed change is
// due. It is the balancer's only goroutine; Close stops and waits for it.
func (b *lb) loop() {
	defer close(b.loopDone)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-b.kick:
		case <-t.C:
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return
		}
		b.publishLocked(time.Now())
		wake := b.wakeAt
		b.mu.Unlock()
		t.Stop()
		if !wake.IsZero() {
			t.Reset(max(time.Until(wake), time.Millisecond))
		}
	}
}

func (b *lb) poke() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// publishLocked builds and publishes a picker. Caller holds b.mu.
func (b *lb) publishLocked(now time.Time) {
	if b.closed {
		return
	}
	pk, state, wake, panicking := b.buildLocked(now)
	if panicking != b.panic {
		b.panic = panicking
		if panicking {
			b.metrics.panicEnters.Add(1)
			b.metrics.panicking.Add(1)
			b.log.Warn("panic mode: too few healthy instances, spreading calls over every non-draining instance",
				"service", b.target, "threshold_percent", b.sh.policy.PanicThresholdPercent)
		} else {
			b.metrics.panicLeaves.Add(1)
			b.metrics.panicking.Add(-1)
			b.log.Info("panic mode over: enough healthy instances", "service", b.target)
		}
	}
	if !wake.Equal(b.wakeAt) {
		b.wakeAt = wake
		b.poke()
	}
	b.ClientConn.UpdateState(balancer.State{ConnectivityState: state, Picker: pk})
	// After the picker is in place: a weight seen here is in use.
	b.metrics.setWeights(b.target, pk.weights())
}

// buildLocked turns the children's states into a picker: which endpoints
// may be called (routable, not ejected; everyone not draining in panic
// mode), at what weight (slow start), and which ejected ones are due a
// half-open call.
func (b *lb) buildLocked(now time.Time) (*picker, connectivity.State, time.Time, bool) {
	p := &b.sh.policy
	var wake time.Time
	soonest := func(t time.Time) {
		if !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
			wake = t
		}
	}
	type child struct {
		ep    *endpoint
		state balancer.State
	}
	var kids []child
	healthy := 0
	b.ejectMu.Lock()
	seen := make(map[string]bool, len(b.children))
	for _, cs := range b.children {
		in, ok := InstanceOf(cs.Endpoint)
		if !ok { // an endpoint from another resolver: routable, its weight if it has one
			in = Instance{Weight: 100, Routable: true, Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING}
			// As a custom policy of gRPC's xDS client (gRFC A52: regnode's
			// clusters offer it first), the weight comes from xDS.
			if w := weight.FromEndpoint(cs.Endpoint).Weight; w > 0 {
				in.Weight = w
			}
		}
		if in.Lifecycle == registryv1.Lifecycle_LIFECYCLE_DRAINING || len(cs.Endpoint.Addresses) == 0 {
			continue // DRAINING is never picked
		}
		key := cs.Endpoint.Addresses[0].Addr
		seen[key] = true
		ep := b.eps[key]
		if ep == nil {
			ep = &endpoint{key: key, owner: b}
			b.eps[key] = ep
		}
		if ep.picks == nil || ep.inst.ID != in.ID {
			ep.picks = b.metrics.pickCounter(b.target, in.ID)
			ep.calls.Store(b.metrics.callCounter(b.target, in.ID))
		}
		ep.inst = in
		if in.Routable && !ep.ejected {
			healthy++
		}
		if ep.ejected && ep.until.After(now) {
			soonest(ep.until)
		}
		kids = append(kids, child{ep: ep, state: cs.State})
	}
	for k := range b.eps {
		if !seen[k] {
			delete(b.eps, k)
		}
	}
	b.nInst = len(kids)
	panicking := p.PanicThresholdPercent > 0 && len(kids) > 0 && healthy*100 < p.PanicThresholdPercent*len(kids)

	pk := &picker{sh: b.sh}
	var cands []cand
	connecting := false
	var lastErr error
	for _, k := range kids {
		in, ep := k.ep.inst, k.ep
		eligible := panicking || (in.Routable && !ep.ejected)
		halfOpen := !panicking && in.Routable && ep.ejected && !ep.until.After(now)
		if !eligible && !halfOpen {
			continue
		}
		switch k.state.ConnectivityState {
		case connectivity.Ready:
		case connectivity.Connecting, connectivity.Idle:
			connecting = true
			continue
		default:
			if _, err := k.state.Picker.Pick(balancer.PickInfo{}); err != nil {
				lastErr = err
			}
			continue
		}
		start := in.RoutableSince
		if ep.recoveredAt.After(start) {
			start = ep.recoveredAt
		}
		pct, next := RampPercent(start, now, p.SlowStartWindow)
		soonest(next)
		w := max(uint64(in.Weight)*pct/100, 1)
		c := cand{ep: ep, pk: k.state.Picker, w: w, id: in.ID, zone: in.Zone, picks: ep.picks, done: doneFunc(ep, b.sh)}
		if halfOpen {
			pk.halfOpen = append(pk.halfOpen, c)
		} else {
			cands = append(cands, c)
		}
	}
	b.ejectMu.Unlock()
	wrr := p.Picker == PickerWRR
	pk.all = newSet(cands, wrr)
	if !panicking && b.svc != nil {
		pk.local, pk.remote, pk.pLocal = zoneSplit(cands, b.svc.LocalZone, p.ZoneMinInstances, wrr)
	}
	switch {
	case len(cands) > 0 || len(pk.halfOpen) > 0:
		return pk, connectivity.Ready, wake, panicking
	case connecting, b.svc != nil && b.svc.waiting():
		// Still connecting, or the first view of the service is on its
		// way: calls queue, fail-fast or not, within their deadline.
		return pk.with(balancer.ErrNoSubConnAvailable, false), connectivity.Connecting, wake, panicking
	}
	err, final := b.nothingToCall(len(kids), lastErr)
	return pk.with(err, final), connectivity.TransientFailure, wake, panicking
}

// nothingToCall says why no instance can be called. final errors are
// facts of the registry that a retry a few milliseconds later would not
// change. They are plain errors, not statuses: grpc-go fails a call that
// does not wait for ready with Unavailable and this message at once, and
// lets a wait-for-ready call wait for a picker that can serve it.
func (b *lb) nothingToCall(nonDraining int, lastErr error) (error, bool) {
	svc, name := b.svc, b.target
	switch {
	case svc == nil && nonDraining == 0:
		return errorf("%s: the resolver gave no instance", name), true
	case svc == nil:
	case !svc.Known && svc.Refused != "":
		return errorf("%s: the registry refused to follow it: %s", name, svc.Refused), true
	case !svc.Known:
		return errorf("%s: registry not reached yet and no cached list", name), true
	case svc.Registered == 0:
		return errorf("no instance of %s is registered", name), true
	case svc.Draining == svc.Registered && svc.Registered == 1:
		return errorf("the only instance of %s is draining", name), true
	case svc.Draining == svc.Registered:
		return errorf("all %d instances of %s are draining", svc.Registered, name), true
	}
	msg := fmt.Sprintf("no instance of %s can be called: %d not draining, none of the callable ones is connected", name, nonDraining)
	if svc != nil {
		msg = fmt.Sprintf("no instance of %s can be called: %d registered, %d draining, %d not routable, none of the routable ones is connected",
			name, svc.Registered, svc.Draining, len(svc.Standby))
	}
	if lastErr != nil {
		msg += " (last connection error: " + lastErr.Error() + ")"
	}
	return errorf("%s", msg), false
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
