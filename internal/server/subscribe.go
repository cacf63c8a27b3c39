package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/fanout"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// The multiplexed subscription stream. One Subscribe stream carries every
// service a client follows: each service added is one fan-out subscription
// (Hub.Subscribe) served by its own goroutine, whose units go out tagged by
// service on the one stream, chunked exactly as Watch chunks them. A
// service's failure (a bad name, REVISION_AHEAD) ends that service with a
// SubscribeError and leaves the others, and the stream, running. The
// per-peer stream cap counts the stream once, whatever it carries.
//
// Every service on a stream is a live subscriber in this regnode's table
// (subscribers.go), with the revision the client last acknowledged: that,
// and the revision each Watch stream was sent, is what WaitApplied counts.

// follower is one service followed on one Subscribe stream: a live
// subscriber of that service on this regnode.
type follower struct {
	service string
	stream  *muxStream
	cancel  context.CancelFunc
	done    chan struct{}
	acked   int64 // under subscribers.mu
}

// muxStream is one Subscribe stream.
type muxStream struct {
	peer string // the client's address
	// name is how the client named itself (SubscribeRequest.subscriber),
	// under subscribers.mu.
	name string

	sendMu  sync.Mutex
	send    func(*registryv1.SubscribeResponse) error
	sendRaw func(EncodedParts) error // the parts of a SubscribeResponse, sent as they are

	asks *asker // AckRequests (ackask.go)
}

// MaxStreamServices bounds the services one Subscribe stream follows at
// once (each costs a fan-out subscription and a goroutine); an add past it
// ends that service with ResourceExhausted.
const MaxStreamServices = 10000

// Subscribe serves the multiplexed subscription stream: see the proto's
// SubscribeRequest and SubscribeResponse.
func (s *Server) Subscribe(stream registryv1.Registry_SubscribeServer) error {
	if s.cfg.Hub == nil {
		return status.Error(codes.Unimplemented, "this regnode serves no subscriptions")
	}
	ctx := stream.Context()
	release, err := s.openStream(ctx)
	if err != nil {
		return err
	}
	defer release()
	// Sent with the first message: this regnode asks for acks.
	if err := stream.SetHeader(ackHeader()); err != nil {
		return err
	}
	ms := &muxStream{peer: peerAddr(ctx), send: stream.Send,
		sendRaw: func(b EncodedParts) error { return stream.SendMsg(b) }}
	ms.asks = newAsker(ms, s.m.AckRequests.Inc)
	followers := map[string]*follower{}
	reported := map[string]time.Time{} // by service: when a report was last taken
	defer func() {
		for _, f := range followers {
			s.stopFollower(f)
		}
		ms.asks.stop()
	}()
	for {
		req, err := stream.Recv()
		var refused *ServiceRefused
		if errors.As(err, &refused) { // out of the token's scope: that service alone ends
			if f := followers[refused.Service]; f != nil {
				s.stopFollower(f)
				delete(followers, refused.Service)
			}
			if serr := ms.sendError(refused.Service, refused.Err); serr != nil {
				return serr
			}
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		if req.Subscriber != "" && req.Subscriber != ms.name {
			s.subs.rename(ms, req.Subscriber)
		}
		switch k := req.Kind.(type) {
		case *registryv1.SubscribeRequest_Add:
			add := k.Add
			if f := followers[add.Service]; f != nil {
				s.stopFollower(f)
				delete(followers, add.Service)
			}
			err := s.checkAdd(add)
			if err == nil && len(followers) >= MaxStreamServices {
				err = status.Errorf(codes.ResourceExhausted, "a Subscribe stream follows at most %d services", MaxStreamServices)
			}
			if err != nil {
				if serr := ms.sendError(add.Service, err); serr != nil {
					return serr
				}
				continue
			}
			followers[add.Service] = s.startFollower(ctx, ms, add)
		case *registryv1.SubscribeRequest_Remove:
			if f := followers[k.Remove.Service]; f != nil {
				s.stopFollower(f)
				delete(followers, k.Remove.Service)
			}
		case *registryv1.SubscribeRequest_Ack:
			s.m.Acks.Inc()
			if f := followers[k.Ack.Service]; f != nil {
				s.subs.ack(f, k.Ack.Revision)
			}
		case *registryv1.SubscribeRequest_Report:
			s.report(ctx, ms, k.Report, reported)
		default:
			// A kind this regnode does not know: ignored, so that clients
			// may grow the protocol.
		}
	}
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return "unknown"
}

func (s *Server) checkAdd(add *registryv1.SubscribeAdd) error {
	if add.Service != "" {
		if err := record.ValidService(add.Service); err != nil {
			return toStatus(err)
		}
	}
	if add.FromRevision < 0 {
		return invalid("add.from_revision", "%d is negative", add.FromRevision)
	}
	return nil
}

// startFollower subscribes to the hub for add and serves it on its own
// goroutine until stopFollower, the stream's end, or a failure (sent as
// the service's SubscribeError).
func (s *Server) startFollower(ctx context.Context, ms *muxStream, add *registryv1.SubscribeAdd) *follower {
	fctx, cancel := context.WithCancel(ctx)
	f := &follower{service: add.Service, stream: ms, cancel: cancel, done: make(chan struct{}), acked: add.FromRevision}
	s.subs.add(f)
	go func() {
		defer close(f.done)
		err := s.follow(fctx, f, add)
		s.subs.remove(f)
		if err != nil && fctx.Err() == nil {
			_ = ms.sendError(add.Service, err) // a broken stream ends the handler too
		}
	}()
	return f
}

func (s *Server) stopFollower(f *follower) {
	f.cancel()
	<-f.done
}

// follow serves one service of a stream: the hub's units, chunked.
func (s *Server) follow(ctx context.Context, f *follower, add *registryv1.SubscribeAdd) error {
	sub, err := s.cfg.Hub.Subscribe(ctx, add.Service, add.FromRevision, add.Epoch)
	if err != nil {
		return s.subscribeStatus(err, add.FromRevision, add.Epoch)
	}
	defer sub.Close()
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			if errors.Is(err, fanout.ErrClosed) {
				return status.Error(codes.Unavailable, "regnode is stopping; resume on another")
			}
			return toStatus(err)
		}
		if err := f.stream.sendUnit(add.Service, m); err != nil {
			return err
		}
	}
}

// subscribeStatus is the status of a failed Hub.Subscribe, as Watch
// answers it.
func (s *Server) subscribeStatus(err error, from int64, ep string) error {
	switch {
	case errors.Is(err, fanout.ErrBehind):
		return withReason(codes.OutOfRange, ReasonRevisionAhead, err.Error(), map[string]string{
			"from_revision": strconv.FormatInt(from, 10), "epoch": ep})
	case errors.Is(err, fanout.ErrClosed):
		return status.Error(codes.Unavailable, err.Error())
	}
	return toStatus(err)
}

// sendUnit sends the unit's chunks, encoded once by the hub for every
// subscriber (fanout.Unit.Chunks), each wrapped as the unit field of a
// SubscribeResponse by hand: the service's tag and the chunk's length
// prefix, this stream's own few bytes, go out before the chunk's shared
// bytes, which are neither decoded, encoded again nor copied
// (EncodedParts).
func (ms *muxStream) sendUnit(service string, u *fanout.Unit) error {
	chunks, err := u.Chunks()
	if err != nil {
		return status.Errorf(codes.Internal, "encode the unit at revision %d: %v", u.Revision(), err)
	}
	head := protowire.AppendString(protowire.AppendTag(nil, subscribeResponseService, protowire.BytesType), service)
	ms.sendMu.Lock()
	defer ms.sendMu.Unlock()
	for _, c := range chunks {
		b := make([]byte, 0, len(head)+protowire.SizeTag(subscribeResponseUnit)+protowire.SizeVarint(uint64(len(c))))
		b = append(b, head...)
		b = protowire.AppendVarint(protowire.AppendTag(b, subscribeResponseUnit, protowire.BytesType), uint64(len(c)))
		if err := ms.sendRaw(EncodedParts{b, c}); err != nil {
			return err
		}
	}
	return nil
}

// Field numbers of SubscribeResponse that sendUnit writes by hand; a test
// checks its output decodes as the message.
const (
	subscribeResponseService protowire.Number = 1
	subscribeResponseUnit    protowire.Number = 2
)

// sendError ends service on the stream with the status of err.
func (ms *muxStream) sendError(service string, err error) error {
	st := status.Convert(err)
	e := &registryv1.SubscribeError{Code: int32(st.Code()), Message: st.Message(), Reason: Reason(err)}
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetMetadata() map[string]string }); ok {
			e.Metadata = info.GetMetadata()
		}
	}
	ms.sendMu.Lock()
	defer ms.sendMu.Unlock()
	return ms.send(&registryv1.SubscribeResponse{Service: service, Error: e})
}

// XDSClients is what WaitApplied asks of this regnode's xDS server: how
// many xDS clients follow service's endpoints, which have not
// acknowledged rev (laggards: node id, address, revision acknowledged),
// and a channel closed when that may have changed.
type XDSClients interface {
	Pending(service string, rev int64) (clients int, laggards []*registryv1.Laggard, changed <-chan struct{})
}

// Peer is another regnode, as it announces itself (see Config.Peers).
type Peer struct {
	Name, Addr string
}

// MaxWaitApplied bounds WaitAppliedRequest.timeout.
const MaxWaitApplied = time.Hour

// WaitApplied waits until every live subscriber of the service has
// acknowledged the revision and every Watch stream of it has been sent it
// (see subscribers), on this regnode only (local) or on every regnode
// Config.Peers names, or until the timeout; the answer says, per regnode,
// how many have not and which.
func (s *Server) WaitApplied(ctx context.Context, req *registryv1.WaitAppliedRequest) (*registryv1.WaitAppliedResponse, error) {
	if err := record.ValidService(req.Service); err != nil {
		return nil, toStatus(err)
	}
	if req.Revision <= 0 {
		return nil, invalid("revision", "%d is not a revision", req.Revision)
	}
	var timeout time.Duration
	if req.Timeout != nil {
		if err := req.Timeout.CheckValid(); err != nil {
			return nil, invalid("timeout", "%v", err)
		}
		if timeout = req.Timeout.AsDuration(); timeout < 0 || timeout > MaxWaitApplied {
			return nil, invalid("timeout", "%s is outside 0s..%s", timeout, MaxWaitApplied)
		}
	}
	if s.cfg.Hub == nil {
		return nil, status.Error(codes.Unimplemented, "this regnode serves no subscriptions")
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if req.Local || s.cfg.Peers == nil {
		n := s.waitLocal(wctx, req.Service, req.Revision)
		return total([]*registryv1.NodeApplied{n}), ctx.Err()
	}
	peers, err := s.cfg.Peers(ctx)
	if err != nil {
		return nil, toStatus(fmt.Errorf("list the regnodes: %w", err))
	}
	nodes := make([]*registryv1.NodeApplied, len(peers)+1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); nodes[0] = s.waitLocal(wctx, req.Service, req.Revision) }()
	i := 1
	for _, p := range peers {
		if p.Addr == s.cfg.Addr {
			continue
		}
		wg.Add(1)
		go func(i int, p Peer) {
			defer wg.Done()
			nodes[i] = s.askPeer(ctx, p, req.Service, req.Revision, timeout)
		}(i, p)
		i++
	}
	wg.Wait()
	return total(nodes[:i]), nil
}

// waitLocal waits, until ctx ends, for this regnode's subscribers of
// service to acknowledge rev, its Watch streams of service to be sent it,
// and its xDS clients of service to acknowledge a version carrying it.
func (s *Server) waitLocal(ctx context.Context, service string, rev int64) *registryv1.NodeApplied {
	defer s.subs.wait(service, rev)()
	for {
		n, changed := s.subs.pending(service, rev)
		n.Node, n.Address = s.cfg.Node, s.cfg.Addr
		var xdsChanged <-chan struct{}
		if s.cfg.XDS != nil {
			var clients int
			clients, n.XdsLaggards, xdsChanged = s.cfg.XDS.Pending(service, rev)
			n.XdsClients, n.XdsPending = int64(clients), int64(len(n.XdsLaggards))
		}
		if n.Pending == 0 && n.WatchPending == 0 && n.XdsPending == 0 {
			return n
		}
		select {
		case <-changed:
		case <-xdsChanged:
		case <-ctx.Done():
			return n
		}
	}
}

// callPeer makes call on another regnode's API within timeout, with the
// caller's token if any: the peer checks it as this regnode did (a
// regnode holds no token of its own).
func (s *Server) callPeer(ctx context.Context, p Peer, timeout time.Duration, call func(context.Context, registryv1.RegistryClient) error) error {
	if s.cfg.DialPeer == nil {
		return errors.New("this regnode cannot call other regnodes")
	}
	cli, closer, err := s.cfg.DialPeer(p.Addr)
	if err != nil {
		return err
	}
	defer closer()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			cctx = metadata.AppendToOutgoingContext(cctx, "authorization", v[0])
		}
	}
	return call(cctx, cli)
}

// askPeer asks another regnode for its part, bounded by timeout plus the
// time a call takes.
func (s *Server) askPeer(ctx context.Context, p Peer, service string, rev int64, timeout time.Duration) *registryv1.NodeApplied {
	fail := func(err error) *registryv1.NodeApplied {
		return &registryv1.NodeApplied{Node: p.Name, Address: p.Addr, Error: err.Error()}
	}
	var resp *registryv1.WaitAppliedResponse
	err := s.callPeer(ctx, p, timeout+s.cfg.CallTimeout, func(ctx context.Context, cli registryv1.RegistryClient) (err error) {
		resp, err = cli.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: service, Revision: rev,
			Timeout: durationpb.New(timeout), Local: true})
		return err
	})
	if err != nil {
		return fail(err)
	}
	if len(resp.Nodes) != 1 {
		return fail(fmt.Errorf("answered for %d regnodes, not 1", len(resp.Nodes)))
	}
	n := resp.Nodes[0]
	if n.Node == "" {
		n.Node = p.Name
	}
	if n.Address == "" {
		n.Address = p.Addr
	}
	return n
}

// total sums the regnodes' parts; done only if every regnode answered and
// none has a subscriber or a Watch stream pending.
func total(nodes []*registryv1.NodeApplied) *registryv1.WaitAppliedResponse {
	r := &registryv1.WaitAppliedResponse{Done: true, Nodes: nodes}
	for _, n := range nodes {
		r.Subscribers += n.Subscribers
		r.Pending += n.Pending
		r.WatchStreams += n.WatchStreams
		r.WatchPending += n.WatchPending
		r.XdsClients += n.XdsClients
		r.XdsPending += n.XdsPending
		if n.Pending > 0 || n.WatchPending > 0 || n.XdsPending > 0 || n.Error != "" {
			r.Done = false
		}
	}
	return r
}
