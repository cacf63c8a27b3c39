// Package pickertap stands between a grpc.ClientConn and a real balancer
// policy and keeps the last picker the balancer handed the channel, so
// that a benchmark can drive the very picker grpc would call, built by
// the real balancer over real, connected subconns. It changes nothing:
// every call goes through to the ClientConn or the balancer as it is.
//
// Importing it registers the tapped policies of package balance's policy
// and of grpc-go's round_robin, named Prefix + the inner policy's name.
// A channel's tap is found by its inner policy and its target.
package pickertap

import (
	"encoding/json"
	"fmt"
	"sync"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/roundrobin"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/serviceconfig"

	"github.com/regcluster/registry/balance"
)

// Prefix is what a tapped policy's name starts with.
const Prefix = "pickertap_"

func init() {
	for _, name := range []string{balance.Name, roundrobin.Name} {
		balancer.Register(builder{inner: balancer.Get(name)})
	}
}

var (
	tapsMu sync.Mutex
	taps   = map[string]*Tap{}
)

func key(policy, target string) string { return policy + " " + target }

// Of returns the tap of the channel on target (as grpc.NewClient got it)
// whose policy is policy (the inner, untapped name), nil if none was built
// yet or it closed.
func Of(policy, target string) *Tap {
	tapsMu.Lock()
	defer tapsMu.Unlock()
	return taps[key(policy, target)]
}

// ServiceConfig is a service config that selects the tapped policy with
// the inner policy's JSON config.
func ServiceConfig(policy, config string) string {
	return fmt.Sprintf(`{"loadBalancingConfig":[{"%s%s":%s}]}`, Prefix, policy, config)
}

type builder struct{ inner balancer.Builder }

func (b builder) Name() string { return Prefix + b.inner.Name() }

func (b builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	t := &Tap{ClientConn: cc, key: key(b.inner.Name(), opts.Target.String())}
	t.Balancer = b.inner.Build(t, opts)
	tapsMu.Lock()
	taps[t.key] = t
	tapsMu.Unlock()
	return t
}

// ParseConfig hands the JSON to the inner policy's parser, if it has one
// (round_robin has none, and grpc then passes no config).
func (b builder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	if p, ok := b.inner.(balancer.ConfigParser); ok {
		return p.ParseConfig(js)
	}
	return nil, nil
}

// Tap is both the balancer the channel sees (the inner one, with Close
// unregistering the tap) and the ClientConn the inner balancer sees (the
// channel's, with UpdateState recorded).
type Tap struct {
	balancer.ClientConn
	balancer.Balancer
	key string

	mu     sync.Mutex
	state  connectivity.State
	picker balancer.Picker
}

// UpdateState records s and passes it on to the channel.
func (t *Tap) UpdateState(s balancer.State) {
	t.mu.Lock()
	t.state, t.picker = s.ConnectivityState, s.Picker
	t.mu.Unlock()
	t.ClientConn.UpdateState(s)
}

// Ready returns the last picker, and whether the channel is READY with it.
func (t *Tap) Ready() (balancer.Picker, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.picker, t.state == connectivity.Ready && t.picker != nil
}

// Close unregisters the tap and closes the inner balancer.
func (t *Tap) Close() {
	tapsMu.Lock()
	if taps[t.key] == t {
		delete(taps, t.key)
	}
	tapsMu.Unlock()
	t.Balancer.Close()
}
