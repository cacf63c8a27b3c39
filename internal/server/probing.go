package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/token"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// PeerHeader is the metadata key a regnode's own calls to another
// regnode (ConfirmProbe) carry the cluster's peer secret in: a regnode
// holds no token, and under --auth this is how a peer knows it.
const PeerHeader = "x-registry-peer"

// ConfirmProbe probes an instance at once from this regnode, from this
// regnode's own record of it (the caller names it, never an address): a
// regnode asks another before it evicts an instance.
func (s *Server) ConfirmProbe(ctx context.Context, req *registryv1.ConfirmProbeRequest) (*registryv1.ConfirmProbeResponse, error) {
	if err := record.ValidService(req.Service); err != nil {
		return nil, toStatus(&record.FieldError{Field: "service", Reason: err.Error()})
	}
	if err := record.ValidID(req.Id); err != nil {
		return nil, toStatus(&record.FieldError{Field: "id", Reason: err.Error()})
	}
	if s.cfg.Confirm == nil {
		return nil, status.Error(codes.Unimplemented, "this regnode does not probe")
	}
	return s.cfg.Confirm(ctx, req)
}

// probing is this regnode's Probing, and with peers every announced
// regnode's (asked with the caller's token, as WaitApplied asks).
func (s *Server) probing(ctx context.Context, peers bool) (*registryv1.Probing, []*registryv1.Probing) {
	if s.cfg.Probing == nil {
		return nil, nil
	}
	self := s.cfg.Probing()
	if !peers || s.cfg.Peers == nil {
		return self, nil
	}
	list, err := s.cfg.Peers(ctx)
	if err != nil {
		return self, nil
	}
	out := make([]*registryv1.Probing, len(list))
	var wg sync.WaitGroup
	for i, p := range list {
		if p.Addr == s.cfg.Addr {
			out[i] = self
			continue
		}
		wg.Go(func() { out[i] = s.askProbing(ctx, p) })
	}
	wg.Wait()
	return self, out
}

func (s *Server) askProbing(ctx context.Context, p Peer) *registryv1.Probing {
	var resp *registryv1.StatusResponse
	err := s.callPeer(ctx, p, s.cfg.CallTimeout, func(ctx context.Context, cli registryv1.RegistryClient) (err error) {
		resp, err = cli.Status(ctx, &registryv1.StatusRequest{})
		return err
	})
	if err == nil && resp.Probing == nil {
		err = errors.New("it reports no probing (an older regnode?)")
	}
	if err != nil {
		return &registryv1.Probing{Node: p.Name, Address: p.Addr, Error: err.Error()}
	}
	return resp.Probing
}

// AllowPeers lets a call of ConfirmProbe or ForwardReports that carries
// secret in PeerHeader through without a token: another regnode's.
func (a *Auth) AllowPeers(secret string) {
	a.peerMu.Lock()
	a.peerSecret = secret
	a.peerMu.Unlock()
}

// FromPeer reports whether ctx carries the peer secret secret.
func FromPeer(ctx context.Context, secret string) bool {
	if secret == "" {
		return false
	}
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(PeerHeader)
	return len(v) == 1 && subtle.ConstantTimeCompare([]byte(v[0]), []byte(secret)) == 1
}

// fromPeer reports whether ctx carries the peer secret.
func (a *Auth) fromPeer(ctx context.Context) bool {
	a.peerMu.Lock()
	secret := a.peerSecret
	a.peerMu.Unlock()
	return FromPeer(ctx, secret)
}

// Callers' reports (health at scale): limits of one Subscribe stream.
const (
	// MaxReportInstances bounds the instances of one SubscribeReport.
	MaxReportInstances = 1024
	// reportEvery is the least time between two reports of one service
	// taken from one stream; more are dropped.
	reportEvery = time.Second
)

// report takes one SubscribeReport of the stream ms: checked, rate
// limited per service, and handed to Config.Report under the reporter's
// name (the token's, or the subscriber's, with the peer's host: a
// regnode counts distinct reporters). A bad or too frequent report is
// dropped and counted, never ends the stream.
func (s *Server) report(ctx context.Context, ms *muxStream, r *registryv1.SubscribeReport, last map[string]time.Time) {
	count := func(result string) { s.m.Reports.WithLabelValues(result).Inc() }
	if s.cfg.Report == nil {
		count("unused")
		return
	}
	if record.ValidService(r.Service) != nil || len(r.Instances) > MaxReportInstances {
		count("invalid")
		return
	}
	for _, c := range r.Instances {
		if record.ValidID(c.Id) != nil {
			count("invalid")
			return
		}
	}
	now := time.Now()
	if at, ok := last[r.Service]; ok && now.Sub(at) < reportEvery {
		count("limited")
		return
	}
	if len(last) >= MaxStreamServices {
		clear(last) // bounded: a stream follows at most that many anyway
	}
	last[r.Service] = now
	count("accepted")
	s.cfg.Report(ctx, reporterName(ctx, ms), r)
}

// reporterName names who reports on a stream.
func reporterName(ctx context.Context, ms *muxStream) string {
	host := ms.peer
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	name := ms.name
	if name == "" {
		name = "anonymous"
	}
	if r, ok := token.FromContext(ctx); ok {
		return "token " + r.Name + " " + name + "@" + host
	}
	return name + "@" + host
}

// ForwardReports takes callers' reports another regnode forwards to this
// one, the owner of their instances: only a regnode may (the peer
// secret, whatever --auth says).
func (s *Server) ForwardReports(ctx context.Context, req *registryv1.ForwardReportsRequest) (*registryv1.ForwardReportsResponse, error) {
	if s.cfg.Forwarded == nil {
		return nil, status.Error(codes.Unimplemented, "this regnode takes no reports")
	}
	if len(req.Reports) > MaxReportInstances {
		return nil, status.Errorf(codes.InvalidArgument, "reports: at most %d per call, got %d", MaxReportInstances, len(req.Reports))
	}
	if err := s.cfg.Forwarded(ctx, req); err != nil {
		return nil, err
	}
	return &registryv1.ForwardReportsResponse{}, nil
}
