package xds

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// State of the world. A sotw ADS stream (what gRPC's xDS clients speak)
// is served here rather than by go-control-plane's server: that one opens
// a new cache watch for every request, ACKs included, through a
// goroutine and a channel hop per request, and copies each response per
// stream before sending it. With a gRPC client per stream ACKing every
// response, the ACK is the hot path, so here an ACK of the last response
// is one map update under the stream's lock, and a change wakes only the
// streams that follow a changed resource (table.go), whose goroutine then
// sends the resources encoded once for all of them.
//
// The protocol, as go-control-plane serves it (and the xDS spec says):
// per type, one response at a time: the next is sent only once the
// client answered the last (ACK or NACK, naming its nonce); while one is
// unanswered, a request naming another nonce is ignored; a request that knows no version of
// this Server is answered at once, even with nothing; a NACK keeps what
// was sent as sent (nothing is resent until it changes). The first
// request with no names of a listener or cluster subscription is a
// wildcard (every one there is), as is "*".

// adsServer serves ADS: state of the world here, incremental by go-control-plane.
type adsServer struct {
	discoverygrpc.AggregatedDiscoveryServiceServer // go-control-plane's, for delta
	s                                              *Server
}

// typeOrder is the order in which a stream's due responses go out:
// clusters before their assignments, listeners before their routes (the
// xDS spec's make-before-break order).
var typeOrder = []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType}

// sotwStream is one state-of-the-world stream.
type sotwStream struct {
	s    *Server
	id   int64
	wake chan struct{} // capacity 1: something may be due

	mu     sync.Mutex
	node   *corev3.Node
	subs   map[string]*sotwSub // by type URL
	order  []*sotwSub          // the same, in typeOrder
	nonce  int64               // of the last response
	closed bool                // the handler returned: nothing more is followed
}

// sotwSub is what one stream follows of one type; the stream's mu guards
// it.
type sotwSub struct {
	st       *sotwStream
	t        *table
	typeURL  string
	names    map[string]bool // followed, unless wildcard
	wildcard bool
	legacy   bool              // still a legacy wildcard: an empty list leaves it as it is
	joined   bool              // its table knows what it follows
	sent     map[string]string // what the client was sent: name → version
	seen     string            // the table's version when last answered: nothing new before it moves
	nonce    string            // of the last response ("" none)
	pending  bool              // that response is not answered yet
	force    bool              // answer even if nothing changed
	req      *discoverygrpc.DiscoveryRequest
}

// changed wakes the stream's sender; it never blocks.
func (st *sotwStream) changed() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// StreamAggregatedResources serves one state-of-the-world stream until
// it ends, fails, or the Server stops. Its receiving goroutine ends with
// the stream, which gRPC ends when this returns.
func (a *adsServer) StreamAggregatedResources(g grpc.BidiStreamingServer[discoverygrpc.DiscoveryRequest, discoverygrpc.DiscoveryResponse]) error {
	s := a.s
	ctx := g.Context()
	st := &sotwStream{s: s, id: s.sotwIDs.Add(1), wake: make(chan struct{}, 1), subs: map[string]*sotwSub{}}
	if err := s.cb.OnStreamOpen(ctx, st.id, resourcev3.AnyType); err != nil {
		return err
	}
	defer func() {
		st.mu.Lock()
		node := st.node
		st.closed = true // a request still being taken follows nothing
		for _, sub := range st.subs {
			if sub.joined {
				sub.t.follow(sub, sub.names, sub.wildcard, nil, false)
			}
		}
		st.mu.Unlock()
		s.cb.OnStreamClosed(st.id, node)
	}()
	// One channel wakes this loop for everything (a select over four,
	// one of them shared by every stream, cost more than the sends).
	stop1, stop2 := context.AfterFunc(ctx, st.changed), context.AfterFunc(s.ctx, st.changed)
	defer stop1()
	defer stop2()
	var (
		failed atomic.Bool
		err    error // the receiver's, once failed
	)
	go func() { // ends when the stream does (on this function's return at the latest)
		for {
			req, rerr := g.Recv()
			if rerr != nil { // the client is gone or went away: no error of ours
				break
			}
			if err = st.take(req); err != nil {
				break
			}
		}
		failed.Store(true) // publishes err
		st.changed()
	}()
	for {
		<-st.wake
		switch {
		case failed.Load():
			return err
		case ctx.Err() != nil, s.ctx.Err() != nil:
			return nil
		}
		for _, out := range st.due() {
			s.cb.OnStreamResponse(ctx, st.id, out.req, out.resp)
			if err := g.Send(out.resp); err != nil {
				return status.Error(codes.Unavailable, err.Error())
			}
		}
	}
}

// take applies one request to the stream's subscriptions.
func (st *sotwStream) take(req *discoverygrpc.DiscoveryRequest) error {
	typeURL := req.GetTypeUrl()
	if typeURL == "" {
		return status.Error(codes.InvalidArgument, "type URL is required for ADS")
	}
	st.mu.Lock()
	if req.GetNode() != nil {
		st.node = req.GetNode()
	} else {
		req.Node = st.node
	}
	st.mu.Unlock()
	// Cuts the names to the client's scope and tracks ACKs (server.go);
	// not under st.mu: the tracker takes its own lock.
	if err := st.s.cb.OnStreamRequest(st.id, req); err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil
	}
	sub := st.subs[typeURL]
	if sub == nil {
		t, err := st.s.table(typeURL, req.GetNode())
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		sub = &sotwSub{st: st, t: t, typeURL: typeURL, sent: map[string]string{},
			legacy: len(req.GetResourceNames()) == 0 && wildcardType(typeURL)}
		st.subs[typeURL] = sub
		st.order = append(st.order, sub)
		slices.SortFunc(st.order, func(a, b *sotwSub) int {
			return slices.Index(typeOrder, a.typeURL) - slices.Index(typeOrder, b.typeURL)
		})
	} else if sub.pending && req.GetResponseNonce() != sub.nonce {
		return nil // answers an older response: the client will answer the last
	}
	sub.req, sub.pending = req, false
	if v := req.GetVersionInfo(); v == "" || !strings.HasPrefix(v, st.s.prefix) {
		sub.force = true // it knows nothing of ours: answered even if empty
	}
	if sub.resubscribe(req.GetResourceNames()) || sub.force || sub.t.moved(sub.seen) {
		st.changed()
	}
	return nil
}

// resubscribe makes list what sub follows (a legacy wildcard stays one
// while the list is empty), as go-control-plane's Subscription does. An
// ACK names what it named before: that costs no allocation. It reports
// whether what sub follows changed.
func (sub *sotwSub) resubscribe(list []string) bool {
	if sub.joined && sub.same(list) {
		return false
	}
	names, wildcard := sub.names, true
	if !sub.legacy || len(list) > 0 {
		sub.legacy = false
		names, wildcard = make(map[string]bool, len(list)), false
		for _, n := range list {
			if n == "*" {
				wildcard = true
			} else {
				names[n] = true
			}
		}
	}
	if sub.joined && wildcard == sub.wildcard && maps.Equal(names, sub.names) {
		return false
	}
	if !wildcard {
		for n := range sub.sent {
			if !names[n] {
				delete(sub.sent, n)
			}
		}
	}
	sub.t.follow(sub, sub.names, sub.wildcard, names, wildcard)
	sub.names, sub.wildcard, sub.joined = names, wildcard, true
	return true
}

// same reports whether list names what sub follows.
func (sub *sotwSub) same(list []string) bool {
	if sub.legacy {
		return len(list) == 0
	}
	if sub.wildcard || len(list) != len(sub.names) {
		return false
	}
	for _, n := range list {
		if !sub.names[n] {
			return false
		}
	}
	return true
}

// response is one response due on a stream and the request it answers.
type response struct {
	req  *discoverygrpc.DiscoveryRequest
	resp *discoverygrpc.DiscoveryResponse
}

// due is every response the stream owes now, marked as sent.
func (st *sotwStream) due() []response {
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []response
	for _, sub := range st.order {
		if sub.pending {
			continue
		}
		res, version, ok := sub.t.answer(sub, sub.force)
		sub.seen = version
		if !ok {
			continue
		}
		st.nonce++
		sub.nonce = strconv.FormatInt(st.nonce, 10)
		sub.pending, sub.force = true, false
		out = append(out, response{req: sub.req, resp: &discoverygrpc.DiscoveryResponse{
			VersionInfo: version, Resources: res, TypeUrl: sub.typeURL, Nonce: sub.nonce}})
	}
	return out
}
