package client

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
)

// revConn is the resolver's grpc side in this test: it keeps the
// revision of every state pushed.
type revConn struct {
	resolver.ClientConn
	mu   sync.Mutex
	revs []int64
}

func (c *revConn) UpdateState(s resolver.State) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.revs = append(c.revs, StateRevision(s))
	return nil
}

// ParseServiceConfig refuses the service config, as a ClientConn with
// service configs disabled would: the resolver pushes the state without it.
func (c *revConn) ParseServiceConfig(string) *serviceconfig.ParseResult {
	return &serviceconfig.ParseResult{Err: errors.New("revConn parses no service config")}
}

func (c *revConn) pushed(rev int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.revs) > 0 && c.revs[len(c.revs)-1] == rev
}

// A burst of ResolveNow calls while the subscription is unhealthy (its
// link silent, its stream given up) resyncs it once, not once per call:
// the limiter allows one resync per resolveNowEvery.
func TestResolveNowResyncsAnUnhealthySubscriptionOnce(t *testing.T) {
	rn := regnodetest.Start(t)
	px := etcdtest.NewProxy(t, rn.Addr)
	c, err := New(Config{Endpoints: []string{px.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fc := &revConn{}
	res, err := c.ResolverBuilder().Build(resolver.Target{URL: url.URL{Scheme: Scheme, Path: "/orders"}}, fc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	r := res.(*regResolver)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	px.Pause()
	defer px.Resume()
	for !r.sub.unhealthy(time.Now()) || r.sub.Stats().Reconnects == 0 {
		if ctx.Err() != nil {
			t.Fatal("the subscription never gave up on its silent stream")
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := r.sub.Stats()
	for range 1000 {
		r.ResolveNow(resolver.ResolveNowOptions{})
	}
	// Once the resolver's goroutine has taken the last ResolveNow and then
	// pushed a view offered after it, it has acted on every call.
	for len(r.now) > 0 {
		time.Sleep(time.Millisecond)
	}
	const marker int64 = 1 << 40
	r.offer(view{known: true, epoch: 1 << 20, rev: marker, state: resolver.State{Attributes: attributes.New(AttrRevision, marker)}})
	for !fc.pushed(marker) {
		if ctx.Err() != nil {
			t.Fatal("the resolver's goroutine never pushed the marker view")
		}
		time.Sleep(time.Millisecond)
	}
	if got := r.sub.Stats().Resyncs - before.Resyncs; got != 1 {
		t.Fatalf("1000 ResolveNow calls on an unhealthy subscription resynced it %d times, want 1", got)
	}
	// The resync ended the stream stuck on the silent link.
	for r.sub.Stats().Reconnects == before.Reconnects {
		if ctx.Err() != nil {
			t.Fatal("the resync did not end the stream")
		}
		time.Sleep(time.Millisecond)
	}
}
