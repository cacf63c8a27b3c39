package main

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

// A picker tap stands between a grpc.ClientConn and a real balancer policy
// and keeps the last picker the balancer handed the channel, so that the
// pick scenario can drive the very picker grpc would call, built by the
// real balancer over real, connected subconns. It changes nothing: every
// call goes through to the ClientConn or the balancer as it is.
//
// A tapped policy is named tapPrefix + the inner policy's name in a
// service config; the channel's tap is found by that policy and the
// channel's target.
const tapPrefix = "regbench_tap_"

func init() {
	for _, name := range []string{balance.Name, roundrobin.Name} {
		balancer.Register(tapBuilder{inner: balancer.Get(name)})
	}
}

var (
	tapsMu sync.Mutex
	taps   = map[string]*pickerTap{}
)

func tapKey(policy, target string) string { return policy + " " + target }

// tapOf returns the tap of the channel on target (as grpc.NewClient got
// it) whose policy is policy (untapped name), if it was built.
func tapOf(policy, target string) *pickerTap {
	tapsMu.Lock()
	defer tapsMu.Unlock()
	return taps[tapKey(policy, target)]
}

// tapServiceConfig is a service config that selects the tapped policy with
// the inner policy's JSON config.
func tapServiceConfig(policy, config string) string {
	return fmt.Sprintf(`{"loadBalancingConfig":[{"%s%s":%s}]}`, tapPrefix, policy, config)
}

type tapBuilder struct{ inner balancer.Builder }

func (b tapBuilder) Name() string { return tapPrefix + b.inner.Name() }

func (b tapBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	t := &pickerTap{ClientConn: cc, key: tapKey(b.inner.Name(), opts.Target.String())}
	t.Balancer = b.inner.Build(t, opts)
	tapsMu.Lock()
	taps[t.key] = t
	tapsMu.Unlock()
	return t
}

// ParseConfig hands the JSON to the inner policy's parser, if it has one
// (round_robin has none, and grpc then passes no config).
func (b tapBuilder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	if p, ok := b.inner.(balancer.ConfigParser); ok {
		return p.ParseConfig(js)
	}
	return nil, nil
}

// pickerTap is both the balancer the channel sees (the inner one, with
// Close unregistering the tap) and the ClientConn the inner balancer sees
// (the channel's, with UpdateState recorded).
type pickerTap struct {
	balancer.ClientConn
	balancer.Balancer
	key string

	mu     sync.Mutex
	state  connectivity.State
	picker balancer.Picker
}

func (t *pickerTap) UpdateState(s balancer.State) {
	t.mu.Lock()
	t.state, t.picker = s.ConnectivityState, s.Picker
	t.mu.Unlock()
	t.ClientConn.UpdateState(s)
}

// ready returns the last picker if the channel is READY with it.
func (t *pickerTap) ready() (balancer.Picker, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.picker, t.state == connectivity.Ready && t.picker != nil
}

func (t *pickerTap) Close() {
	tapsMu.Lock()
	if taps[t.key] == t {
		delete(taps, t.key)
	}
	tapsMu.Unlock()
	t.Balancer.Close()
}
