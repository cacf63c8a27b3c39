package client

import (
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/resolver"

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
)

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
	sub, release, err := b.c.acquire(service)
	if err != nil {
		return nil, err
	}
	r := &regResolver{cc: cc, sub: sub, release: release, service: service}
	r.unlisten = sub.listen(func(ch Change) {
		if !ch.Progress {
			r.update()
		}
	})
	select {
	case <-sub.Ready():
		r.update()
	default: // no view yet: say so, so calls fail fast instead of hanging (the first snapshot's listener call updates)
		r.update()
	}
	return r, nil
}

type regResolver struct {
	cc       resolver.ClientConn
	sub      *Subscription
	service  string
	release  func()
	unlisten func()

	mu     sync.Mutex
	closed bool
}

// update pushes the current view to gRPC (see resolverState).
func (r *regResolver) update() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	_ = r.cc.UpdateState(resolverState(r.sub, r.service, r.cc))
}

// ResolveNow pushes the current view again and makes the subscription
// resync with a regnode (resuming from its revision).
func (r *regResolver) ResolveNow(resolver.ResolveNowOptions) {
	r.sub.resync()
	select {
	case <-r.sub.Ready():
		r.update()
	default:
	}
}

func (r *regResolver) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.unlisten()
	r.release()
}

// sharedLinger is how long a subscription with no resolver left is kept.
const sharedLinger = 30 * time.Second

type shared struct {
	sub   *Subscription
	refs  int
	timer *time.Timer
}

// acquire returns the Client's shared subscription of service, starting it
// if needed; release gives it back.
func (c *Client) acquire(service string) (*Subscription, func(), error) {
	c.sharedMu.Lock()
	defer c.sharedMu.Unlock()
	if c.closed {
		return nil, nil, errClientClosed
	}
	sh := c.shared[service]
	if sh == nil {
		sub, err := c.Subscribe(c.ctx, service, SubscribeOptions{})
		if err != nil {
			return nil, nil, err
		}
		sh = &shared{sub: sub}
		c.shared[service] = sh
	}
	if sh.timer != nil {
		sh.timer.Stop()
		sh.timer = nil
	}
	sh.refs++
	var once sync.Once
	return sh.sub, func() { once.Do(func() { c.releaseShared(service, sh) }) }, nil
}

func (c *Client) releaseShared(service string, sh *shared) {
	c.sharedMu.Lock()
	defer c.sharedMu.Unlock()
	sh.refs--
	if sh.refs > 0 || c.closed {
		return
	}
	sh.timer = time.AfterFunc(sharedLinger, func() {
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
