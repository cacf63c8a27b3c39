package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/lastresort"
)

// Calls through the registry, and how the checker can judge them without
// clocks.
//
// A caller is a grpc ClientConn on registry:///orders with the SDK's own
// balancer (package balance, the policy the resolver's service config
// names), without the retry interceptor, so each call is one attempt.
// Its resolver's every UpdateState goes through a wrapper that notes the
// state's revision (client.StateRevision) twice: as pushing before handing
// it to grpc, and as pushed once grpc has taken it. grpc applies a
// resolver state to the balancer's picker before UpdateState returns
// (endpointsharding, under balance's policy, rebuilds the picker
// synchronously), so at any moment
// the picker reflects a view no older than pushed and no newer than
// pushing. A call reads pushed before it starts and pushing after it
// returns: whatever picker chose its backend was built from a view at some
// revision in [Before, After]. Backends record the calls they serve (the
// call's id travels in its metadata). The checker then needs only etcd's
// history: a call served by address A is a violation if no instance with
// address A was callable (SERVING; see callable) at any revision in
// [Before, After], because every picker in that window had A out of
// rotation (drained, starting or deleted) and still a call reached it.

// callIDKey is the metadata key carrying a call's id to the backend.
const callIDKey = "x-workload-call"

// Call is one call a caller made.
type Call struct {
	ID string
	// Before and After bound the revision of the view the call was
	// routed by (see above).
	Before, After int64
	Err           error
}

// Served is one call a backend answered.
type Served struct {
	ID   string
	Addr string // the backend's address: the instance's registered address
}

// callLog collects what callers and backends record.
type callLog struct {
	mu     sync.Mutex
	calls  []Call
	served []Served
}

func (l *callLog) call(c Call) {
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

func (l *callLog) serve(s Served) {
	l.mu.Lock()
	l.served = append(l.served, s)
	l.mu.Unlock()
}

// interceptor records every call a backend at addr serves.
func (l *callLog) interceptor(addr string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if ids := md.Get(callIDKey); len(ids) == 1 {
				l.serve(Served{ID: ids[0], Addr: addr})
			}
		}
		return h(ctx, req)
	}
}

// revisionNoter wraps the registry's resolver builder to note the revision
// of every state it pushes.
type revisionNoter struct {
	resolver.Builder
	pushing, pushed *atomic.Int64
}

func (n revisionNoter) Build(t resolver.Target, cc resolver.ClientConn, o resolver.BuildOptions) (resolver.Resolver, error) {
	return n.Builder.Build(t, &notingConn{ClientConn: cc, n: n}, o)
}

type notingConn struct {
	resolver.ClientConn
	n revisionNoter
}

func (c *notingConn) UpdateState(s resolver.State) error {
	rev := client.StateRevision(s)
	c.n.pushing.Store(rev)
	err := c.ClientConn.UpdateState(s)
	c.n.pushed.Store(rev)
	return err
}

// caller calls grpc.health.v1.Check on the instances of "orders" through
// the registry until ctx ends, one call at a time, and logs each.
func (w *Workload) caller(ctx context.Context, name string) {
	// The checker judges every call by the views the caller could route
	// by; a last resort (package lastresort: instances that vanished by
	// lease expiry, kept out of the views) is shown by its own tests.
	c, err := client.New(client.Config{Endpoints: w.endpoints, LastResort: lastresort.Config{Off: true}})
	if err != nil {
		w.t.Errorf("caller %s: %v", name, err)
		return
	}
	defer c.Close()
	var pushing, pushed atomic.Int64
	cc, err := grpc.NewClient("registry:///orders",
		grpc.WithResolvers(revisionNoter{Builder: c.ResolverBuilder(), pushing: &pushing, pushed: &pushed}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		w.t.Errorf("caller %s: %v", name, err)
		return
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for seq := 0; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		id := fmt.Sprintf("%s-%d", name, seq)
		cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, callIDKey, id), time.Second)
		before := pushed.Load()
		_, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		after := pushing.Load()
		cancel()
		w.calls.call(Call{ID: id, Before: before, After: after, Err: err})
	}
}

// Calls returns what the callers made and what the backends served.
func (w *Workload) Calls() ([]Call, []Served) {
	w.calls.mu.Lock()
	defer w.calls.mu.Unlock()
	return append([]Call(nil), w.calls.calls...), append([]Served(nil), w.calls.served...)
}
